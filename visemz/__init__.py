"""visemz: GPU-first compression for scientific images and tensors."""

from .errors import (
    CorruptStreamError,
    DeviceUnavailableError,
    InvalidArgumentError,
    LimitExceededError,
    UnsupportedFormatError,
    VisemzError,
)

__version__ = "0.1.0"


def __getattr__(name):
    # the codec imports torch and compressai: load it on first use, not at import
    if name in ("compress", "decompress", "ImageCodec"):
        from . import codec

        return getattr(codec, name)
    raise AttributeError(f"module 'visemz' has no attribute {name!r}")

__all__ = [
    "VisemzError",
    "CorruptStreamError",
    "UnsupportedFormatError",
    "InvalidArgumentError",
    "DeviceUnavailableError",
    "LimitExceededError",
    "__version__",
    "compress",
    "decompress",
    "ImageCodec",
]
