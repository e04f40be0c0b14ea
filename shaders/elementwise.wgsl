// elementwise.wgsl: out[i] = f(inputs at i), one thread per output element.
//
// Serves the unary ops (neg, exp, log, sqrt, rsqrt, relu, sigmoid, tanh, silu), the
// broadcasting binary ops (add, sub, mul, div, greater, equal, swiglu), broadcast_to
// (f = identity), `pointwise` (f = its expression over $0, $1, …) and permute (a gather);
// also the indexing ops (pick, scatter_rows, gather, slice, slice_grad, concat),
// whose READS compute their index arithmetic.
// rope and rope_grad read each element's partner across the halves of the last dim.
// Bindings (group 0, generated from the KernelSpec): one read binding per input buffer
// (x0, x1, …; scalar constants are inlined as literals and have none), then out (read_write).
// Grid: NUMEL / 256 workgroups of 256 threads, folded into (GRID_X, y) when there are more
// than the per-dimension limit allows. A permute that keeps a last axis of a multiple of 4 in
// place binds its input and output as arrays of vec4: NUMEL and `i` then count vec4s.
//
// Broadcasting is resolved by the generator: each input is read at an index expression of
// `i` built from the output shape and the input's strides (0 along broadcast dims).
//
// Placeholders: BINDINGS, NUMEL, GRID_X, FUNCTIONS (helper functions the expression calls),
// READS (`let` statements loading the inputs at index expressions of `i`), VALUE (the output
// expression).

{{BINDINGS}}

const NUMEL: u32 = {{NUMEL}}u;
const GRID_X: u32 = {{GRID_X}}u;

{{FUNCTIONS}}

@compute @workgroup_size(256)
fn elementwise(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * GRID_X) * 256u + lid;
    if (i >= NUMEL) {
        return;
    }
    {{READS}}
    out[i] = {{VALUE}};
}
