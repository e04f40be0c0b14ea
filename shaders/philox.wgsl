// philox.wgsl: a snippet, not a kernel. The random values of meganeura/ir/ops/random.py, bit for
// bit as its numpy oracle draws them: Philox4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel
// random numbers: as easy as 1, 2, 3", SC'11; the Random123 library), keyed by the seed, of the
// counter (element index, stream, step lo, step hi). `render` (codegen/render.py) appends it to
// every module that calls an `mn_random_` function (codegen/random.py writes those calls).
//
// WGSL has no 32×32→64-bit product: the high word is built from 16-bit halves (`mn_mulhi`);
// the low word is the wrapping u32 product.
// Bindings: none (the RNG state [seed lo, seed hi, step lo, step hi] is passed in as a vec4<u32>).

fn mn_mulhi(a: u32, b: u32) -> u32 {
    let a_lo = a & 0xffffu;
    let a_hi = a >> 16u;
    let b_lo = b & 0xffffu;
    let b_hi = b >> 16u;
    let lo_lo = a_lo * b_lo;
    let hi_lo = a_hi * b_lo;
    let lo_hi = a_lo * b_hi;
    let middle = (lo_lo >> 16u) + (hi_lo & 0xffffu) + (lo_hi & 0xffffu);
    return a_hi * b_hi + (hi_lo >> 16u) + (lo_hi >> 16u) + (middle >> 16u);
}

fn mn_philox4x32_10(counter: vec4<u32>, key: vec2<u32>) -> vec4<u32> {
    var c = counter;
    var k = key;
    for (var r = 0u; r < 10u; r = r + 1u) {
        if (r > 0u) {
            k = k + vec2<u32>(0x9E3779B9u, 0xBB67AE85u);
        }
        let hi0 = mn_mulhi(0xD2511F53u, c.x);
        let hi1 = mn_mulhi(0xCD9E8D57u, c.z);
        c = vec4<u32>(hi1 ^ c.y ^ k.x, 0xCD9E8D57u * c.z, hi0 ^ c.w ^ k.y, 0xD2511F53u * c.x);
    }
    return c;
}

fn mn_random_bits(state: vec4<u32>, stream: u32, index: u32) -> vec4<u32> {
    return mn_philox4x32_10(vec4<u32>(index, stream, state.z, state.w), state.xy);
}

// Uniform in [0, 1) from the top 24 bits (exact in f32).
fn mn_random_uniform(state: vec4<u32>, stream: u32, index: u32) -> f32 {
    let bits = mn_random_bits(state, stream, index);
    return f32(bits.x >> 8u) * 5.9604644775390625e-8;
}

// Standard normal by Box-Muller: sqrt(-2 ln u1) cos(2 pi u2), u1 in (0, 1], u2 in [0, 1).
fn mn_random_normal(state: vec4<u32>, stream: u32, index: u32) -> f32 {
    let bits = mn_random_bits(state, stream, index);
    let u1 = (f32(bits.x >> 8u) + 1.0) * 5.9604644775390625e-8;
    let u2 = f32(bits.y >> 8u) * 5.9604644775390625e-8;
    return sqrt(-2.0 * log(u1)) * cos(6.2831855 * u2);
}
