"""The one table of runtime defaults.

Each default can be overridden by the environment variable named beside it.
Values are read once, at import, into a frozen dataclass.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

from .errors import InvalidArgumentError


@dataclass(frozen=True)
class Defaults:
    #: "auto" uses the GPU when cupy sees one, else the CPU; or "cpu" / "cuda".
    device: str = "auto"  # VISEMZ_DEVICE
    #: Uncompressed bytes per zstd/ANS frame of the entropy stage.
    #: 64 KiB gives nvCOMP's batched zstd enough chunks to fill a GPU.
    entropy_chunk: int = 1 << 16  # VISEMZ_ENTROPY_CHUNK
    #: zstd level on the CPU (nvCOMP's GPU zstd has no level).
    zstd_level: int = 3  # VISEMZ_ZSTD_LEVEL
    #: CPU threads for zstd and loaders; 0 means os.cpu_count().
    threads: int = 0  # VISEMZ_THREADS


_ENV = {f.name: "VISEMZ_" + f.name.upper() for f in fields(Defaults)}


def _from_env() -> Defaults:
    values = {}
    for f in fields(Defaults):
        raw = os.environ.get(_ENV[f.name])
        if raw is None:
            continue
        try:
            values[f.name] = type(f.default)(raw)
        except ValueError:
            raise InvalidArgumentError(f"{_ENV[f.name]}={raw!r} is not a valid {type(f.default).__name__}") from None
    d = Defaults(**values)
    if d.device not in ("auto", "cpu", "cuda"):
        raise InvalidArgumentError(f"VISEMZ_DEVICE={d.device!r}: expected auto, cpu or cuda")
    if not (4096 <= d.entropy_chunk <= (16 << 20)):
        raise InvalidArgumentError(f"VISEMZ_ENTROPY_CHUNK={d.entropy_chunk}: expected 4096..16777216")
    return d


DEFAULTS = _from_env()


def cpu_threads() -> int:
    return DEFAULTS.threads or (os.cpu_count() or 1)
