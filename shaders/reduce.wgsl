// reduce.wgsl: out[o] = Σ_r x[base(o) + offset(r)]: `sum` over any set of axes.
//
// The generator splits the input's dims into kept dims (indexed by the output element o, in
// row-major order, which is the output's layout with or without keepdim) and reduced dims
// (indexed by r in [0, R)); BASE and OFFSET are the input index expressions of o and r.
// Bindings (group 0, generated from the KernelSpec): x (read), out (read_write).
// Two entry points:
// - sum_tree: one workgroup of WG threads per output element; each thread sums a strided
//   slice of r, then a tree reduction in workgroup memory. For long reductions.
//   Grid: OUTS workgroups, folded into (GRID_X, y).
// - sum_serial: one thread per output element, looping over r. For short reductions with many
//   outputs, where neighbouring threads then read neighbouring addresses.
//   Grid: OUTS / WG workgroups, folded into (GRID_X, y).
//
// Placeholders: BINDINGS, OUTS, R, WG (a power of two), GRID_X, BASE (u32 expression of `o`),
// OFFSET (u32 expression of `r`).

{{BINDINGS}}

const OUTS: u32 = {{OUTS}}u;
const R: u32 = {{R}}u;
const WG: u32 = {{WG}}u;
const GRID_X: u32 = {{GRID_X}}u;

var<workgroup> partial: array<f32, WG>;

fn input_index(o: u32, r: u32) -> u32 {
    return ({{BASE}}) + ({{OFFSET}});
}

@compute @workgroup_size(WG)
fn sum_tree(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let o = wid.x + wid.y * GRID_X;
    var acc = 0.0;
    if (o < OUTS) {
        for (var r = lid; r < R; r += WG) {
            acc += x[input_index(o, r)];
        }
    }
    partial[lid] = acc;
    workgroupBarrier();
    for (var half = WG / 2u; half > 0u; half >>= 1u) {
        if (lid < half) {
            partial[lid] += partial[lid + half];
        }
        workgroupBarrier();
    }
    if (lid == 0u && o < OUTS) {
        out[o] = partial[0];
    }
}

@compute @workgroup_size(WG)
fn sum_serial(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let o = (wid.x + wid.y * GRID_X) * WG + lid;
    if (o >= OUTS) {
        return;
    }
    var acc = 0.0;
    for (var r = 0u; r < R; r++) {
        acc += x[input_index(o, r)];
    }
    out[o] = acc;
}
