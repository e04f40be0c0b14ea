// reduce.wgsl: out[o] = epilogue(⊕_r prologue(inputs at (o, r))): sum, max and fused_reduce
// over any set of axes, ⊕ being + or max; with SPLITS > 1, the first level of a two-level
// reduction: out[s, o] = epilogue(⊕ over r in part s), part s being [s·PART, (s+1)·PART) ∩ [0, R).
//
// The generator splits the reduced shape's dims into kept dims (indexed by the output element
// o, in row-major order, which is the output's layout with or without keepdim) and reduced
// dims (indexed by r in [0, R)); each input is read at base(o) + offset(r), its index
// expression through broadcasting (stride 0 along broadcast dims). An item is one value the
// kernel writes: item = s·OUTS + o, its index in out ([SPLITS, OUTS] row-major; SPLITS = 1
// and PART = R for a plain reduction), so neighbouring items are neighbouring outputs of one part.
// Bindings (group 0, generated from the KernelSpec): one read binding per input buffer (x0,
// x1, …; scalar constants are inlined), then out (read_write).
// Four entry points:
// - reduce_tree: one workgroup of WG threads per item; each thread combines a strided slice
//   of its part, then a tree reduction in workgroup memory. For long reductions.
//   Grid: ITEMS workgroups, folded into (GRID_X, y).
// - reduce_columns: COLUMNS neighbouring items per workgroup, WG / COLUMNS threads (lanes) per
//   item, lane l combining elements l, l + LANES, … of the item's part; the lanes' values are
//   then combined in workgroup memory (a tree in lane order). For long reductions over outer
//   dims (column sums) on a CPU, where neighbouring items are neighbouring words: each row of a part is
//   read as COLUMNS contiguous words. Grid: ITEMS / COLUMNS workgroups, folded into (GRID_X, y).
// - reduce_rows: COLUMNS items per workgroup, LANES = WG / COLUMNS neighbouring threads per
//   item, lane l combining elements l, l + LANES, … of the item's part, then the lanes' values
//   in workgroup memory (the same tree as reduce_columns). For short reductions along the
//   innermost dim with many outputs on a GPU (a row dot product over head_dim): a warp reads
//   whole rows, where a thread per row would touch a cache line per thread and load.
//   Grid: ITEMS / COLUMNS workgroups, folded into (GRID_X, y).
// - reduce_serial: one thread per item, or per few items WG apart (SERIAL_BODY, unrolled:
//   codegen/reduce.py `serial_items`), looping over each one's part. For short reductions with
//   many outputs, where neighbouring threads then read neighbouring addresses.
//   Grid: ITEMS / (WG · items a thread) workgroups, folded into (GRID_X, y).
// Either way the order of the additions is fixed by the sizes: results are deterministic.
// With ITEM_TYPE vec4<f32> (a reduction that keeps the innermost dim, a multiple of 4 long, in
// reduce_serial on a GPU: codegen/reduce.py `reduces_vec4s`) an item is four neighbouring outputs,
// each of the four reduced as one alone would be, with 16-byte loads of the inputs that run along
// that dim (an input broadcast along it: one scalar for the four). A reduction over the innermost
// dim alone, a multiple of 4 long, in reduce_rows on a GPU (`rows_vec4s`) walks its rows as vec4s:
// R and r count vec4s, and value_at reduces the four components of one ((x ⊕ y) ⊕ (z ⊕ w)).
//
// Placeholders: BINDINGS, ITEM_TYPE (f32 or vec4<f32>), OUTS, R, SPLITS, PART (⌈R/SPLITS⌉), WG (a power of two), COLUMNS
// (a power of two dividing WG; reduce_rows: items a workgroup), SERIAL_BODY (reduce_serial's unrolled items), GRID_X,
// PART_LOOP (part_value's walk over a part: one accumulator, or reduce_tree's several on a GPU,
// codegen/reduce.py `part_loop`), FUNCTIONS (helpers the expressions call), READS (`let` statements loading the inputs at `o`,
// `r`), PROLOGUE (the item_t value reduced at (o, r)), INIT (the identity of ⊕), COMBINE (⊕ of `a`
// and `b`), EPILOGUE_READS (`let` statements loading the epilogue's extras at the output element
// `o`), EPILOGUE (an item_t expression of `value`, the reduced value, and those extras).

