// matmul.wgsl: out = epilogue(op(prologue(A)) · op(B), extras…), op(X) = X or Xᵀ, batched over
// leading dims (serves matmul and fused_matmul). The generator is codegen/matmul.py; its module
// docstring describes the tiling.
//
// Shapes: op(A) is [M, K] (A stored [M, K], or [K, M] when transposed), op(B) is [K, N]
// (B stored [K, N], or [N, K] when transposed); out is [M, N], all row-major f32. With batch
// dims, A, B and out hold BATCH such matrices back to back; a 2-D A or B is shared by all of them.
// Bindings (group 0, generated from the KernelSpec): a (read), b (read), the prologue's and
// epilogue's extra inputs that are buffers (x0, x1, …, read; scalar constants are inlined), out
// (read_write). a, b and out are arrays of vec4 where the generator loads or stores them as such.
// Grid: (ceil(N / BN), y, z) workgroups of (TX, TY) threads, where the SPLITS · TILES (row tile,
// batch, part of K) triples, TILES = BATCH · ceil(M / BM), are numbered t = y + z · GRID_Y
// (folded into z only when y would exceed the per-dimension limit); workgroups past them return
// at once. Split-K (SPLITS > 1): part s = t / TILES reduces K over [s · K_PART, min(K, (s + 1) ·
// K_PART)) into matrix s of the partials out [SPLITS, BATCH, M, N] (no epilogue).
//
// Placeholders: BINDINGS, M, N, K, BM, BN, BK, TX, TY, TILES_M, TILES, GRID_Y, SPLITS, K_PART; A_BATCH_STRIDE /
// B_BATCH_STRIDE (elements between an operand's matrices; 0u for a 2-D operand shared by the
// batch); A_INDEX / B_INDEX (index of element (m or n, k) within one stored matrix, for the
// scalar loads); FUNCTIONS (helpers the prologue and epilogue call), A_READS / PROLOGUE (the
// prologue's extra loads and f32 expression of `x`, the stored A element), READS / EPILOGUE (the
// same for the epilogue, `x` the dot product), STORE4 (the function storing 4 columns); the
// generated blocks of the K loop (gemm_loop.wgsl) REGISTERS (staging registers), ACCUMULATORS,
// LOAD_FIRST / LOAD / LOAD_NEXT (global loads of the K tile at kbegin, k0, k0 + BK into the
// registers), STAGE (registers → workgroup tiles), MULTIPLY (the unrolled K tile), STORE. Flag:
// PREFETCH (load the next tile while multiplying this one), A_SCALAR / B_SCALAR (the operand is
// loaded by element), CAUSAL with CAUSAL_ROWS (a causal product: a row tile stops its K loop after
// its last nonzero column of op(A), gemm_tile.wgsl).

{{BINDINGS}}

//#include matmul_common

var<workgroup> tile_a: array<vec4<f32>, BK * BM / 4u>;  // [k][m / 4]
var<workgroup> tile_b: array<vec4<f32>, BK * BN / 4u>;  // [k][n / 4]

@compute @workgroup_size({{TX}}, {{TY}}, 1)
fn matmul(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_id) local: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
//#include gemm_tile
    let tx = local.x;
    let ty = local.y;
//#include gemm_loop
}
