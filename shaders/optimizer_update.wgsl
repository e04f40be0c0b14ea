// optimizer_update.wgsl: the whole optimizer update of one or many parameters in one dispatch.
//
//   sgd_update(p, g[, buf])      d = g + wd·p; with momentum buf′ = momentum·buf + d, d = buf′;
//                                p′ = p − lr·d
//   adam_update(p, g, m, v, t)   g = g + wd·p (Adam's L2 form; not for AdamW), m′ = beta1·m + (1 − beta1)·g,
//                                v′ = beta2·v + (1 − beta2)·g·g,
//                                p′ = p·(1 − lr·decay) − lr/(1 − beta1ᵗ) · m′ / (√v′ / √(1 − beta2ᵗ) + eps)
//                                (decay: AdamW's decoupled weight decay, 0 for Adam)
//
// Each formula is written as shaders/optimizer.wgsl writes the single-tensor kernels (the same
// operations in the same order), so the fused update gives the same bits as the moment and step
// kernels one after another.
//
// Members: the parameters one dispatch updates (one for a plain fused update; many for a
// multi-tensor update, all with the same hyper-parameters). Member k owns a contiguous range of
// workgroups, one per 256 of its elements; MEMBER_OF (a binary search over the ranges' first
// workgroups, generated as nested ifs with literal bounds) finds the member of a workgroup,
// and the member's case of the switch updates its elements. Each case names its own buffers:
// WGSL cannot index a set of bindings at run time.
// Bindings (group 0, generated from the KernelSpec): the buffers read (gradients, the step
// count, and the old values of updates that do not run in place: x0, x1…), then every result's
// buffer (read_write; in place it holds the old value on entry, so the case reads it there).
// Grid: the members' workgroups in total, folded into (GRID_X, y).
//
// Placeholders: BINDINGS, GRID_X, MEMBER_OF (the body of member_of), CASES (the switch's
// cases), the hyper-parameters (f32 literals); flags SGD_UPDATE, ADAM_UPDATE pick the formula,
// HAS_MOMENTUM (SGD) and L2 (Adam: weight decay added to the gradient) the terms present.

{{BINDINGS}}

const GRID_X: u32 = {{GRID_X}}u;

//#if SGD_UPDATE
const LR: f32 = {{LR}};
const WEIGHT_DECAY: f32 = {{WEIGHT_DECAY}};

//#if HAS_MOMENTUM
const MOMENTUM: f32 = {{MOMENTUM}};

struct Updated {
    p: f32,
    buf: f32,
}

fn update(p: f32, g: f32, buf: f32) -> Updated {
    let new_buf = MOMENTUM * buf + (g + WEIGHT_DECAY * p);
    return Updated(p - LR * new_buf, new_buf);
}
//#else
struct Updated {
    p: f32,
}

fn update(p: f32, g: f32) -> Updated {
    return Updated(p - LR * (g + WEIGHT_DECAY * p));
}
//#endif
//#endif

//#if ADAM_UPDATE
const LR: f32 = {{LR}};
const BETA1: f32 = {{BETA1}};
const BETA2: f32 = {{BETA2}};
const EPS: f32 = {{EPS}};
const WEIGHT_DECAY: f32 = {{WEIGHT_DECAY}};
const DECAY: f32 = {{DECAY}};

struct Updated {
    p: f32,
    m: f32,
    v: f32,
}

fn update(p: f32, grad: f32, m: f32, v: f32, t: f32) -> Updated {
//#if L2
    let g = grad + WEIGHT_DECAY * p;
//#else
    let g = grad;
//#endif
    let new_m = BETA1 * m + (1.0 - BETA1) * g;
    let new_v = BETA2 * v + (1.0 - BETA2) * g * g;
    let bias1 = 1.0 - pow(BETA1, t);
    let bias2 = 1.0 - pow(BETA2, t);
    let new_p = p * (1.0 - LR * DECAY) - (LR / bias1) * new_m / (sqrt(new_v) / sqrt(bias2) + EPS);
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
