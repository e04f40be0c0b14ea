// softmax.wgsl: softmax, log_softmax and their gradients along one axis, one workgroup per row.
//
// A row is the C values along the axis at one index of the other dims. Row `row`'s element c
// sits at (row / INNER)·C·INNER + c·INNER + row % INNER, INNER being the product of the dims
// after the axis: 1 for the last axis (contiguous rows), larger for an inner axis (strided
// reads, but no transpose copy). Every row reduction (max, Σ) stays in the workgroup: each
// thread combines a strided slice of the row, then a tree in workgroup memory. A row with a NaN,
// or with +inf (inf − inf), gives NaN everywhere, as PyTorch: the max may drop a NaN, but exp(NaN)
// reaches the sum and so every output (tests/test_nan_semantics.py).
//
//   softmax:           out = exp(x − m) / Σ exp(x − m),   m = the row's max (no overflow)
//   log_softmax:       out = (x − m) − log Σ exp(x − m)
//   softmax_grad:      out = y·(g − Σ g·y)               y = softmax(x), g the incoming gradient
//   log_softmax_grad:  out = g − exp(y)·Σ g              y = log_softmax(x)
//
// Bindings (group 0, generated from the KernelSpec): x (read, f32; softmax and log_softmax) or
// y and g (read, f32; the gradients), then out (read_write, f32), all of the same shape.
// Grid: ROWS workgroups of WG threads (a power of two), folded into (GRID_X, y).
//
// Placeholders: BINDINGS, ROWS, C, INNER, WG, GRID_X; flags SOFTMAX, LOG_SOFTMAX, SOFTMAX_GRAD
// and LOG_SOFTMAX_GRAD keep the one entry point (named like the op) that the kernel runs, and
// FORWARD (softmax or log_softmax) the row max and Σ exp helpers they share.

{{BINDINGS}}

const ROWS: u32 = {{ROWS}}u;
const C: u32 = {{C}}u;
const INNER: u32 = {{INNER}}u;
const WG: u32 = {{WG}}u;
const GRID_X: u32 = {{GRID_X}}u;

//#include workgroup_combine

fn at(row: u32, c: u32) -> u32 {
    return (row / INNER) * (C * INNER) + c * INNER + row % INNER;
}

//#if FORWARD
fn row_max(row: u32, lid: u32) -> f32 {
    var best = -3.4028234663852886e38;
    for (var c = lid; c < C; c += WG) {
        best = max(best, x[at(row, c)]);
    }
    return combine(best, lid, true);
}

fn row_sum_exp(row: u32, lid: u32, shift: f32) -> f32 {
    var total = 0.0;
    for (var c = lid; c < C; c += WG) {
        total += exp(x[at(row, c)] - shift);
    }
    return combine(total, lid, false);
}
//#endif
//#if SOFTMAX
@compute @workgroup_size(WG)
fn softmax(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * GRID_X;
    if (row >= ROWS) {
        return;
    }
    let shift = row_max(row, lid);
    let total = row_sum_exp(row, lid, shift);
    for (var c = lid; c < C; c += WG) {
        out[at(row, c)] = exp(x[at(row, c)] - shift) / total;
    }
}
//#endif
//#if LOG_SOFTMAX
@compute @workgroup_size(WG)
fn log_softmax(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * GRID_X;
    if (row >= ROWS) {
        return;
    }
    let shift = row_max(row, lid);
    let log_total = log(row_sum_exp(row, lid, shift));
    for (var c = lid; c < C; c += WG) {
        out[at(row, c)] = (x[at(row, c)] - shift) - log_total;
    }
}
//#endif
//#if SOFTMAX_GRAD
@compute @workgroup_size(WG)
fn softmax_grad(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * GRID_X;
    if (row >= ROWS) {
        return;
    }
    var partial = 0.0;
    for (var c = lid; c < C; c += WG) {
        partial += g[at(row, c)] * y[at(row, c)];
    }
    let dot = combine(partial, lid, false);
    for (var c = lid; c < C; c += WG) {
        let i = at(row, c);
        out[i] = y[i] * (g[i] - dot);
    }
}
//#endif
//#if LOG_SOFTMAX_GRAD
@compute @workgroup_size(WG)
fn log_softmax_grad(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * GRID_X;
    if (row >= ROWS) {
        return;
    }
    var partial = 0.0;
    for (var c = lid; c < C; c += WG) {
        partial += g[at(row, c)];
    }
    let total = combine(partial, lid, false);
    for (var c = lid; c < C; c += WG) {
        let i = at(row, c);
        out[i] = g[i] - exp(y[i]) * total;
    }
}
//#endif
