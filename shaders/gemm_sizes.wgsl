// gemm_sizes.wgsl: a snippet, not a kernel. The sizes every GEMM kernel declares (matmul_common.wgsl,
// conv_gemm.wgsl): the product M × K × N, its tile BM × BN × BK, and TILES_M row tiles of TILES
// (row tile, batch) pairs. Placeholders: M, N, K, BM, BN, BK, TILES_M, TILES.
const M: u32 = {{M}}u;
const N: u32 = {{N}}u;
const K: u32 = {{K}}u;
const BM: u32 = {{BM}}u;
const BN: u32 = {{BN}}u;
const BK: u32 = {{BK}}u;
const TILES_M: u32 = {{TILES_M}}u;
const TILES: u32 = {{TILES}}u;
