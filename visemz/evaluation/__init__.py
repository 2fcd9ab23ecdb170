"""Rate-distortion evaluation: visemz against the codecs users would otherwise pick.

Nothing here is imported by ``import visemz``; the evaluation's own dependencies (piq,
pysz, zfpy, matplotlib, scipy) load only when a function that needs them runs.
"""

from __future__ import annotations


def __getattr__(name):
    if name in ("EvalConfig", "evaluate"):
        from . import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'visemz.evaluation' has no attribute {name!r}")


__all__ = ["EvalConfig", "evaluate"]
