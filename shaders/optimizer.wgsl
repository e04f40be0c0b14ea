// optimizer.wgsl: PyTorch's elementwise optimizer updates, one thread per element.
//
//   sgd_step(p, d)            p − lr·(d + wd·p)
//   momentum_buffer(b, g, p)  momentum·b + (g + wd·p)
//   adam_moment(m, g, p)      beta·m + (1 − beta)·gᵒʳᵈᵉʳ, with g = g + wd·p
//   adam_step(p, m, v, t)     p·(1 − lr·wd) − lr/(1 − beta1ᵗ) · m / (√v / √(1 − beta2ᵗ) + eps)
//
// The first input is the value being replaced. When it is a parameter or optimizer state that
// the step updates, the kernel runs in place: out (read_write) holds the old value on entry and
// V0 reads it from there, because WebGPU forbids binding one buffer both read-only and
// read_write in one dispatch. Otherwise the first input has its own read binding.
// Bindings (group 0, generated from the KernelSpec): the inputs that are buffers (x0 … x3;
// scalar constants are inlined), then out (read_write). adam_step's t is a 1-element buffer.
// Grid: NUMEL / 256 workgroups of 256 threads, folded into (GRID_X, y).
//
// Placeholders: BINDINGS, NUMEL, GRID_X, V0 … V3 (f32 expressions of the inputs at `i`),
// the hyper-parameters (f32 literals); flags SGD_STEP, MOMENTUM_BUFFER, ADAM_MOMENT, ADAM_STEP
// pick the formula.

{{BINDINGS}}

const NUMEL: u32 = {{NUMEL}}u;
const GRID_X: u32 = {{GRID_X}}u;

//#if SGD_STEP
const LR: f32 = {{LR}};
const WEIGHT_DECAY: f32 = {{WEIGHT_DECAY}};

fn update(i: u32) -> f32 {
    let p = {{V0}};
    let d = {{V1}};
    return p - LR * (d + WEIGHT_DECAY * p);
}
//#endif

//#if MOMENTUM_BUFFER
const MOMENTUM: f32 = {{MOMENTUM}};
const WEIGHT_DECAY: f32 = {{WEIGHT_DECAY}};

fn update(i: u32) -> f32 {
    let buf = {{V0}};
    let g = {{V1}};
    let p = {{V2}};
    return MOMENTUM * buf + (g + WEIGHT_DECAY * p);
}
//#endif

//#if ADAM_MOMENT
const BETA: f32 = {{BETA}};
const WEIGHT_DECAY: f32 = {{WEIGHT_DECAY}};

fn update(i: u32) -> f32 {
    let m = {{V0}};
    let g = {{V1}} + WEIGHT_DECAY * {{V2}};
    return BETA * m + (1.0 - BETA) * {{G_POWER}};
}
//#endif

//#if ADAM_STEP
const LR: f32 = {{LR}};
const BETA1: f32 = {{BETA1}};
const BETA2: f32 = {{BETA2}};
const EPS: f32 = {{EPS}};
const WEIGHT_DECAY: f32 = {{WEIGHT_DECAY}};

fn update(i: u32) -> f32 {
    let p = {{V0}};
    let m = {{V1}};
    let v = {{V2}};
    let t = {{V3}};
    let bias1 = 1.0 - pow(BETA1, t);
    let bias2 = 1.0 - pow(BETA2, t);
    return p * (1.0 - LR * WEIGHT_DECAY) - (LR / bias1) * m / (sqrt(v) / sqrt(bias2) + EPS);
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
