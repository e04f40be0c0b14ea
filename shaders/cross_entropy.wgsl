// cross_entropy.wgsl: fused softmax + cross-entropy with integer labels, one workgroup per row.
//
// Forward (entry cross_entropy_rows):  out[r] = log Σ_c exp(z[r,c] − max_r) + max_r − z[r, label[r]]
// Backward (entry cross_entropy_rows_grad):
//     out[r, c] = (exp(z[r,c] − max_r) / Σ_c' exp(z[r,c'] − max_r) − [c == label[r]]) · grad[r]
// Subtracting the row max keeps exp() from overflowing. A label outside [0, C) gives NaN
// rather than reading another row.
// Bindings (group 0, generated from the KernelSpec): logits (read, f32 [ROWS, C]), labels
// (read, i32 [ROWS]), grad (read, f32 [ROWS]; backward only, unless inlined as GRAD_AT), out
// (read_write: [ROWS] forward, [ROWS, C] backward).
// Grid: ROWS workgroups of WG threads (a power of two), folded into (GRID_X, y).
//
// Placeholders: BINDINGS, ROWS, C, WG, GRID_X; flag GRAD selects the backward entry point;
// GRAD_AT is the f32 expression of the incoming gradient of `row` (backward only).

{{BINDINGS}}

const ROWS: u32 = {{ROWS}}u;
const C: u32 = {{C}}u;
const WG: u32 = {{WG}}u;
const GRID_X: u32 = {{GRID_X}}u;

//#include workgroup_combine

fn row_max(row: u32, lid: u32) -> f32 {
    var best = -3.4028234663852886e38;
    for (var c = lid; c < C; c += WG) {
        best = max(best, logits[row * C + c]);
    }
    return combine(best, lid, true);
}

fn row_sum_exp(row: u32, lid: u32, shift: f32) -> f32 {
    var total = 0.0;
    for (var c = lid; c < C; c += WG) {
        total += exp(logits[row * C + c] - shift);
    }
    return combine(total, lid, false);
}

fn nan() -> f32 {
    return bitcast<f32>(0x7fc00000u);
}

//#if GRAD
@compute @workgroup_size(WG)
fn cross_entropy_rows_grad(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * GRID_X;
    if (row >= ROWS) {
        return;
    }
    let shift = row_max(row, lid);
    let scale = 1.0 / row_sum_exp(row, lid, shift);
    let label = labels[row];
    let g = {{GRAD_AT}};
    let valid = label >= 0 && u32(label) < C;
    for (var c = lid; c < C; c += WG) {
        let p = exp(logits[row * C + c] - shift) * scale;
        let hit = select(0.0, 1.0, valid && u32(label) == c);
        out[row * C + c] = select(nan(), (p - hit) * g, valid);
    }
}
//#else
@compute @workgroup_size(WG)
fn cross_entropy_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * GRID_X;
    if (row >= ROWS) {
        return;
    }
    let shift = row_max(row, lid);
    let total = row_sum_exp(row, lid, shift);
    if (lid == 0u) {
        let label = labels[row];
        if (label >= 0 && u32(label) < C) {
            out[row] = log(total) + shift - logits[row * C + u32(label)];
        } else {
            out[row] = nan();
        }
    }
}
//#endif
