// workgroup_combine.wgsl: a snippet, not a kernel. Included (`//#include workgroup_combine`) by
// the row kernels (cross_entropy.wgsl, softmax.wgsl) and the operands' splits (split_halves.wgsl,
// multi_top.wgsl), which define the constant WG (threads per workgroup, a power of two).
//
// combine(value, lid, take_max): every thread passes its partial `value`; the workgroup reduces
// them as a tree in workgroup memory (max when take_max, else sum) and every thread gets the result.

var<workgroup> scratch: array<f32, WG>;

// Tree-combine every thread's `value` (max or sum); all threads get the result.
fn combine(value: f32, lid: u32, take_max: bool) -> f32 {
    scratch[lid] = value;
    workgroupBarrier();
    for (var half = WG / 2u; half > 0u; half >>= 1u) {
        if (lid < half) {
            let other = scratch[lid + half];
            scratch[lid] = select(scratch[lid] + other, max(scratch[lid], other), take_max);
        }
        workgroupBarrier();
    }
    let result = scratch[0];
    workgroupBarrier();  // scratch is reused by the next combine
    return result;
}
