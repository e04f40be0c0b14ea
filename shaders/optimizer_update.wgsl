// optimizer_update.wgsl: the whole optimizer update of one or many parameters in one dispatch.
// g′ = g + wd·p (L2 weight decay), the float operations in the order of torch's single-tensor code:
//
//   sgd_update(p, g, lr, wd[, momentum, dampening, buf])
//                                d = g′; with momentum buf′ = momentum·buf + dampening·d, d = buf′
//                                (Nesterov: d = g′ + momentum·buf′); p′ = p − lr·d
//   adam_update(p, g, m, v, vmax, weight1, beta2, weight2, step_size, bias_correction2_sqrt, eps, wd, decay)
//                                g = g′ (Adam's L2 form; not for AdamW), m′ = lerp(m, g, weight1),
//                                v′ = v·beta2 + (weight2·g)·g, v̂ = max(vmax, v′) (AMSGrad; else v′),
//                                p′ = p·decay − (step_size·m′) / (√v̂ / bias_correction2_sqrt + eps)
//                                (decay: AdamW's 1 − lr·wd; Adam's p is not multiplied)
//   rmsprop_update(p, g, s, a, buf, lr, alpha, weight, eps, wd, momentum)
//                                s′ = s·alpha + (weight·g′)·g′, a′ = lerp(a, g′, weight) (centered; else a = 0),
//                                avg = √(s′ − a′·a′) + eps; with momentum buf′ = momentum·buf + g′/avg,
//                                p′ = p − lr·buf′, else p′ = p − (lr·g′)/avg
//   adagrad_update(p, g, s, step_size, eps, wd)
//                                s′ = s + g′·g′, p′ = p − (step_size·g′)/(√s′ + eps)
//   adamax_update(p, g, m, u, weight1, beta2, step_size, eps, wd)
//                                m′ = lerp(m, g′, weight1), u′ = maximum(u·beta2, |g′| + eps) (NaN where either is),
//                                p′ = p − (step_size·m′)/u′
//   nadam_update(p, g, m, v, weight1, beta2, weight2, bias_correction2, eps, grad_step_size, momentum_step_size, wd, decay)
//                                m′, v′ as Adam's of g′, d = √(v′/bias_correction2) + eps,
//                                p′ = (p·decay − (grad_step_size·g′)/d) − (momentum_step_size·m′)/d (decoupled
//                                weight decay: wd = 0 and decay = 1 − lr·wd; L2: decay = 1)
//   radam_update(p, g, m, v, weight1, beta2, weight2, lr, bias_correction1, bias_correction2_sqrt, eps, rectification,
//                wd, decay)      g′, m′, v′ as NAdam's, s = (m′/bias_correction1)·lr, where rectification > 0
//                                s = (s·((1/(√v′ + eps))·bias_correction2_sqrt))·rectification; p′ = p·decay − s
//   adadelta_update(p, g, s, acc, lr, rho, weight, eps, wd)
//                                s′ = s·rho + (weight·g′)·g′, δ = (√(acc + eps)/√(s′ + eps))·g′,
//                                acc′ = acc·rho + (weight·δ)·δ, p′ = p − lr·δ
//
// lerp(a, b, w) is torch's: a + w·(b − a) below 0.5, b − (b − a)·(1 − w) from 0.5 on. Each
// formula is written as shaders/optimizer.wgsl writes the single-tensor kernels (the same
// operations in the same order), so the fused update gives the same bits as the moment and step
// kernels one after another. The scalars torch computes in Python double (Adam's step_size =
// lr/(1 − β₁ᵗ) and bias_correction2_sqrt, the weights 1 − β, decay, Adagrad's decayed rate,
// NAdam's step sizes, RAdam's rectification) come computed in the group's vector: nothing here
// takes a power or forms 1 − β in f32.
//
// Members: the parameters one dispatch updates (one for a plain fused update; many for a
// multi-tensor update). The hyper-parameters are operands like the others (elements of their
// parameter group's vector, which the runtime writes before a step, read at literal offsets):
// each member's case passes its own group's, so members of different groups share a kernel, and
// each group's vector is one binding. A state a form lacks (AMSGrad's vmax, RMSprop's a and buf)
// is the literal 0 and its result is not stored. Member k owns a contiguous range of
// workgroups, one per 256 of its elements; MEMBER_OF (a binary search over the ranges' first
// workgroups, generated as nested ifs with literal bounds) finds the member of a workgroup,
// and the member's case of the switch updates its elements. Each case names its own buffers:
// WGSL cannot index a set of bindings at run time.
// Bindings (group 0, generated from the KernelSpec): the buffers read (gradients, each group's
// hyper-parameter vector, and the old values of updates that do not run in place: x0, x1…),
// then every result's buffer (read_write; in place it holds the old value on entry, so the case
// reads it there). A fused Adam update in place binds 5: the gradient, the vector, p, m and v.
// Grid: the members' workgroups in total, folded into (GRID_X, y).
//
// Placeholders: BINDINGS, GRID_X, MEMBER_OF (the body of member_of), CASES (the switch's
// cases); flags SGD_UPDATE, ADAM_UPDATE, RMSPROP_UPDATE, ADAGRAD_UPDATE, ADAMAX_UPDATE,
// NADAM_UPDATE, RADAM_UPDATE, ADADELTA_UPDATE pick the formula, HAS_MOMENTUM (SGD, RMSprop: a
// momentum buffer), NESTEROV (SGD), L2 (Adam: weight decay added to the gradient, not decoupled
// as AdamW's), AMSGRAD (Adam) and CENTERED (RMSprop) the terms present.

