// optimizer.wgsl: PyTorch's elementwise optimizer updates, one thread per element.
//
//   sgd_step(p, d, lr, wd)                       p − lr·(d + wd·p)
//   momentum_buffer(b, g, p, momentum, wd)        momentum·b + (g + wd·p)
//   adam_moment(m, g, p, beta, wd)                beta·m + (1 − beta)·gᵒʳᵈᵉʳ, with g = g + wd·p
//   adam_step(p, m, v, t, lr, beta1, beta2, eps, wd)
//                                                 p·(1 − lr·wd) − lr/(1 − beta1ᵗ) · m / (√v / √(1 − beta2ᵗ) + eps)
//
// The hyper-parameters are scalar operands (elements of their parameter group's vector, which
// the runtime writes when the optimizer's values change, read at literal offsets; or inlined
// constants), not literals of their values: a new learning rate needs no new pipeline.
//
// The first input is the value being replaced. When it is a parameter or optimizer state that
// the step updates, the kernel runs in place: out (read_write) holds the old value on entry and
// V0 reads it from there, because WebGPU forbids binding one buffer both read-only and
// read_write in one dispatch. Otherwise the first input has its own read binding.
// Bindings (group 0, generated from the KernelSpec): the inputs that are buffers (x0 … x3;
// scalar constants are inlined; the hyper-parameters share one, their group's vector), then out
// (read_write). adam_step's t is a 1-element buffer.
// Grid: NUMEL / 256 workgroups of 256 threads, folded into (GRID_X, y).
//
// Placeholders: BINDINGS, NUMEL, GRID_X, V0 … V8 (f32 expressions of the inputs at `i`); flags SGD_STEP, MOMENTUM_BUFFER, ADAM_MOMENT, ADAM_STEP
// pick the formula.

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
    let weight_decay = {{V4}};
    return momentum * buf + (g + weight_decay * p);
}
//#endif

//#if ADAM_MOMENT
fn update(i: u32) -> f32 {
    let m = {{V0}};
    let beta = {{V3}};
    let g = {{V1}} + {{V4}} * {{V2}};
    return beta * m + (1.0 - beta) * {{G_POWER}};
}
//#endif

//#if ADAM_STEP
fn update(i: u32) -> f32 {
    let p = {{V0}};
    let m = {{V1}};
    let v = {{V2}};
    let t = {{V3}};
    let lr = {{V4}};
    let beta1 = {{V5}};
    let beta2 = {{V6}};
    let eps = {{V7}};
    let weight_decay = {{V8}};
    let bias1 = 1.0 - pow(beta1, t);
    let bias2 = 1.0 - pow(beta2, t);
    return p * (1.0 - lr * weight_decay) - (lr / bias1) * m / (sqrt(v) / sqrt(bias2) + eps);
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
