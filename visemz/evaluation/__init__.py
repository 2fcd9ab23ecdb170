"""Rate-distortion evaluation: visemz against the codecs users would otherwise pick.

Nothing here is imported by ``import visemz`` (the ``visemz`` command imports it for
``visemz eval``).  Its optional libraries (piq, pysz, zfpy: the ``eval`` extra) are looked up
when this package loads; a codec or metric whose library is missing says so when it is used.
"""

from __future__ import annotations

from .runner import EvalConfig, evaluate

__all__ = ["EvalConfig", "evaluate"]
