// multi_top.wgsl: the partial maxima of |x| of several tensors in one dispatch (the tops of the
// weights' splits, split_halves.wgsl). The generator is codegen/matmul_halves.py. Member i's
// tensor x_i is PARTS_i rows of ROW_i; a workgroup takes a row, its threads walk it and reduce
// their maxima through workgroup memory. MEMBERS: each member's code, for the workgroups `w` in
// its range. Bindings: each member's x (f32) and output (f32). Placeholders: BINDINGS, GRID_X,
// MEMBERS.
{{BINDINGS}}

const WG: u32 = 256u;
//#include workgroup_combine


@compute @workgroup_size(256, 1, 1)
fn multi_top(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let w = wid.x + wid.y * {{GRID_X}}u;
    {{MEMBERS}}
}
