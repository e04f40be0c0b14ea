// split_halves.wgsl: an f32 operand split once into the f16 halves the tensor-core product reads
// (matmul_halves.wgsl). The generator is codegen/matmul_halves.py; ir/ops/halves.py says what the
// halves are and why.
//
// The operand O is X [ROWS, COLS] (x's row-major matrix of rows of X_COLS) or, with TRANSPOSE,
// Xᵀ, padded with zeros to [ROWS_P, COLS_P]. The workgroup first finds the largest of `top`, the
// partial maxima of |x|, and from it the scale 2^e. Then a unit of four neighbouring columns of O
// is scaled, hi cut to f16's 10 mantissa bits, lo the rest, and both written as two words of
// packed f16 into planes 0 and 1 of `out`. Without TRANSPOSE a thread takes one unit, read
// straight from X. With it, a workgroup takes a 64×64 block of O: it reads X's block along X's
// rows (coalesced) into workgroup memory, and each thread then takes four units of it.
//
// Bindings: x (f32), top (f32), out (vec2<u32>). Placeholders: ROWS, COLS, ROWS_P, COLS_P,
// X_COLS, TILES_C (blocks along a row of O, with TRANSPOSE), GRID_X (workgroups along x of the
// folded grid), TOPS (the elements of top). Flag: TRANSPOSE.
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> top: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<vec2<u32>>;

const ROWS: u32 = {{ROWS}}u;
const COLS: u32 = {{COLS}}u;
const COLS_P: u32 = {{COLS_P}}u;
const PLANE: u32 = {{ROWS_P}}u * COLS_P / 4u;  // units of 4 halves in one plane
const X_COLS: u32 = {{X_COLS}}u;
const TILES_C: u32 = {{TILES_C}}u;
const GRID_X: u32 = {{GRID_X}}u;
const TOPS: u32 = {{TOPS}}u;
// The largest |x| is scaled into [2^13, 2^14): twice that still fits f16 (its largest 65504).
const TOP_EXPONENT: i32 = 13;

var<workgroup> largest: array<f32, 256>;
//#if TRANSPOSE
var<workgroup> block: array<f32, 64 * 65>;  // X's block, a row of 64 and one of padding
//#endif

fn power_of_two(e: i32) -> f32 {
    return bitcast<f32>(u32(clamp(e, -126, 127) + 127) << 23u);
}

// The scale 2^e that puts the largest of |top| into [2^13, 2^14) (1 where it is 0), found by the
// whole workgroup.
fn scale(t: u32) -> f32 {
    var m = 0.0;
    for (var i = t; i < TOPS; i += 256u) {
        m = max(m, abs(top[i]));
    }
    largest[t] = m;
    workgroupBarrier();
    for (var w = 128u; w > 0u; w = w / 2u) {
        if (t < w) {
            largest[t] = max(largest[t], largest[t + w]);
        }
        workgroupBarrier();
    }
    var e = 0;
    if (largest[0] > 0.0) {
        e = clamp(TOP_EXPONENT + 1 - frexp(largest[0]).exp, -126, 126);
    }
    return power_of_two(e);
}

// Unit (r, c … c + 3) of O, scaled, as packed hi and lo halves.
fn store_unit(r: u32, c: u32, v: vec4<f32>) {
    // hi: v with its mantissa cut to f16's 10 bits (exact in f16); lo: the rest, rounded.
    let hi = bitcast<vec4<f32>>(bitcast<vec4<u32>>(v) & vec4<u32>(0xFFFFE000u));
    let lo = v - hi;
    let at = (r * COLS_P + c) / 4u;
    out[at] = vec2<u32>(pack2x16float(hi.xy), pack2x16float(hi.zw));
    out[PLANE + at] = vec2<u32>(pack2x16float(lo.xy), pack2x16float(lo.zw));
}

@compute @workgroup_size(256, 1, 1)
fn split_halves(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let b = wid.x + wid.y * GRID_X;
    let s = scale(t);
//#if TRANSPOSE
    let r0 = b / TILES_C * 64u;
    let c0 = b % TILES_C * 64u;
    for (var j = 0u; j < 16u; j++) {
        let i = (t + 256u * j) / 64u;
        let jj = (t + 256u * j) % 64u;
        let xr = c0 + i;  // X [COLS, ROWS]: O[r, c] = X[c, r]
        let xc = r0 + jj;
        var v = 0.0;
        if (xr < COLS && xc < ROWS) {
            v = x[xr * X_COLS + xc];
        }
        block[i * 65u + jj] = v;
    }
    workgroupBarrier();
    for (var j = 0u; j < 4u; j++) {
        let r = (t + 256u * j) / 16u;
        let c = (t + 256u * j) % 16u * 4u;
        let o = vec4<f32>(block[c * 65u + r], block[(c + 1u) * 65u + r], block[(c + 2u) * 65u + r], block[(c + 3u) * 65u + r]);
        store_unit(r0 + r, c0 + c, o * s);
    }
//#else
    let u = b * 256u + t;
    let r = u / (COLS_P / 4u);
    let c = u % (COLS_P / 4u) * 4u;
    if (r >= {{ROWS_P}}u) {
        return;
    }
    var o = vec4<f32>(0.0);
    if (r < ROWS) {
        for (var q = 0u; q < 4u; q++) {
            if (c + q < COLS) {
                o[q] = x[r * X_COLS + c + q];
            }
        }
    }
    store_unit(r, c, o * s);
//#endif
}
