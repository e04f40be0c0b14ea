"""The names of torch.linalg that meganeura has (`mn.linalg.vector_norm`), defined in meganeura/tensor.py."""

from meganeura.pytorch_names import missing_names
from meganeura.tensor import vector_norm

__all__ = ["vector_norm"]

__getattr__ = missing_names(__name__)  # PyTorch names meganeura lacks say what to use (meganeura/pytorch_names.py)
