"""Compressed collectives: float codecs on the shared block encoder, homomorphic reduction.

Built so far: the codecs and the NumPy homomorphic add.  The collectives themselves
(all_reduce, reduce_scatter, ...) over torch.distributed are planned.
"""

from .codecs import ErrorBounded, Lossless
from .homomorphic import add

__all__ = ["ErrorBounded", "Lossless", "add"]
