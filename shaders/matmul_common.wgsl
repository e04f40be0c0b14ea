// matmul_common.wgsl: a snippet, not a kernel. Included (`//#include matmul_common`) by the
// kernels of matmul and fused_matmul (matmul.wgsl, f32; matmul_halves.wgsl, the tensor cores):
// the product's sizes, the end of this workgroup's part of K, the prologue and epilogue, the
// scalar loads and `store4`. Placeholders and flags: those of matmul.wgsl's header that these
// lines name (M, N, K, BM, BN, BK, TILES_M, TILES, GRID_Y, SPLITS, K_PART, FUNCTIONS, A_READS,
// PROLOGUE, READS, EPILOGUE, A_BATCH_STRIDE, A_INDEX, B_BATCH_STRIDE, B_INDEX, STORE4; A_SCALAR,
// B_SCALAR).
//#include gemm_sizes
const GRID_Y: u32 = {{GRID_Y}}u;
const SPLITS: u32 = {{SPLITS}}u;
const K_PART: u32 = {{K_PART}}u;

// The end of this workgroup's part of K (K unless the product is split): loads stop there.
var<private> kend: u32;

{{FUNCTIONS}}

fn prologue(x: f32, bat: u32, m: u32, k: u32) -> f32 {
    {{A_READS}}
    return {{PROLOGUE}};
}

fn epilogue(x: f32, bat: u32, row: u32, col: u32) -> f32 {
    {{READS}}
    return {{EPILOGUE}};
}

// Scalar loads (where an operand's contiguous length is not a multiple of 4): op(A)[m, k] through
// the prologue and op(B)[k, n], 0 outside the matrix (padding, not prologue(0)).
//#if A_SCALAR
fn load_a(bat: u32, m: u32, k: u32) -> f32 {
    if (m < M && k < kend) {
        return prologue(a[bat * {{A_BATCH_STRIDE}} + {{A_INDEX}}], bat, m, k);
    }
    return 0.0;
}
//#endif
//#if B_SCALAR
fn load_b(bat: u32, n: u32, k: u32) -> f32 {
    if (k < kend && n < N) {
        return b[bat * {{B_BATCH_STRIDE}} + {{B_INDEX}}];
    }
    return 0.0;
}
//#endif

{{STORE4}}
