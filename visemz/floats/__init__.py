"""Float codecs on the shared block encoder: ``ErrorBounded`` and ``Lossless`` for fp32, fp16 and bf16,
and the homomorphic ``add`` of two error-bounded streams.

NumPy on the CPU; CUDA tensors and cupy arrays on the GPU (``gpu.py``, kernels in ``cuda/floats.cu``)
into the same bytes.  The compressed collectives (``visemz.collectives``) and the numcodecs codecs
(``visemz.zarr_codecs``) both use them.

- ``dtypes.py``: the float formats (bit layouts, NumPy views, float64 conversions)
- ``checksum.py``: the u64 checksum after a stream's fixed header
- ``prediction.py``: the error-bounded codec's predictors (none, 1-D and 2-D Lorenzo)
- ``error_bounded.py``, ``lossless.py``: the codecs and their streams (docs/FORMAT.md)
- ``homomorphic.py``: the sum of two error-bounded streams on their integers (NumPy reference)
- ``gpu.py``: the codecs and the add on the GPU, and the device-resident streams the collectives move
"""

from .error_bounded import ErrorBounded
from .homomorphic import add
from .lossless import Lossless

__all__ = ["ErrorBounded", "Lossless", "add"]
