"""Compressed collectives: float codecs on the shared block encoder, homomorphic reduction.

The codecs (NumPy and GPU), the homomorphic add, and the collectives over torch.distributed
(Gloo with CPU tensors, NCCL with CUDA tensors); ``all_reduce(algorithm="auto")`` chooses with
a cost model calibrated on the group (``CostModel``, ``autotune.py``).
"""

from .codecs import ErrorBounded, Lossless
from .cost import CostModel
from .ddp import ddp_hook
from .homomorphic import add
from .ops import (
           Handle,
           all_gather,
           all_reduce,
           all_to_all,
           broadcast,
           last_algorithm,
           reduce_scatter,
           scatter,
)
from .plans import Plan, plan

__all__ = ["CostModel", "ErrorBounded", "Handle", "Lossless", "Plan", "add", "plan", "all_gather", "all_reduce",
           "all_to_all", "broadcast", "ddp_hook", "last_algorithm", "reduce_scatter", "scatter"]
