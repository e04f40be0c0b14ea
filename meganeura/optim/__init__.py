"""Optimizers as IR update rules, with exactly PyTorch's update formulas (optimizers.py: SGD, Adam,
AdamW, RMSprop, Adagrad, Adamax, NAdam, RAdam, Adadelta), and PyTorch's learning-rate schedulers
on them (lr_scheduler.py): torch.optim's two halves.

>>> from meganeura import optim
>>> optim.AdamW(lr=1e-3).weight_decay
0.01
"""

from __future__ import annotations

from meganeura.optim import lr_scheduler  # noqa: F401  (optim.lr_scheduler.StepLR, as in torch)
from meganeura.optim.optimizers import (  # noqa: F401
    SGD,
    Adadelta,
    Adagrad,
    Adam,
    Adamax,
    AdamW,
    NAdam,
    Optimizer,
    ParamGrad,
    RAdam,
    RMSprop,
    check_flag,
    check_hyper,
    parameter_groups,
)
from meganeura.pytorch_names import missing_names

__getattr__ = missing_names(__name__)  # PyTorch names meganeura lacks say what to use (meganeura/pytorch_names.py)