{{BINDINGS}}

const GRID_X: u32 = {{GRID_X}}u;

fn lerp(start: f32, end: f32, weight: f32) -> f32 {
    return select(end - (end - start) * (1.0 - weight), start + weight * (end - start), weight < 0.5);
}

//#if SGD_UPDATE
//#if HAS_MOMENTUM
struct Updated {
    p: f32,
    buf: f32,
}

fn update(p: f32, grad: f32, lr: f32, weight_decay: f32, momentum: f32, dampening: f32, buf: f32) -> Updated {
    let new_buf = momentum * buf + dampening * (grad + weight_decay * p);
//#if NESTEROV
    let d = (grad + weight_decay * p) + momentum * new_buf;
//#else
    let d = new_buf;
//#endif
    return Updated(p - lr * d, new_buf);
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
    vmax: f32,
}

fn update(
    p: f32, grad: f32, m: f32, v: f32, vmax: f32, weight1: f32, beta2: f32, weight2: f32, step_size: f32,
    bias_correction2_sqrt: f32, eps: f32, weight_decay: f32, decay: f32,
) -> Updated {
//#if L2
    let g = grad + weight_decay * p;
    let decayed = p;
//#else
    let g = grad;
    let decayed = p * decay;
//#endif
    let new_m = lerp(m, g, weight1);
    let new_v = v * beta2 + (weight2 * g) * g;
//#if AMSGRAD
    let denominator = select(new_v, vmax, new_v < vmax);
//#else
    let denominator = new_v;
//#endif
    let new_p = decayed - (step_size * new_m) / (sqrt(denominator) / bias_correction2_sqrt + eps);
    return Updated(new_p, new_m, new_v, denominator);
}
//#endif

//#if RMSPROP_UPDATE
struct Updated {
    p: f32,
    s: f32,
    a: f32,
    buf: f32,
}

