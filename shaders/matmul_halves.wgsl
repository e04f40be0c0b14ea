// matmul_halves.wgsl: a product on the tensor cores from operands split once (split_halves.wgsl),
// out = epilogue(A·B, extras…), or split-K partials. The generator is codegen/matmul_halves.py;
// ir/ops/halves.py gives the method: C = (Ah·Bh + Ah·Bl + Al·Bh) · 2^-(ea + eb) with f32
// accumulation through Dawn's subgroup matrices (f16 × f16 → f32, 16×16×16).
//
// A workgroup of GM × GN subgroups computes a BM × BN tile, each subgroup 16·SM × 16·SN of it as
// SM × SN result matrices (codegen/tensor_tiles.py generates its products and output). Per K tile of BK the threads copy their units of four halves of Ah, Al
// ([MP][KP], stored as the product reads them) and Bh, Bl ([KP][NP]) into workgroup memory, A as
// [m][BK + 8] and B as [k][BN + 8] tiles (every subgroup matrix loads row-major), and the
// subgroups multiply. The halves are padded with zeros to whole tiles, so no load is checked;
// a part of K (split-K) is whole tiles too. At the end each result matrix goes through
// workgroup memory, is unscaled and leaves through `store4` (the epilogue).
//
// Bindings: a, b (vec4<f16>: the two planes of each operand's halves), a_top, b_top (f32: the
// partial maxima of |A|, |B| that the split read), the epilogue's extras, out. Placeholders:
// those of matmul_common.wgsl (M, N, K, BM, BN, BK, TILES_M, TILES, GRID_Y, SPLITS, K_PART,
// FUNCTIONS, A_READS, PROLOGUE, READS, EPILOGUE, A_BATCH_STRIDE, A_INDEX, B_BATCH_STRIDE,
// B_INDEX, STORE4), KP, A_PLANE / B_PLANE (units of four halves in a plane), A_TOPS / B_TOPS,
// A_SIZE / B_SIZE (halves of a staged tile), LOADS (a K tile's units into registers), STAGE
// (them into workgroup memory), MULTIPLY, RESULTS, OUTPUT, THREADS, SUBGROUPS, GN, SUB_M, SUB_N.
// Flags: A_SCALAR, B_SCALAR (false: no scalar loads).
enable f16;
enable subgroups;
enable chromium_experimental_subgroup_matrix;
// Offsets computed from subgroup_id are uniform within a subgroup, which the analysis cannot see.
diagnostic(off, chromium_experimental.subgroup_matrix_uniformity);

{{BINDINGS}}

//#include matmul_common

const KP: u32 = {{KP}}u;
const A_PLANE: u32 = {{A_PLANE}}u;
const B_PLANE: u32 = {{B_PLANE}}u;
//#include split_scale

var<workgroup> a_hi: array<f16, {{A_SIZE}}>;
var<workgroup> a_lo: array<f16, {{A_SIZE}}>;
var<workgroup> b_hi: array<f16, {{B_SIZE}}>;
var<workgroup> b_lo: array<f16, {{B_SIZE}}>;
var<workgroup> result: array<f32, {{SUBGROUPS}} * 256>;  // per subgroup: one 16×16 result matrix on its way out

@compute @workgroup_size({{THREADS}}, 1, 1)
fn matmul_halves(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    let tk = wid.y + wid.z * GRID_Y;
    if (tk >= TILES * SPLITS) {
        return;
    }
    let part = tk / TILES;
    let t = tk % TILES;
    let kbegin = part * K_PART;
    let klimit = min(KP, kbegin + K_PART);
    let obat = part;
    let m0 = (t % TILES_M) * BM;
    let n0 = wid.x * BN;
    let sm0 = (sg / {{GN}}u) * {{SUB_M}}u;  // the subgroup's rows and columns within the tile
    let sn0 = (sg % {{GN}}u) * {{SUB_N}}u;
    // The scales' largest |x| over the tops, by the whole workgroup (`result` as scratch).
    var la = 0.0;
    for (var i = lid; i < {{A_TOPS}}u; i += {{THREADS}}u) {
        la = max(la, abs(a_top[i]));
    }
    var lb = 0.0;
    for (var i = lid; i < {{B_TOPS}}u; i += {{THREADS}}u) {
        lb = max(lb, abs(b_top[i]));
    }
    result[lid] = la;
    result[{{THREADS}}u + lid] = lb;
    workgroupBarrier();
    for (var w = {{THREADS}}u / 2u; w > 0u; w = w / 2u) {
        if (lid < w) {
            result[lid] = max(result[lid], result[lid + w]);
            result[{{THREADS}}u + lid] = max(result[{{THREADS}}u + lid], result[{{THREADS}}u + lid + w]);
        }
        workgroupBarrier();
    }
    // Two factors: their product may leave f32's range where each is within it.
    let ua = power_of_two(-scale_exponent(result[0]));
    let ub = power_of_two(-scale_exponent(result[{{THREADS}}u]));
    workgroupBarrier();
    {{RESULTS}}
    for (var k0 = kbegin; k0 < klimit; k0 += BK) {
        {{LOADS}}
        {{STAGE}}
        workgroupBarrier();
        {{MULTIPLY}}
        workgroupBarrier();
    }
    {{OUTPUT}}
}
