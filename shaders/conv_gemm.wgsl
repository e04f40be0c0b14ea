// conv_gemm.wgsl: implicit-GEMM convolution, out = epilogue(A · B, extras…), where the im2col
// operand is gathered from the image while its tile is loaded: no column buffer is written.
//
// One GEMM per dispatch, [M, K] · [K, N] → [M, N], every image folded into the rows, columns or
// reduction (so small late-stage images still fill whole tiles). Per mode (see conv_ops.py):
// - FORWARD:     rows o, columns (n, ho, wo), reduction (c, i, j); a = weight [O, C·KH·KW],
//                b = x [NIMG, C, H, W] gathered; out [NIMG, O, HO, WO].
// - GRAD_INPUT:  rows c, columns (n, y, x), reduction (o, i, j); a = weight read permuted,
//                b = g [NIMG, O, HO·WO] gathered at the output positions whose windows cover
//                (y, x); out [NIMG, C, H, W]. Split by stride phase (y mod SH, x mod SW): only
//                the taps i ≡ y + PH (mod SH), j ≡ x + PW (mod SW) reach a pixel, so each phase
//                is its own GEMM over those ti·tj taps (ti = ⌈(KH − i0)/SH⌉ for the phase's first
//                tap i0, so the phases share the KH·KW taps out) and the pixels of that phase
//                (HP·WP per image, the last row/column of a phase possibly past the image: skipped).
// - GRAD_WEIGHT: rows o, columns (c, i, j), reduction (n, ho, wo); a = g [NIMG, O, HO·WO],
//                b = x gathered; out [O, C·KH·KW]. With GROUPS > 1 (split-K), one GEMM per part
//                of the reduction: part s covers (n, ho, wo) flattened in [s·K, (s+1)·K) ∩
//                [0, K_TOTAL) (K_TOTAL = NIMG·HO·WO; the last part may be shorter) and writes
//                out[s, O, C·KH·KW].
// Bindings (group 0, generated from the KernelSpec): a (read), b (read), the epilogue's extras
// that are buffers (x0, x1, …, read; scalar constants are inlined), out (read_write).
// Grid: TILES = GROUPS · TILES_M · TILES_N workgroups of (WG_X, WG_Y) threads (GROUPS: the parts
// of grad_weight, the stride phases of grad_input, else 1), tile t = x + y · GRID_X (y only when x
// would exceed the per-dimension limit); workgroups past TILES return.
//
// The tiling is matmul.wgsl's: each workgroup computes a BM × BN tile, walking K in steps of BK
// with both operand tiles staged in workgroup memory (zero past the matrix edges, and zero where
// the gathered element falls in the padding or between strided positions), then every thread
// accumulates TM rows × NV vec4 columns in registers, its rows WG_Y apart and its vec4 columns
// WG_X apart. The accumulators are named variables, updated by unrolled code (ACCUMULATORS,
// MULTIPLY, STORE).
//
// Placeholders: BINDINGS, M, N, K, TILES_M, TILES, GRID_X, WG_X, WG_Y, TM, NV, BK; the geometry
// C, O, H, W, HO, WO, KH, KW, SH, SW, PH, PW; GROUPS, K_TOTAL, HP, WP; FUNCTIONS (helpers the
// epilogue calls), READS
// (`let` statements loading the epilogue's extras at the output's row-major index `i`),
// EPILOGUE (an f32 expression of `x`, the dot product, and the READS); ACCUMULATORS, MULTIPLY,
// STORE. Flags: FORWARD, GRAD_INPUT, GRAD_WEIGHT (exactly one is set).

{{BINDINGS}}

const M: u32 = {{M}}u;
const N: u32 = {{N}}u;
const K: u32 = {{K}}u;
const TILES_M: u32 = {{TILES_M}}u;
const TILES: u32 = {{TILES}}u;
const GRID_X: u32 = {{GRID_X}}u;
//#include gemm_tiles

