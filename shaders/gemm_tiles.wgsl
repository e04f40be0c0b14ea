// gemm_tiles.wgsl: a snippet, not a kernel. Included (`//#include gemm_tiles`) by the tiled GEMM
// kernels (matmul.wgsl, conv_gemm.wgsl): the tiling constants and the staged operand tiles.
//
// A workgroup of WG_X × WG_Y threads computes a BM × BN tile of the product, walking the
// reduction in steps of BK; every thread accumulates TM rows × NV vec4 columns in registers.
// Placeholders: WG_X, WG_Y, TM, NV, BK.

const WG_X: u32 = {{WG_X}}u;
const WG_Y: u32 = {{WG_Y}}u;
const TM: u32 = {{TM}}u;
const NV: u32 = {{NV}}u;
const BK: u32 = {{BK}}u;
const BM: u32 = WG_Y * TM;
const BN4: u32 = WG_X * NV;
const BN: u32 = BN4 * 4u;
const THREADS: u32 = WG_X * WG_Y;

var<workgroup> tile_a: array<f32, BK * BM>;         // [k][m]
var<workgroup> tile_b: array<vec4<f32>, BK * BN4>;  // [k][n / 4], component n % 4
