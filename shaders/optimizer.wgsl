// optimizer.wgsl: PyTorch's elementwise optimizer updates, one thread per element, each float
// operation in the order of torch's single-tensor code (torch/optim/*.py), g′ = g + wd·p:
//
//   sgd_step(p, d, lr, wd)                        p − lr·(d + wd·p)
//   momentum_buffer(b, g, p, momentum, dampening, wd)
//                                                 momentum·b + dampening·g′
//   adam_moment(m, g, p, beta, weight, wd)        order 1: lerp(m, g′, weight) (torch's lerp_: m + weight·(g′ − m)
//                                                 below 0.5, g′ − (g′ − m)·(1 − weight) from 0.5 on);
//                                                 order 2: m·beta + (weight·g′)·g′ (mul_ then addcmul_)
//   adam_step(p, m, v, step_size, bias_correction2_sqrt, eps, decay)
//                                                 p·decay − (step_size·m) / (√v / bias_correction2_sqrt + eps)
//   rms_step(p, g, s, a, lr, eps, wd)             p − (lr·g′) / (√(s − a·a) + eps)
//   rms_buffer(b, g, p, s, a, momentum, eps, wd)  momentum·b + g′ / (√(s − a·a) + eps)
//   adamax_norm(u, g, p, beta2, eps, wd)          maximum(u·beta2, |g′| + eps) (torch.maximum: NaN where either is)
//   adamax_step(p, m, u, step_size)               p − (step_size·m) / u
//   nadam_step(p, g, m, v, grad_step_size, momentum_step_size, bias_correction2, eps, wd, decay)
//                                                 d = √(v / bias_correction2) + eps;
//                                                 (p·decay − (grad_step_size·g′) / d) − (momentum_step_size·m) / d
//   radam_step(p, m, v, lr, bias_correction1, bias_correction2_sqrt, eps, rectification, decay)
//                                                 s = (m / bias_correction1)·lr; where rectification > 0
//                                                 s = (s·((1 / (√v + eps))·bias_correction2_sqrt))·rectification;
//                                                 p·decay − s
//   adadelta_delta(g, p, s, acc, eps, wd)         (√(acc + eps) / √(s + eps))·g′
//
// The hyper-parameters are scalar operands (elements of their parameter group's vector, which
// the runtime writes before a step, read at literal offsets; or inlined constants), not literals
// of their values: a new learning rate needs no new pipeline. The values that torch derives in
// Python double (step_size = lr/(1 − β₁ᵗ), bias_correction2_sqrt, the weights 1 − β, decay =
// 1 − lr·wd) come computed in the vector: nothing here takes a power or forms 1 − β in f32.
//
// The first input is the value being replaced. When it is a parameter or optimizer state that
// the step updates, the kernel runs in place: out (read_write) holds the old value on entry and
// V0 reads it from there, because WebGPU forbids binding one buffer both read-only and
// read_write in one dispatch. Otherwise the first input has its own read binding.
// Bindings (group 0, generated from the KernelSpec): the inputs that are buffers (x0 … x4;
// scalar constants are inlined; the hyper-parameters share one, their group's vector), then out
// (read_write).
// Grid: NUMEL / 256 workgroups of 256 threads, folded into (GRID_X, y).
//
// Placeholders: BINDINGS, NUMEL, GRID_X, V0 … V9 (f32 expressions of the inputs at `i`); flags
// SGD_STEP, MOMENTUM_BUFFER, ADAM_MOMENT (with ORDER1 for the first moment), ADAM_STEP, RMS_STEP,
// RMS_BUFFER, ADAMAX_NORM, ADAMAX_STEP, NADAM_STEP, RADAM_STEP, ADADELTA_DELTA pick the formula.

{{BINDINGS}}

const NUMEL: u32 = {{NUMEL}}u;
const GRID_X: u32 = {{GRID_X}}u;

//#if SGD_STEP
fn update(i: u32) -> f32 {
    let p = {{V0}};
    let d = {{V1}};
    let lr = {{V2}};
    let weight_decay = {{V3}};
    return p - lr * (d + weight_decay * p);
}
//#endif