const C: u32 = {{C}}u;   // image channels
const O: u32 = {{O}}u;   // filters
const H: u32 = {{H}}u;   // image size
const W: u32 = {{W}}u;
const HO: u32 = {{HO}}u;  // output positions
const WO: u32 = {{WO}}u;
const L: u32 = HO * WO;
const KH: u32 = {{KH}}u;
const KW: u32 = {{KW}}u;
const TAPS: u32 = KH * KW;
const SH: u32 = {{SH}}u;
const SW: u32 = {{SW}}u;
const PH: u32 = {{PH}}u;
const PW: u32 = {{PW}}u;
const GROUPS: u32 = {{GROUPS}}u;  // independent GEMMs of one dispatch (parts of K or phases)
const K_TOTAL: u32 = {{K_TOTAL}}u;  // grad_weight: the whole reduction, NIMG·HO·WO
const HP: u32 = {{HP}}u;  // grad_input: rows and columns of a stride phase, ⌈H/SH⌉ and ⌈W/SW⌉
const WP: u32 = {{WP}}u;

// The workgroup's GEMM: its index gemm_group; its reduction length k_len (K, but for grad_input
// and the last part of a grad_weight); grad_weight, its part's first reduction index k_first;
// grad_input, its stride phase (py, px), the phase's first tap (i0, j0), its taps per kernel row
// and column (ti, tj) and (py + PH) / SH, (px + PW) / SW.
var<private> k_len: u32;
var<private> ti: u32;
var<private> tj: u32;
var<private> gemm_group: u32;
var<private> k_first: u32;
var<private> py: u32;
var<private> px: u32;
var<private> i0: u32;
var<private> j0: u32;
var<private> qy: u32;
var<private> qx: u32;

{{FUNCTIONS}}

//#if GRAD_INPUT
//#else
// x[img, c, ho·SH − PH + i, wo·SW − PW + j]: one element of the column im2col would write; 0 in
// the padding.
fn gather_x(img: u32, c: u32, i: u32, j: u32, ho: u32, wo: u32) -> f32 {
    let y = i32(ho * SH + i) - i32(PH);
    let x = i32(wo * SW + j) - i32(PW);
    if (y >= 0 && y < i32(H) && x >= 0 && x < i32(W)) {
        return b[((img * C + c) * H + u32(y)) * W + u32(x)];
    }
    return 0.0;
}
//#endif

// A[m, k]; 0 outside the matrix.
fn load_a(m: u32, k: u32) -> f32 {
    if (m >= M || k >= k_len) {
        return 0.0;
    }
//#if FORWARD
    return a[m * K + k];  // weight [O, C·KH·KW] as stored
//#endif
//#if GRAD_INPUT
    let o = k / (ti * tj);  // A[c, (o, i, j)] = weight[o, (c·KH + i)·KW + j], (i, j) of the phase
    let i = i0 + SH * ((k / tj) % ti);
    let j = j0 + SW * (k % tj);
    return a[(o * C + m) * TAPS + i * KW + j];
//#endif
//#if GRAD_WEIGHT
    let nl = k_first + k;  // A[o, (n, l)] = g[n, o, l]
    return a[((nl / L) * O + m) * L + nl % L];
//#endif
}

// B[k, n], gathered; 0 outside the matrix.
fn load_b(k: u32, n: u32) -> f32 {
    if (k >= k_len || n >= N) {
        return 0.0;
    }
//#if FORWARD
    let c = k / TAPS;  // B[(c, i, j), (n, ho, wo)]
    let ij = k % TAPS;
    let img = n / L;
    let l = n % L;
    return gather_x(img, c, ij / KW, ij % KW, l / WO, l % WO);
//#endif
//#if GRAD_INPUT
    // B[(o, a, b), (n, yp, xp)] = g[n, o, ho, wo] for the pixel y = py + SH·yp, x = px + SW·xp and
    // the tap i = i0 + SH·a, j = j0 + SW·b of its phase: ho·SH − PH + i = y, so ho = yp + qy − a.
    let o = k / (ti * tj);
    let ta = (k / tj) % ti;
    let tb = k % tj;
    let img = n / (HP * WP);
    let yp = (n / WP) % HP;
    let xp = n % WP;
    let ho = i32(yp + qy) - i32(ta);
    let wo = i32(xp + qx) - i32(tb);
    if (ho < 0 || wo < 0 || ho >= i32(HO) || wo >= i32(WO)) {
        return 0.0;
    }
    return b[(img * O + o) * L + u32(ho) * WO + u32(wo)];
//#endif
//#if GRAD_WEIGHT
    let nl = k_first + k;  // B[(n, ho, wo), (c, i, j)]
    let img = nl / L;
    let l = nl % L;
    let ij = n % TAPS;
    return gather_x(img, n / TAPS, ij / KW, ij % KW, l / WO, l % WO);
//#endif
}

