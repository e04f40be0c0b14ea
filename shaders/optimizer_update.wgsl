// optimizer_update.wgsl: the whole optimizer update of one or many parameters in one dispatch.
//
//   sgd_update(p, g, lr, wd[, momentum, buf])
//                                d = g + wd·p; with momentum buf′ = momentum·buf + d, d = buf′;
//                                p′ = p − lr·d
//   adam_update(p, g, m, v, t, lr, beta1, beta2, eps, wd)
//                                g = g + wd·p (Adam's L2 form; not for AdamW), m′ = beta1·m + (1 − beta1)·g,
//                                v′ = beta2·v + (1 − beta2)·g·g,
//                                p′ = p·(1 − lr·decay) − lr/(1 − beta1ᵗ) · m′ / (√v′ / √(1 − beta2ᵗ) + eps)
//                                (decay: AdamW's decoupled weight decay, 0 for Adam)
//
// Each formula is written as shaders/optimizer.wgsl writes the single-tensor kernels (the same
// operations in the same order), so the fused update gives the same bits as the moment and step
// kernels one after another.
//
// Members: the parameters one dispatch updates (one for a plain fused update; many for a
// multi-tensor update). The hyper-parameters are operands like the others (elements of their
// parameter group's vector, which the runtime writes when the optimizer's values change, read at
// literal offsets): each member's case passes its own group's, so members of different groups
// share a kernel, and each group's vector is one binding. Member k owns a contiguous range of
// workgroups, one per 256 of its elements; MEMBER_OF (a binary search over the ranges' first
// workgroups, generated as nested ifs with literal bounds) finds the member of a workgroup,
// and the member's case of the switch updates its elements. Each case names its own buffers:
// WGSL cannot index a set of bindings at run time.
// Bindings (group 0, generated from the KernelSpec): the buffers read (gradients, the step
// count, each group's hyper-parameter vector, and the old values of updates that do not run in
// place: x0, x1…), then every result's buffer (read_write; in place it holds the old value on
// entry, so the case reads it there). A fused Adam update in place binds 6: the gradient, the
// step count, the vector, p, m and v.
// Grid: the members' workgroups in total, folded into (GRID_X, y).
//
// Placeholders: BINDINGS, GRID_X, MEMBER_OF (the body of member_of), CASES (the switch's
// cases); flags SGD_UPDATE, ADAM_UPDATE pick the formula,
// HAS_MOMENTUM (SGD: a momentum buffer) and L2 (Adam: weight decay added to the gradient, not
// decoupled as AdamW's) the terms present.

{{BINDINGS}}

const GRID_X: u32 = {{GRID_X}}u;

//#if SGD_UPDATE
//#if HAS_MOMENTUM
struct Updated {
    p: f32,
    buf: f32,
}

fn update(p: f32, g: f32, lr: f32, weight_decay: f32, momentum: f32, buf: f32) -> Updated {
    let new_buf = momentum * buf + (g + weight_decay * p);
    return Updated(p - lr * new_buf, new_buf);
}
//#else
struct Updated {
    p: f32,
}

fn update(p: f32, g: f32, lr: f32, weight_decay: f32) -> Updated {
    return Updated(p - lr * (g + weight_decay * p));
}
//#endif
//#endif

//#if ADAM_UPDATE
struct Updated {
    p: f32,
    m: f32,
    v: f32,
}

fn update(p: f32, grad: f32, m: f32, v: f32, t: f32, lr: f32, beta1: f32, beta2: f32, eps: f32, weight_decay: f32) -> Updated {
//#if L2
    let g = grad + weight_decay * p;
    let decay = 0.0;
//#else
    let g = grad;
    let decay = weight_decay;
//#endif
    let new_m = beta1 * m + (1.0 - beta1) * g;
    let new_v = beta2 * v + (1.0 - beta2) * g * g;
    let bias1 = 1.0 - pow(beta1, t);
    let bias2 = 1.0 - pow(beta2, t);
    let new_p = p * (1.0 - lr * decay) - (lr / bias1) * new_m / (sqrt(new_v) / sqrt(bias2) + eps);
    return Updated(new_p, new_m, new_v);
}
//#endif

fn member_of(w: u32) -> u32 {
    {{MEMBER_OF}}
}

@compute @workgroup_size(256)
fn optimizer_update(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let w = wid.x + wid.y * GRID_X;
    switch member_of(w) {
{{CASES}}
        default: {}
    }
}
