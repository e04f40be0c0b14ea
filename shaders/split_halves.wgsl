// split_halves.wgsl: f32 operands split once into the f16 halves the tensor-core product reads
// (matmul_halves.wgsl): one (split_halves) or several (multi_split_halves, a member each) in one
// dispatch. The generator is codegen/matmul_halves.py; ir/ops/halves.py says what the halves are
// and why.
//
// A member's operand O is X [ROWS, COLS] (its x's row-major matrix, rows of X_COLS) or, transposed,
// Xᵀ, padded with zeros to [ROWS_P, COLS_P]; it owns a range of the workgroups (MEMBERS: each
// member's code, for the workgroups `w` in its range). Its workgroup first finds the largest of
// its `top` (the partial maxima of |x|) and from it the scale 2^e; then a unit of four
// neighbouring columns of O is scaled, hi cut to f16's 10 mantissa bits, lo the rest, and both
// written as two words of packed f16 into planes 0 and 1 of its output (`store_halves`).
// Untransposed, a thread takes units read straight from X; transposed, a workgroup takes a 64×64
// block of O, reading X's block along X's rows (coalesced) into workgroup memory.
//
// Bindings: each member's x and top (f32; a tensor split both ways binds them once) and output
// (vec2<u32>). Placeholders: BINDINGS, GRID_X (workgroups along x of the folded grid), MEMBERS.
// Flag: BLOCKS (a member is transposed).
{{BINDINGS}}

//#include split_scale

const WG: u32 = 256u;
//#include workgroup_combine
//#if BLOCKS
var<workgroup> block: array<f32, 64 * 65>;  // X's block, a row of 64 and one of padding
//#endif

// v's hi and lo halves as the words of two units of packed f16: hi v with its mantissa cut to
// f16's 10 bits (exact in f16), lo the rest, rounded.
fn halves_of(v: vec4<f32>) -> array<vec2<u32>, 2> {
    let hi = bitcast<vec4<f32>>(bitcast<vec4<u32>>(v) & vec4<u32>(0xFFFFE000u));
    let lo = v - hi;
    return array<vec2<u32>, 2>(
        vec2<u32>(pack2x16float(hi.xy), pack2x16float(hi.zw)),
        vec2<u32>(pack2x16float(lo.xy), pack2x16float(lo.zw)),
    );
}

@compute @workgroup_size(256, 1, 1)
fn split_halves(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let w = wid.x + wid.y * {{GRID_X}}u;
    {{MEMBERS}}
}
