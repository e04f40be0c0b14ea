// matmul.wgsl: out = epilogue(op(prologue(A)) · op(B), extras…), op(X) = X or Xᵀ, batched over
// leading dims (serves matmul and fused_matmul).
//
// Shapes: op(A) is [M, K] (A stored [M, K], or [K, M] when transposed), op(B) is [K, N]
// (B stored [K, N], or [N, K] when transposed); out is [M, N], all row-major f32. With batch
// dims, A, B and out hold BATCH such matrices back to back; a 2-D A or B is shared by all of them.
// Bindings (group 0, generated from the KernelSpec): a (read), b (read), the prologue's and
// epilogue's extra inputs that are buffers (x0, x1, …, read; scalar constants are inlined), out
// (read_write).
// Grid: (ceil(N / BN), y, z) workgroups of (WG_X, WG_Y) threads, where the TILES = BATCH ·
// ceil(M / BM) (row tile, batch) pairs are numbered t = y + z · GRID_Y (folded into z only
// when y would exceed the per-dimension limit); workgroups past TILES return at once.
//
// Each workgroup computes a BM × BN tile of out, walking K in steps of BK: both operand
// tiles are staged in workgroup memory (zero-padded past the matrix edges, so sizes need not
// divide the tile; A's elements go through the prologue on the way, so a normalised or scaled
// A is never written to memory), then every thread accumulates TM rows × NV vec4 columns in
// registers. A thread's rows are WG_Y apart and its vec4 columns WG_X apart, so neighbouring
// threads read neighbouring workgroup words (no bank conflicts) and store neighbouring vec4s of
// out.
// The accumulators are separate named variables and the inner product is unrolled by the
// generator (ACCUMULATORS, MULTIPLY, STORE): a dynamically indexed private array would
// leave registers for local memory on some drivers.
//
// Placeholders: BINDINGS, M, N, K, TILES_M, TILES, GRID_Y, WG_X, WG_Y, TM, NV, BK;
// A_BATCH_STRIDE / B_BATCH_STRIDE (elements between an operand's matrices; 0u for a 2-D operand
// shared by the whole batch); A_INDEX
// (index of op(A)[m, k] within one matrix), B_INDEX (of op(B)[k, n]); A_STAGE / B_STAGE
// (which tile coordinate varies fastest while staging, chosen so consecutive threads read
// consecutive addresses); FUNCTIONS (helpers the prologue and epilogue call), A_READS (`let`
// statements loading the prologue's extras at `bat` and A's stored coordinates), PROLOGUE (an
// f32 expression of `x`, the stored A element, and the A_READS; `x` when there is none), READS
// (`let` statements loading the epilogue's extras at `bat`, `row`, `col`), EPILOGUE (an f32
// expression of `x`, the dot product, and the READS); ACCUMULATORS, MULTIPLY, STORE.

{{BINDINGS}}

const M: u32 = {{M}}u;
const N: u32 = {{N}}u;
const K: u32 = {{K}}u;
const TILES_M: u32 = {{TILES_M}}u;
const TILES: u32 = {{TILES}}u;
const GRID_Y: u32 = {{GRID_Y}}u;
//#include gemm_tiles

{{FUNCTIONS}}

// op(A)[m, k] of batch `bat` through the prologue; 0 outside the matrix (padding, not prologue(0)).
fn load_a(base: u32, bat: u32, m: u32, k: u32) -> f32 {
    if (m < M && k < K) {
        return prologue(a[base + {{A_INDEX}}], bat, m, k);
    }
    return 0.0;
}

fn prologue(x: f32, bat: u32, m: u32, k: u32) -> f32 {
    {{A_READS}}
    return {{PROLOGUE}};
}

fn load_b(base: u32, k: u32, n: u32) -> f32 {
    if (k < K && n < N) {
        return b[base + {{B_INDEX}}];
    }
    return 0.0;
}

fn epilogue(x: f32, bat: u32, row: u32, col: u32) -> f32 {
    {{READS}}
    return {{EPILOGUE}};
}

// Store one accumulator: out[bat, row, col .. col + 3], inside the matrix.
fn store4(bat: u32, row: u32, col: u32, v: vec4<f32>) {
    if (row >= M) {
        return;
    }
    for (var c = 0u; c < 4u; c++) {
        if (col + c < N) {
            out[(bat * M + row) * N + col + c] = epilogue(v[c], bat, row, col + c);
        }
    }
}

@compute @workgroup_size(WG_X, WG_Y, 1)
fn matmul(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_id) local: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let t = wid.y + wid.z * GRID_Y;
    if (t >= TILES) {
        return;  // uniform: the whole workgroup leaves
    }
    let tile_m = t % TILES_M;
    let bat = t / TILES_M;
    let a_base = bat * {{A_BATCH_STRIDE}};
    let b_base = bat * {{B_BATCH_STRIDE}};
    let row0 = tile_m * BM + local.y;  // this thread's first row; the others are WG_Y apart
    let col0 = wid.x * BN + 4u * local.x;  // its first column; the other vec4s are 4·WG_X apart
    {{ACCUMULATORS}}

    for (var k0 = 0u; k0 < K; k0 += BK) {
        for (var s = lid; s < BM * BK; s += THREADS) {
            {{A_STAGE}}
            tile_a[k * BM + m] = load_a(a_base, bat, tile_m * BM + m, k0 + k);
        }
        for (var s = lid; s < BK * BN; s += THREADS) {
            {{B_STAGE}}
            tile_b[k * BN4 + n / 4u][n % 4u] = load_b(b_base, k0 + k, wid.x * BN + n);
        }
        workgroupBarrier();
        for (var k = 0u; k < BK; k++) {
            let a_row = k * BM + local.y;
            let b_row = k * BN4 + local.x;
            {{MULTIPLY}}
        }
        workgroupBarrier();
    }
    {{STORE}}
}
