// matmul_tensor.wgsl: the product of matmul.wgsl (out = epilogue(op(prologue(A)) · op(B), extras…),
// batched, split-K into partials) on the tensor cores, through Dawn's subgroup matrices (f16 × f16
// → f32, 16×16×16). The generator is codegen/matmul_tensor.py; its module docstring gives the
// method (each f32 operand as a power-of-two scale times two f16 halves, three products) and the
// error it has.
//
// A workgroup of GM × GN subgroups computes a BM × BN tile; each subgroup 16·SM × 16·SN of it
// as SM × SN result matrices. Per K tile of BK: each thread loads its vec4 units of both operands
// (f32, A's through the prologue), the workgroup finds each operand tile's largest |x|, a tile
// that would leave f16's range under the running scale lowers it (and the accumulators with it),
// the units are scaled and split into hi (the f32 with its mantissa cut to f16's 10 bits) and lo
// (the rest, rounded to f16), stored in workgroup memory, and multiplied: Ah·Bl + Al·Bh + Ah·Bh.
// At the end each result matrix goes through workgroup memory, is unscaled and leaves through
// `store4` (the epilogue).
//
// Bindings, grid and the tile numbering as in matmul.wgsl. Placeholders: BINDINGS, M, N, K, BM,
// BN, BK, TILES_M, TILES, GRID_Y, SPLITS, K_PART, A_BATCH_STRIDE, B_BATCH_STRIDE, A_INDEX,
// B_INDEX, FUNCTIONS, A_READS, PROLOGUE, READS, EPILOGUE, STORE4, CAUSAL_ROWS and the flag CAUSAL
// (as matmul.wgsl); A_SIZE /
// B_SIZE (halves of one staged tile), UNITS (the thread's loads of a K tile into its registers),
// LARGEST (the largest |x| of its units, into `ma` and `mb`), STAGE (its units scaled, split and
// stored), MULTIPLY (the subgroup's products of one K tile), RESULTS (the accumulators), RESCALE
// (every accumulator times `f`), OUTPUT (the stores of the accumulators), THREADS, SUBGROUPS,
// GN, SUB_M, SUB_N (the subgroups' layout), TILE_LARGEST (the largest |a|, |b| over the
// subgroups' in `l`). Flags: A_SCALAR /
// B_SCALAR (as matmul.wgsl).
enable f16;
enable subgroups;
enable chromium_experimental_subgroup_matrix;
// Offsets computed from subgroup_id are uniform within a subgroup, which the analysis cannot see.
diagnostic(off, chromium_experimental.subgroup_matrix_uniformity);

{{BINDINGS}}

//#include matmul_common

//#include split_scale

var<workgroup> a_hi: array<f16, {{A_SIZE}}>;
var<workgroup> a_lo: array<f16, {{A_SIZE}}>;
var<workgroup> b_hi: array<f16, {{B_SIZE}}>;
var<workgroup> b_lo: array<f16, {{B_SIZE}}>;
var<workgroup> largest: array<vec2<f32>, {{SUBGROUPS}}>;  // per subgroup: its largest |a|, |b| of the K tile
var<workgroup> result: array<f32, {{SUBGROUPS}} * 256>;  // per subgroup: one 16×16 result matrix on its way out

fn max4(v: vec4<f32>) -> f32 {
    let w = abs(v);
    return max(max(w.x, w.y), max(w.z, w.w));
}

// hi: v with its mantissa cut to f16's 10 bits (exact in f16 where v is in f16's normal range);
// lo: the rest. Not f16(v) and v - f32(f16(v)): the H200's driver folds f32(f16(v)) to v.
fn high_half(v: vec4<f32>) -> vec4<f32> {
    return bitcast<vec4<f32>>(bitcast<vec4<u32>>(v) & vec4<u32>(0xFFFFE000u));
}

@compute @workgroup_size({{THREADS}}, 1, 1)
fn matmul_tensor(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
//#include gemm_tile
    let sm0 = (sg / {{GN}}u) * {{SUB_M}}u;  // the subgroup's rows and columns within the tile
    let sn0 = (sg % {{GN}}u) * {{SUB_N}}u;
    {{RESULTS}}
    // The running scales' exponents; 1000: no nonzero element seen yet.
    var ea = 1000;
    var eb = 1000;
    for (var k0 = kbegin; k0 < klimit; k0 += BK) {
        {{UNITS}}
        var ma = 0.0;
        var mb = 0.0;
        {{LARGEST}}
        let both = vec2<f32>(subgroupMax(ma), subgroupMax(mb));
        if (lane == 0u) {
            largest[sg] = both;
        }
        // A barrier (every subgroup is done with the previous tile's halves) that also makes the
        // maxima uniform, as the accumulators' rescaling must be.
        let l = workgroupUniformLoad(&largest);
        let top = {{TILE_LARGEST}};
        // Lower a running scale where this tile would overflow it (or set it on the first nonzero
        // tile); the accumulators follow, so that they stay sums of products at one scale.
        var f = 1.0;
        if (top.x > 0.0) {
            let e = scale_exponent(top.x);
            if (ea == 1000) { ea = e; } else if (e < ea) { f *= power_of_two(e - ea); ea = e; }
        }
        if (top.y > 0.0) {
            let e = scale_exponent(top.y);
            if (eb == 1000) { eb = e; } else if (e < eb) { f *= power_of_two(e - eb); eb = e; }
        }
        if (f != 1.0) {
            {{RESCALE}}
        }
        let sa = power_of_two(select(ea, 0, ea == 1000));
        let sb = power_of_two(select(eb, 0, eb == 1000));
        {{STAGE}}
        workgroupBarrier();
        {{MULTIPLY}}
    }
    // Two factors: their product may leave f32's range where each is within it.
    let ua = power_of_two(-select(ea, 0, ea == 1000));
    let ub = power_of_two(-select(eb, 0, eb == 1000));
    {{OUTPUT}}
}
