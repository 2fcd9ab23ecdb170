"""visemz: GPU-first compression for scientific images and tensors.

``import visemz`` is light: the codec (torch, CompressAI, the models) loads when ``compress``,
``decompress`` or ``ImageCodec`` is first used, so the ``visemz`` command answers ``--help``,
usage errors, ``version`` and ``info`` without it.  ``visemz.defaults`` (the runtime settings:
``get``, ``set``) loads on first use too, and reads the VISEMZ_* environment variables then.
"""

from .errors import (
    CorruptStreamError,
    DeviceUnavailableError,
    InvalidArgumentError,
    LimitExceededError,
    UnsupportedFormatError,
    VisemzError,
)

__version__ = "0.1.0"  # the one place it is written: pyproject.toml reads it (statically, without importing)

# public name -> the module that defines it, imported on first use (PEP 562)
_LAZY = {"compress": "api", "decompress": "api", "ImageCodec": "image.codec"}
_SUBMODULES = ("defaults",)  # public modules, imported on first use

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
    "defaults",
]


def __getattr__(name: str):
    if name not in _LAZY and name not in _SUBMODULES:
        raise AttributeError(f"module 'visemz' has no attribute {name!r}")
    import importlib

    if name in _SUBMODULES:
        value = importlib.import_module(f".{name}", __name__)
    else:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_SUBMODULES))
