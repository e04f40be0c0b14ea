// gemm_loop.wgsl: a snippet, not a kernel. Included (`//#include gemm_loop`) in the entry point
// of the register-tiled GEMM kernels (matmul.wgsl, conv_gemm.wgsl; generator
// codegen/matmul.py `gemm_blocks`): the walk over K from kbegin to klimit in steps of BK, staging
// both operand tiles in workgroup memory (tile_a, tile_b) and multiplying them into the named
// accumulators, then the stores of the accumulators.
// Needs, in scope: kbegin, klimit (uniform: the loop holds barriers), and what the generated
// blocks name (m0, n0, tx, ty, lid, bat, obat, the kernel's load functions and `store4`).
// Placeholders: REGISTERS, ACCUMULATORS, LOAD_FIRST, LOAD, LOAD_NEXT, STAGE, MULTIPLY, STORE.
// Flag: PREFETCH (load the next K tile into registers while multiplying this one).
    {{REGISTERS}}
    {{ACCUMULATORS}}
//#if PREFETCH
    {{LOAD_FIRST}}
//#endif
    for (var k0 = kbegin; k0 < klimit; k0 += BK) {
//#if PREFETCH
        {{STAGE}}
        workgroupBarrier();
        if (k0 + BK < klimit) {
            {{LOAD_NEXT}}
        }
//#else
        {{LOAD}}
        {{STAGE}}
        workgroupBarrier();
//#endif
        {{MULTIPLY}}
        workgroupBarrier();
    }
    {{STORE}}
