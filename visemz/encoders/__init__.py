"""integers <-> bytes: the shared block encoder and its entropy stage.

``encode_ints`` / ``decode_ints`` are the public entry points.  NumPy arrays run
on the CPU (the reference in :mod:`reference`); cupy arrays and torch CUDA
tensors run on the GPU (:mod:`gpu`).  Both write identical block streams.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .. import cuda, defaults
from ..errors import CorruptStreamError, InvalidArgumentError
from . import entropy as E
from . import gpu, reference, stream
from . import layout as L

__all__ = ["encode_ints", "encode_ints_many", "start_encode_ints", "decode_ints", "EncoderConfig", "POLICIES",
           "ENTROPIES"]

POLICIES = tuple(L.POLICIES)
ENTROPIES = tuple(E.KINDS)


@dataclass(frozen=True)
class EncoderConfig:
    """How integers are encoded: the three choices ``encode_ints`` takes."""

    policy: str = "global"
    bitshuffle: bool = True
    entropy: str = "zstd"

    def __post_init__(self):
        L.check_policy(self.policy)
        E.check_kind(self.entropy)


def encode_ints(arr, *, policy: str = "global", bitshuffle: bool = True, entropy: str = "zstd") -> bytes:
    """Encode an integer array (any shape, flattened in C order) into an ints stream.

    policy: "global" (one data-dependent width with varied-length outliers; best for
    sparse latents) or "block" (a width per block of 32; best for dense data).
    entropy: "zstd" (CPU or GPU), "ans" (nvCOMP, GPU only) or "none".
    """
    return encode_ints_many([(arr, EncoderConfig(policy, bitshuffle, entropy))])[0]


def encode_ints_many(items) -> list[bytes]:
    """Encode several arrays, each with its own ``EncoderConfig``: ``[(array, cfg), ...]`` -> their ints
    streams, each the bytes ``encode_ints(array, **asdict(cfg))`` writes.

    The GPU arrays among them share their host synchronisations and one entropy launch (nvCOMP
    compresses each chunk alone, so only the launch grouping changes); the CPU ones are encoded
    one by one as ever."""
    return start_encode_ints(items)()


def start_encode_ints(items) -> Callable[[], list[bytes]]:
    """``encode_ints_many`` in two steps: this starts the work and returns a function that gives the bytes.

    For GPU arrays the entropy launch is under way when this returns (on the entropy stage's own
    stream), so the caller's stream can do other work before asking for the bytes: the latent
    sections' rANS coding runs meanwhile.  CPU arrays are encoded before this returns."""
    items = list(items)
    for _, cfg in items:
        if not isinstance(cfg, EncoderConfig):
            raise InvalidArgumentError("encode_ints_many takes (array, EncoderConfig) pairs, not a "
                                       f"{type(cfg).__name__}")
    on_gpu = [i for i, (a, _) in enumerate(items) if cuda.is_gpu_array(a)]
    done = {i: _encode_cpu(a, cfg) for i, (a, cfg) in enumerate(items) if not cuda.is_gpu_array(a)}
    gpu_part = gpu.start_encode_ints([items[i] for i in on_gpu]) if on_gpu else list

    def finish() -> list[bytes]:
        done.update(zip(on_gpu, gpu_part()))
        return [done[i] for i in range(len(items))]

    return finish


def _encode_cpu(arr, cfg: EncoderConfig) -> bytes:
    a = np.asarray(arr)
    L.check_dtype(a.dtype.name)
    L.check_count(a.size)
    raw = reference.encode(a.reshape(-1), L.POLICIES[cfg.policy], cfg.bitshuffle)
    kind = E.KINDS[cfg.entropy]
    chunk = defaults.get("entropy_chunk")  # read once: the frames and the header must agree
    frames = [raw] if kind == E.KINDS["none"] else E.compress_cpu(raw, kind, chunk)
    return stream.pack(len(raw), kind, chunk, frames)


def decode_ints(buf, *, device: str | None = None, count: int | None = None, max_count: int | None = None,
                entropy: str | None = None):
    """Decode an ints stream into a 1-D int32 array.

    device None or "cpu": a NumPy array, decoded on the CPU.  "cuda": a cupy array,
    decoded on the GPU.  "auto": the GPU when one is usable.

    ``count`` (exactly that many values) or ``max_count`` (at most that many): what the reader's shape
    allows; the stream's raw size and its block header's value count are held to it before anything is
    decompressed or allocated (``CorruptStreamError``).  ``entropy``: the one entropy stage the reader's
    format allows (e.g. "none"), or None for any.
    """
    where = cuda.resolve(device or "cpu")
    parsed = stream.parse(buf, count if count is not None else max_count)
    if entropy is not None and parsed.entropy != E.check_kind(entropy):
        raise CorruptStreamError(f"ints stream uses entropy {E.NAMES[parsed.entropy]!r} where only {entropy!r} is "
                                 "allowed")
    if count is not None or max_count is not None:
        declared = stream.declared_count(parsed)
        if declared is not None:
            L.check_declared(declared, count, max_count, "ints stream")
    if where == "cuda":
        out = gpu.decode_ints(parsed)
        L.check_declared(int(out.size), count, max_count, "ints stream")  # ANS: its header is read on the device
        return out
    if parsed.entropy == E.KINDS["none"]:
        raw = parsed.frames[0]
    else:
        raw = E.decompress_cpu(parsed.frames, parsed.entropy, parsed.sizes)
    return reference.decode(raw)
