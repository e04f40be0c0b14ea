// reduce.wgsl: out[o] = epilogue(⊕_r prologue(inputs at (o, r))): sum, max and fused_reduce
// over any set of axes, ⊕ being + or max.
//
// The generator splits the reduced shape's dims into kept dims (indexed by the output element
// o, in row-major order, which is the output's layout with or without keepdim) and reduced
// dims (indexed by r in [0, R)); each input is read at base(o) + offset(r), its index
// expression through broadcasting (stride 0 along broadcast dims).
// Bindings (group 0, generated from the KernelSpec): one read binding per input buffer (x0,
// x1, …; scalar constants are inlined), then out (read_write).
// Two entry points:
// - reduce_tree: one workgroup of WG threads per output element; each thread combines a
//   strided slice of r, then a tree reduction in workgroup memory. For long reductions.
//   Grid: OUTS workgroups, folded into (GRID_X, y).
// - reduce_serial: one thread per output element, looping over r. For short reductions with
//   many outputs, where neighbouring threads then read neighbouring addresses.
//   Grid: OUTS / WG workgroups, folded into (GRID_X, y).
//
// Placeholders: BINDINGS, OUTS, R, WG (a power of two), GRID_X, FUNCTIONS (helpers the
// expressions call), READS (`let` statements loading the inputs at `o`, `r`), PROLOGUE (the
// f32 value reduced at (o, r)), INIT (the identity of ⊕), COMBINE (⊕ of `a` and `b`),
// EPILOGUE (an f32 expression of `value`, the reduced value).

{{BINDINGS}}

const OUTS: u32 = {{OUTS}}u;
const R: u32 = {{R}}u;
const WG: u32 = {{WG}}u;
const GRID_X: u32 = {{GRID_X}}u;

var<workgroup> partial: array<f32, WG>;

{{FUNCTIONS}}

fn value_at(o: u32, r: u32) -> f32 {
    {{READS}}
    return {{PROLOGUE}};
}

fn combine(a: f32, b: f32) -> f32 {
    return {{COMBINE}};
}

fn finish(value: f32) -> f32 {
    return {{EPILOGUE}};
}

@compute @workgroup_size(WG)
fn reduce_tree(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let o = wid.x + wid.y * GRID_X;
    var acc = {{INIT}};
    if (o < OUTS) {
        for (var r = lid; r < R; r += WG) {
            acc = combine(acc, value_at(o, r));
        }
    }
    partial[lid] = acc;
    workgroupBarrier();
    for (var half = WG / 2u; half > 0u; half >>= 1u) {
        if (lid < half) {
            partial[lid] = combine(partial[lid], partial[lid + half]);
        }
        workgroupBarrier();
    }
    if (lid == 0u && o < OUTS) {
        out[o] = finish(partial[0]);
    }
}

@compute @workgroup_size(WG)
fn reduce_serial(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let o = (wid.x + wid.y * GRID_X) * WG + lid;
    if (o >= OUTS) {
        return;
    }
    var acc = {{INIT}};
    for (var r = 0u; r < R; r++) {
        acc = combine(acc, value_at(o, r));
    }
    out[o] = finish(acc);
}