const NO_ELEMENT: u32 = 0xffffffffu;

// The row-major index in out of GEMM element (row, col) (NO_ELEMENT: none).
fn out_index(row: u32, col: u32) -> u32 {
//#if FORWARD
    return ((col / L) * O + row) * L + col % L;
//#endif
//#if GRAD_INPUT
    let y = py + SH * ((col / WP) % HP);  // the phase's pixel; past the image: no element
    let x = px + SW * (col % WP);
    if (y >= H || x >= W) {
        return NO_ELEMENT;
    }
    return ((col / (HP * WP)) * C + row) * (H * W) + y * W + x;
//#endif
//#if GRAD_WEIGHT
    return gemm_group * M * N + row * N + col;
//#endif
}

fn epilogue(x: f32, i: u32) -> f32 {
    {{READS}}
    return {{EPILOGUE}};
}

// Store one accumulator: GEMM elements (row, col .. col + 3), inside the matrix.
fn store4(row: u32, col: u32, v: vec4<f32>) {
    if (row >= M) {
        return;
    }
    for (var c = 0u; c < 4u; c++) {
        if (col + c < N) {
            let i = out_index(row, col + c);
            if (i != NO_ELEMENT) {
                out[i] = epilogue(v[c], i);
            }
        }
    }
}

@compute @workgroup_size(WG_X, WG_Y, 1)
fn conv_gemm(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_id) local: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let t = wid.x + wid.y * GRID_X;
    if (t >= TILES) {
        return;  // uniform: the whole workgroup leaves
    }
    let tiles_per_group = TILES / GROUPS;
    gemm_group = t / tiles_per_group;
    k_first = gemm_group * K;
    py = gemm_group / SW;
    px = gemm_group % SW;
    i0 = (py + PH) % SH;
    j0 = (px + PW) % SW;
    qy = (py + PH) / SH;
    qx = (px + PW) / SW;
    k_len = K;
//#if GRAD_WEIGHT
    k_len = min(K, K_TOTAL - k_first);
//#endif
//#if GRAD_INPUT
    ti = (KH + SH - 1u - min(i0, KH)) / SH;  // ⌈(KH − i0)/SH⌉, 0 when the phase has no tap
    tj = (KW + SW - 1u - min(j0, KW)) / SW;
    k_len = O * ti * tj;
//#endif
    let tile_m = (t % tiles_per_group) % TILES_M;
    let tile_n = (t % tiles_per_group) / TILES_M;
    let row0 = tile_m * BM + local.y;  // this thread's first row; the others are WG_Y apart
    let col0 = tile_n * BN + 4u * local.x;  // its first column; the other vec4s are 4·WG_X apart
    {{ACCUMULATORS}}

    for (var k0 = 0u; k0 < k_len; k0 += BK) {
        // Stage along the faster-moving address of each gather (see lower_conv.py).
        for (var s = lid; s < BM * BK; s += THREADS) {
            let m = s / BK;
            let k = s % BK;
            tile_a[k * BM + m] = load_a(tile_m * BM + m, k0 + k);
        }
        for (var s = lid; s < BK * BN; s += THREADS) {
            {{B_STAGE}}
            tile_b[k * BN4 + n / 4u][n % 4u] = load_b(k0 + k, tile_n * BN + n);
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