{{BINDINGS}}

const OUTS: u32 = {{OUTS}}u;
const R: u32 = {{R}}u;
const SPLITS: u32 = {{SPLITS}}u;
const PART: u32 = {{PART}}u;
const ITEMS: u32 = OUTS * SPLITS;
const WG: u32 = {{WG}}u;
const GRID_X: u32 = {{GRID_X}}u;
const COLUMNS: u32 = {{COLUMNS}}u;
const LANES: u32 = WG / COLUMNS;
// What an item is: one f32 output, or with VEC4 four neighbouring ones (codegen/reduce.py
// `reduces_vec4s`: OUTS, ITEMS, o and the bindings then count vec4s).
alias item_t = {{ITEM_TYPE}};

var<workgroup> partial: array<item_t, WG>;

{{FUNCTIONS}}

fn value_at(o: u32, r: u32) -> item_t {
    {{READS}}
    return {{PROLOGUE}};
}

fn combine(a: item_t, b: item_t) -> item_t {
    return {{COMBINE}};
}

// What is written for the reduced `value` of item o: the epilogue, whose extras are read at o
// (an epilogue reads extras only without a split, where an item is an output element).
fn finish(o: u32, value: item_t) -> item_t {
    {{EPILOGUE_READS}}
    return {{EPILOGUE}};
}

// The combination of the elements start, start + step, … of item's part ({{INIT}} where none).
fn part_value(item: u32, start: u32, step: u32) -> item_t {
    let o = item % OUTS;
    let first = (item / OUTS) * PART;
    let end = min(first + PART, R);
    {{PART_LOOP}}
}

// After every thread wrote partial[lid]: partial[c] (c < stride) becomes the combination of the
// `lanes` values partial[c + l·stride], in a tree of fixed order. Every thread calls it.
fn fold_lanes(lid: u32, lanes: u32, stride: u32) {
    workgroupBarrier();
    let lane = lid / stride;
    for (var half = lanes / 2u; half > 0u; half >>= 1u) {
        if (lane < half) {
            partial[lid] = combine(partial[lid], partial[lid + half * stride]);
        }
        workgroupBarrier();
    }
}

@compute @workgroup_size(WG)
fn reduce_tree(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let item = wid.x + wid.y * GRID_X;
    var acc = {{INIT}};
    if (item < ITEMS) {
        acc = part_value(item, lid, WG);
    }
    partial[lid] = acc;
    fold_lanes(lid, WG, 1u);
    if (lid == 0u && item < ITEMS) {
        out[item] = finish(item, partial[0]);
    }
}

@compute @workgroup_size(WG)
fn reduce_columns(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let item = (wid.x + wid.y * GRID_X) * COLUMNS + lid % COLUMNS;
    var acc = {{INIT}};
    if (item < ITEMS) {
        acc = part_value(item, lid / COLUMNS, LANES);
    }
    partial[lid] = acc;
    fold_lanes(lid, LANES, COLUMNS);
    if (lid < COLUMNS && item < ITEMS) {
        out[item] = finish(item, partial[lid]);
    }
}

@compute @workgroup_size(WG)
fn reduce_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let first = (wid.x + wid.y * GRID_X) * COLUMNS;
    let item = first + lid / LANES;
    let lane = lid % LANES;
    var acc = {{INIT}};
    if (item < ITEMS) {
        acc = part_value(item, lane, LANES);
    }
    partial[lane * COLUMNS + lid / LANES] = acc;
    fold_lanes(lid, LANES, COLUMNS);
    if (lid < COLUMNS && first + lid < ITEMS) {
        out[first + lid] = finish(first + lid, partial[lid]);
    }
}

@compute @workgroup_size(WG)
fn reduce_serial(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    {{SERIAL_BODY}}
}
