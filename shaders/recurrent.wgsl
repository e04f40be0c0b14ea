// recurrent.wgsl: one time step of a recurrent layer's elementwise part, a thread per hidden unit
// of each row (codegen/recurrent.py): lstm_cell, lstm_cell_grad, gru_cell and gru_cell_grad.
//
// Thread i handles unit j = i % HIDDEN of row i / HIDDEN: it reads that unit's gates (the k-th
// gate at row · GATES·HIDDEN + k·HIDDEN + j of a [rows, GATES·HIDDEN] operand) and its state
// values at i, and writes each result at the same places: an LSTM step its h' and c', its
// gradient the four gate gradients and dc_prev; a GRU step h', its gradient dgx, dgh and dh.
// Bindings (group 0, generated from the KernelSpec): one read binding per input buffer (x0, x1,
// …; scalar constants, a zero gradient, are inlined as literals and have none), then one
// read_write binding per result (out0, out1, …).
// Grid: NUMEL / 256 workgroups of 256 threads, folded into (GRID_X, y) when there are more than
// the per-dimension limit allows.
//
// Placeholders: BINDINGS, NUMEL (rows × HIDDEN), HIDDEN, GRID_X, FUNCTIONS (helpers the body
// calls), BODY (reads the unit's operands, computes and writes its results; `row` and `j` are set).

{{BINDINGS}}

const NUMEL: u32 = {{NUMEL}}u;
const HIDDEN: u32 = {{HIDDEN}}u;
const GRID_X: u32 = {{GRID_X}}u;

{{FUNCTIONS}}

@compute @workgroup_size(256)
fn recurrent(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * GRID_X) * 256u + lid;
    if (i >= NUMEL) {
        return;
    }
    let row = i / HIDDEN;
    let j = i % HIDDEN;
    {{BODY}}
}