fn update(
    p: f32, grad: f32, s: f32, a: f32, buf: f32, lr: f32, alpha: f32, weight: f32, eps: f32, weight_decay: f32,
    momentum: f32,
) -> Updated {
    let g = grad + weight_decay * p;
    let new_s = s * alpha + (weight * g) * g;
//#if CENTERED
    let new_a = lerp(a, g, weight);
//#else
    let new_a = 0.0;
//#endif
    let avg = sqrt(new_s - new_a * new_a) + eps;
//#if HAS_MOMENTUM
    let new_buf = momentum * buf + g / avg;
    return Updated(p - lr * new_buf, new_s, new_a, new_buf);
//#else
    return Updated(p - (lr * g) / avg, new_s, new_a, buf);
//#endif
}
//#endif

//#if ADAGRAD_UPDATE
struct Updated {
    p: f32,
    s: f32,
}

fn update(p: f32, grad: f32, s: f32, step_size: f32, eps: f32, weight_decay: f32) -> Updated {
    let g = grad + weight_decay * p;
    let new_s = s + g * g;
    return Updated(p - (step_size * g) / (sqrt(new_s) + eps), new_s);
}
//#endif

//#if ADAMAX_UPDATE
struct Updated {
    p: f32,
    m: f32,
    u: f32,
}

// NaN is told from the bits: WGSL lets a compiler fold x != x to false.
fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

fn update(
    p: f32, grad: f32, m: f32, u: f32, weight1: f32, beta2: f32, step_size: f32, eps: f32, weight_decay: f32,
) -> Updated {
    let g = grad + weight_decay * p;
    let new_m = lerp(m, g, weight1);
    let decayed = u * beta2;
    let norm = abs(g) + eps;
    let new_u = select(max(decayed, norm), decayed + norm, is_nan(decayed) || is_nan(norm));
    return Updated(p - (step_size * new_m) / new_u, new_m, new_u);
}
//#endif

//#if NADAM_UPDATE
struct Updated {
    p: f32,
    m: f32,
    v: f32,
}

fn update(
    p: f32, grad: f32, m: f32, v: f32, weight1: f32, beta2: f32, weight2: f32, bias_correction2: f32, eps: f32,
    grad_step_size: f32, momentum_step_size: f32, weight_decay: f32, decay: f32,
) -> Updated {
    let g = grad + weight_decay * p;
    let decayed = p * decay;
    let new_m = lerp(m, g, weight1);
    let new_v = v * beta2 + (weight2 * g) * g;
    let denominator = sqrt(new_v / bias_correction2) + eps;
    let half = decayed - (grad_step_size * g) / denominator;
    return Updated(half - (momentum_step_size * new_m) / denominator, new_m, new_v);
}
//#endif

//#if RADAM_UPDATE
struct Updated {
    p: f32,
    m: f32,
    v: f32,
}

fn update(
    p: f32, grad: f32, m: f32, v: f32, weight1: f32, beta2: f32, weight2: f32, lr: f32, bias_correction1: f32,
    bias_correction2_sqrt: f32, eps: f32, rectification: f32, weight_decay: f32, decay: f32,
) -> Updated {
    let g = grad + weight_decay * p;
    let decayed = p * decay;
    let new_m = lerp(m, g, weight1);
    let new_v = v * beta2 + (weight2 * g) * g;
    let step = (new_m / bias_correction1) * lr;
    let adaptive = (1.0 / (sqrt(new_v) + eps)) * bias_correction2_sqrt;
    let new_p = decayed - select(step, (step * adaptive) * rectification, rectification > 0.0);
    return Updated(new_p, new_m, new_v);
}
//#endif

//#if ADADELTA_UPDATE
struct Updated {
    p: f32,
    s: f32,
    acc: f32,
}

fn update(
    p: f32, grad: f32, s: f32, acc: f32, lr: f32, rho: f32, weight: f32, eps: f32, weight_decay: f32,
) -> Updated {
    let g = grad + weight_decay * p;
    let new_s = s * rho + (weight * g) * g;
    let delta = (sqrt(acc + eps) / sqrt(new_s + eps)) * g;
    let new_acc = acc * rho + (weight * delta) * delta;
    return Updated(p - lr * delta, new_s, new_acc);
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
