// attention_dropout.wgsl: a snippet, not a kernel. Included by the attention kernels
// (attention.wgsl, attention_rows.wgsl): the dropout of the attention weights, drawn where a
// kernel needs it, never stored (ir/ops/transformer.py `dropout_keep`). The weight of query row
// `row` (= (b·H + h)·SQ + i) and key j is kept where 16-bit half j % 8 (low half of word 0 first)
// of philox((row·KEY_GROUPS + j / 8, STREAM, step lo, step hi), seed) is at or above THRESHOLD
// (⌈p·2¹⁶⌉), and is then scaled by DROP_SCALE (1/(1 − p)). Without DROPOUT every weight is kept
// unscaled (the factor 1.0 folds away).
// Binding (DROPOUT): state, the RNG state leaf i32[4]. Placeholders: STREAM, THRESHOLD, DROP_SCALE.

//#if DROPOUT
const STREAM: u32 = {{STREAM}}u;
const THRESHOLD: u32 = {{THRESHOLD}}u;
const DROP_SCALE: f32 = {{DROP_SCALE}};
const KEY_GROUPS: u32 = (SKV + 7u) / 8u;

// Bit c set where key 8·group + c of query row `row` is kept: one Philox call for eight keys.
fn keep_bits(row: u32, group: u32) -> u32 {
    let words = bitcast<vec4<u32>>(vec4<i32>(state[0], state[1], state[2], state[3]));
    let bits = mn_random_bits(words, STREAM, row * KEY_GROUPS + group);
    let low = (bits & vec4<u32>(0xffffu)) >= vec4<u32>(THRESHOLD);  // keys 0, 2, 4, 6
    let high = (bits >> vec4<u32>(16u)) >= vec4<u32>(THRESHOLD);  // keys 1, 3, 5, 7
    return dot(select(vec4<u32>(0u), vec4<u32>(1u, 4u, 16u, 64u), low), vec4<u32>(1u))
        | dot(select(vec4<u32>(0u), vec4<u32>(2u, 8u, 32u, 128u), high), vec4<u32>(1u));
}

// The factor of query row `row`'s weight of key j: 0 or DROP_SCALE.
fn drop_factor(row: u32, j: u32) -> f32 {
    return select(0.0, DROP_SCALE, ((keep_bits(row, j / 8u) >> (j % 8u)) & 1u) != 0u);
}
//#else
fn drop_factor(row: u32, j: u32) -> f32 {
    return 1.0;
}
//#endif
