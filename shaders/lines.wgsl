// lines.wgsl: the selection kernels that walk the line of one axis through a tensor, one thread
// per unit of work: a line (cumsum, cumprod, arg_reduce) or an element (cumprod_grad, topk).
//
// A line is the L values along the axis at one index of the other dims: line t's element k sits
// at (t / INNER)·L·INNER + k·INNER + t % INNER, INNER being the product of the dims after the
// axis (strided reads for an inner axis, no transpose copy). BODY, generated per op
// (codegen/select.py), walks it:
//
//   cumsum, cumprod:  a thread per line writes the running sum (product) at each k, in order
//                     along the axis (from its end for a reverse cumsum)
//   cumprod_grad:     a thread per element k: Σ_{j≥k} g_j · Π_{i≤j, i≠k} x_i
//   arg_reduce:       a thread per line keeps the first maximum (minimum), NaN beating any
//                     number, and writes it and its index
//   topk:             a thread per element counts the elements that come before it in the
//                     line's order (NaN first when largest, ties by index): that is its rank,
//                     and an element of rank < K writes itself and its index at the rank. The
//                     ranks of a line are a permutation of 0…L−1, so every output is written
//                     once, by one thread: no atomics, the same on every run.
//
// Bindings (group 0, generated from the KernelSpec): the op's inputs (read), then its results
// (read_write): out, or values (f32) and indices (i32).
// Grid: ⌈THREADS / 64⌉ workgroups of 64 threads, folded into (GRID_X, y) past the per-dimension
// limit.
//
// Placeholders: BINDINGS, THREADS, GRID_X, FUNCTIONS (helpers BODY calls), BODY (statements of
// thread `t`).

{{BINDINGS}}

const THREADS: u32 = {{THREADS}}u;
const GRID_X: u32 = {{GRID_X}}u;

{{FUNCTIONS}}

@compute @workgroup_size(64)
fn lines(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = (wid.x + wid.y * GRID_X) * 64u + lid;
    if (t >= THREADS) {
        return;
    }
    {{BODY}}
}
