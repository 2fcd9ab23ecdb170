"""The entropy stage: bytes -> a list of independently decodable frames.

zstd runs through nvCOMP on the GPU and through ``zstandard`` on the CPU; both
write plain zstd frames, so either side decodes the other's.  ANS exists only
in nvCOMP (its RAW bitstream), so it needs a GPU both ways.  The block stream
is cut into chunks of ``chunk`` bytes; each chunk becomes one frame.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import zstandard

from .. import defaults
from ..defaults import cpu_threads
from ..errors import CorruptStreamError, DeviceUnavailableError, UnsupportedFormatError

KINDS = {"none": 0, "zstd": 1, "ans": 2}
NAMES = {v: k for k, v in KINDS.items()}


def check_kind(entropy: str) -> int:
    if entropy not in KINDS:
        raise UnsupportedFormatError(f"entropy={entropy!r}: expected one of {sorted(KINDS)}")
    return KINDS[entropy]


def chunk_bounds(size: int, chunk: int) -> list[tuple[int, int]]:
    return [(s, min(s + chunk, size)) for s in range(0, size, chunk)]


def _map(fn, items):
    items = list(items)
    if len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(min(cpu_threads(), len(items))) as pool:  # zstandard releases the GIL
        return list(pool.map(fn, items))


def compress_cpu(raw, kind: int, chunk: int | None = None) -> list[bytes]:
    """``raw`` in zstd frames of ``chunk`` bytes (None: the entropy_chunk setting) at the zstd_level setting."""
    if kind == KINDS["ans"]:
        raise DeviceUnavailableError("entropy='ans' is nvCOMP's GPU-only ANS: it needs a CUDA GPU to encode")
    mv = memoryview(raw).cast("B")
    level = defaults.get("zstd_level")  # read once: every frame of a stream at one level

    def one(bounds):
        return zstandard.ZstdCompressor(level=level).compress(mv[bounds[0] : bounds[1]])

    return _map(one, chunk_bounds(len(mv), defaults.get("entropy_chunk") if chunk is None else chunk))


def decompress_cpu(frames: list[memoryview], kind: int, sizes: list[int]) -> bytes:
    """Frames -> the concatenated chunks, each checked to have its expected size."""
    if kind == KINDS["ans"]:
        raise DeviceUnavailableError("this stream uses entropy='ans' (nvCOMP, GPU-only): decode it with device='cuda'")

    def one(item):
        frame, size = item
        try:
            out = zstandard.ZstdDecompressor().decompress(frame, max_output_size=size)
        except zstandard.ZstdError as e:
            raise CorruptStreamError(f"zstd frame of {len(frame)} bytes does not decode: {e}") from None
        if len(out) != size:
            raise CorruptStreamError(f"zstd frame decoded to {len(out)} bytes, expected {size}")
        return out

    return b"".join(_map(one, zip(frames, sizes)))
