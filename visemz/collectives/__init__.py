"""Compressed collectives: the float codecs' streams moved between ranks, sums reduced homomorphically.

The collectives over torch.distributed (Gloo with CPU tensors, NCCL with CUDA tensors) with the
float codecs of ``visemz.floats`` (``ErrorBounded``, ``Lossless`` and the homomorphic ``add``, all
three public here too); ``all_reduce(algorithm="auto")`` chooses with a cost model calibrated on the
group (``CostModel``, ``autotune.py``).
"""

from ..floats import ErrorBounded, Lossless, add
from .cost import CostModel
from .ddp import ddp_hook
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