//#if MOMENTUM_BUFFER
fn update(i: u32) -> f32 {
    let buf = {{V0}};
    let g = {{V1}};
    let p = {{V2}};
    let momentum = {{V3}};
    let dampening = {{V4}};
    let weight_decay = {{V5}};
    return momentum * buf + dampening * (g + weight_decay * p);
}
//#endif

//#if ADAM_MOMENT
fn update(i: u32) -> f32 {
    let m = {{V0}};
    let g = {{V1}} + {{V5}} * {{V2}};
    let weight = {{V4}};
//#if ORDER1
    return select(g - (g - m) * (1.0 - weight), m + weight * (g - m), weight < 0.5);
//#else
    return m * {{V3}} + (weight * g) * g;
//#endif
}
//#endif

//#if ADAM_STEP
fn update(i: u32) -> f32 {
    let p = {{V0}};
    let m = {{V1}};
    let v = {{V2}};
    let step_size = {{V3}};
    let bias_correction2_sqrt = {{V4}};
    let eps = {{V5}};
    let decay = {{V6}};
    return p * decay - (step_size * m) / (sqrt(v) / bias_correction2_sqrt + eps);
}
//#endif

//#if RMS_STEP
fn update(i: u32) -> f32 {
    let p = {{V0}};
    let g = {{V1}} + {{V6}} * p;
    let s = {{V2}};
    let a = {{V3}};
    let lr = {{V4}};
    let eps = {{V5}};
    return p - (lr * g) / (sqrt(s - a * a) + eps);
}
//#endif

//#if RMS_BUFFER
fn update(i: u32) -> f32 {
    let buf = {{V0}};
    let g = {{V1}} + {{V7}} * {{V2}};
    let s = {{V3}};
    let a = {{V4}};
    let momentum = {{V5}};
    let eps = {{V6}};
    return momentum * buf + g / (sqrt(s - a * a) + eps);
}
//#endif

//#if ADAMAX_NORM
// NaN is told from the bits: WGSL lets a compiler fold x != x to false.
fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

fn update(i: u32) -> f32 {
    let decayed = {{V0}} * {{V3}};
    let norm = abs({{V1}} + {{V5}} * {{V2}}) + {{V4}};
    return select(max(decayed, norm), decayed + norm, is_nan(decayed) || is_nan(norm));
}
//#endif

//#if ADAMAX_STEP
fn update(i: u32) -> f32 {
    let p = {{V0}};
    let m = {{V1}};
    let u = {{V2}};
    let step_size = {{V3}};
    return p - (step_size * m) / u;
}
//#endif

//#if NADAM_STEP
fn update(i: u32) -> f32 {
    let p = {{V0}};
    let g = {{V1}} + {{V8}} * p;
    let m = {{V2}};
    let v = {{V3}};
    let denominator = sqrt(v / {{V6}}) + {{V7}};
    let half = p * {{V9}} - ({{V4}} * g) / denominator;
    return half - ({{V5}} * m) / denominator;
}
//#endif

//#if RADAM_STEP
fn update(i: u32) -> f32 {
    let p = {{V0}};
    let m = {{V1}};
    let v = {{V2}};
    let rectification = {{V7}};
    let step = (m / {{V4}}) * {{V3}};
    let adaptive = (1.0 / (sqrt(v) + {{V6}})) * {{V5}};
    return p * {{V8}} - select(step, (step * adaptive) * rectification, rectification > 0.0);
}
//#endif

//#if ADADELTA_DELTA
fn update(i: u32) -> f32 {
    let g = {{V0}} + {{V5}} * {{V1}};
    let eps = {{V4}};
    return (sqrt({{V3}} + eps) / sqrt({{V2}} + eps)) * g;
}
//#endif

@compute @workgroup_size(256)
fn optimizer_update(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * GRID_X) * 256u + lid;
    if (i >= NUMEL) {
        return;
    }
    out[i] = update(i);
}
