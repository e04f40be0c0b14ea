"""The op set: every IR op, declared once in the module of its family (see `ir/op.py`).

Importing this package registers every op in `meganeura.ir.op.OPS`; nothing else adds ops.

| family | module | ops |
|---|---|---|
| leaves | `leaves.py` | input, param, state, const, causal_mask |
| elementwise | `elementwise.py` | one op per function of `ir/functions.py`; pointwise (fused) |
| shape | `shape.py` | reshape, broadcast_to, permute, slice, slice_grad, concat, result, element |
| reduce | `reduce.py` | sum, max; fused_reduce (fused) |
| matmul | `matmul.py` | matmul; fused_matmul (fused) |
| matmul | `halves.py` | split_halves, split_matmul (tensor cores; made after extraction) |
| rows | `rows.py` | softmax, log_softmax and their gradients; cross_entropy_rows(_grad) |
| indexing | `indexing.py` | pick, scatter_rows, gather, scatter_add |
| optimizer | `optimizer.py` | the single-tensor updates (sgd_step, adam_moment, nadam_step…); *_update (fused) |
| transformer | `transformer.py` | rope, rope_grad, attention, attention_grad_q, attention_grad_kv |
| image | `image.py` | unfold, fold, max/avg/adaptive_max pools + gradients, adaptive_pool_matrix; conv_gemm (fused) |
| random | `random.py` | rand, philox (Philox4x32-10 random tensors; philox is made by the e-graph) |
| recurrent | `recurrent.py` | lstm_cell, gru_cell and their gradients (one time step's elementwise part) |
| image | `winograd.py` | winograd_input/weight/output, winograd_gradient/weight_gradient (made by the e-graph) |
| constants | `constants.py` | arange, constant (arrays known at trace time: leaves uploaded once) |
| select | `select.py` | cast, flip, cumsum/cumprod(_grad), gather_axis/scatter_axis_add, flat_index, arg_reduce, topk |
"""

from meganeura.ir.ops import (  # noqa: F401  (imported for their declarations)
    constants,
    elementwise,
    halves,
    image,
    indexing,
    leaves,
    matmul,
    optimizer,
    random,
    recurrent,
    reduce,
    rows,
    select,
    shape,
    transformer,
    winograd,
)
