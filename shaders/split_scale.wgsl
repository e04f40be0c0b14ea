// split_scale.wgsl: a snippet, not a kernel. Included (`//#include split_scale`) by the kernels of
// the split-f16 products (split_halves.wgsl and matmul_halves.wgsl): the
// power-of-two scale that puts a tensor's (or a tile's) largest |x| into [2^13, 2^14), so that
// twice that still fits f16 (its largest 65504); ir/ops/halves.py's `scale_exponent` is the
// interpreter's.
const TOP_EXPONENT: i32 = 13;

fn power_of_two(e: i32) -> f32 {
    return bitcast<f32>(u32(clamp(e, -126, 127) + 127) << 23u);
}

// The exponent e of the scale 2^e for a largest |x| of `top` (within what an f32 power of two
// holds); 0 where it is 0.
fn scale_exponent(top: f32) -> i32 {
    if (top > 0.0) {
        return clamp(TOP_EXPONENT + 1 - frexp(top).exp, -126, 126);
    }
    return 0;
}
