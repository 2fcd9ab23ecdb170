"""The settings' table: each runtime setting, its type, default, environment variable and rule.

``Defaults`` lists them, each with what it means and why its default is what it is; ``VISEMZ_<NAME>`` in
the environment gives a setting's initial value (``from_env``).  ``check`` is the one rule of a value,
whether it comes from the environment or from a program (``visemz.defaults.set``, which holds the values
in force).
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields

from .errors import InvalidArgumentError


@dataclass(frozen=True)
class Defaults:
    #: "auto" uses the GPU when cupy sees one, else the CPU; or "cpu" / "cuda".
    device: str = "auto"  # VISEMZ_DEVICE
    #: Uncompressed bytes per zstd/ANS frame of the entropy stage.  nvCOMP's zstd compresses a
    #: frame serially, so its time grows with the frame: on an H100, 16 KiB frames made a Kodak
    #: image's compress 2.2x faster than 64 KiB ones for 0.7% more bytes (visemz.benchmarks.profile_codec).
    entropy_chunk: int = 1 << 14  # VISEMZ_ENTROPY_CHUNK
    #: 1: on a GPU, the entropy stage puts the zstd chunks of every ints stream of a frame or more of a
    #: call, and of the calls other threads (pipeline lanes) make meanwhile, into one nvCOMP launch on a
    #: stream of its own (``encoders/grouping.py``; ANS streams are always launched alone); 0: one
    #: launch per ints stream on the caller's stream.  The zstd bytes are the same either way.
    entropy_batch: int = 1  # VISEMZ_ENTROPY_BATCH
    #: zstd level on the CPU (nvCOMP's GPU zstd has no level).
    zstd_level: int = 3  # VISEMZ_ZSTD_LEVEL
    #: CPU threads for zstd and loaders; 0 means os.cpu_count().
    threads: int = 0  # VISEMZ_THREADS
    #: Folder jobs: parallel compute workers, each with its own CUDA stream on a GPU.
    #: 0 means automatic: one per 16 streaming multiprocessors (2..8) on a GPU, one per core on a CPU.
    streams: int = 0  # VISEMZ_STREAMS
    #: Folder compression (``visemz compress``): worker processes on this host, each a shard of the folder and
    #: the GPU rank mod count (``pipeline/processes.py``).  One process's streams share its interpreter lock,
    #: and a GPU image's compress is mostly host work: processes scale where streams do not.
    processes: int = 1  # VISEMZ_PROCESSES
    #: Folder jobs: how images are read, "auto", "dali", "kvikio" or "cpu" (docs: README, folders).
    loader: str = "auto"  # VISEMZ_LOADER
    #: Folder jobs: items waiting between two stages; 0 means twice the number of streams.
    queue_depth: int = 0  # VISEMZ_QUEUE_DEPTH
    #: Folder jobs: images per DALI decoding batch (the DALI loader).
    dali_batch: int = 16  # VISEMZ_DALI_BATCH
    #: Collectives: the two sizes (KiB) at which all_reduce(algorithm="auto") times every algorithm, once per
    #: group and codec setting, for GPU tensors; CPU tensors use 1/64 of them (collectives/autotune.py).
    #: The larger is above a GPU's L2 cache (50-60 MB on H100/H200) and far enough from the smaller that
    #: the per-byte costs are not lost in millisecond host jitter: with 32 MiB, a four-H200 calibration
    #: put recursive doubling at 4.3 ms for 1 GiB over NVLink (it took 14.1 ms) and auto ran it at
    #: 0.37x NCCL (docs/results/collectives/auto_replay.txt).  About
    #: 2 GB of device memory at the larger size, for the calibration only.
    collective_calibration_kib: str = "1024,262144"  # VISEMZ_COLLECTIVE_CALIBRATION_KIB
    #: Collectives on GPUs: error-bounded ring and recursive-doubling steps whose chunk's worst-case stream
    #: is at most this many KiB send that whole buffer with its length words in the same transfer
    #: (``transport.InBand``), so no step waits for a host read of a size; the unused bytes cost link time
    #: instead.  Measured on four H100 with 0 and 2048 alternated in one run
    #: (docs/results/collectives/inband.json): 1 and 4 MiB all_reduce through a plan, ring and
    #: recursive doubling, 0.74-1.18x the time over NVLink and 0.83-0.97x over sockets (NCCL's own call
    #: moved 0.73-1.14x between the same runs).  2048 covers the doubling of a 1 MiB float32 tensor (a room
    #: of 1.01 MiB).  0: every step sized.
    collective_inband_kib: int = 2048  # VISEMZ_COLLECTIVE_INBAND_KIB
    #: Conditional rANS: code bytes per lane.  A lane costs about 3.5 bytes (its final state), so
    #: 512 keeps that under 1%; fewer bytes per lane means more lanes, hence more GPU parallelism.
    rans_lane_bytes: int = 512  # VISEMZ_RANS_LANE_BYTES
    #: Conditional rANS: at most this many symbols per lane (bounds the sequential steps of a lane).
    rans_lane_symbols: int = 16384  # VISEMZ_RANS_LANE_SYMBOLS
    #: Conditional rANS: at most this many symbols per lane of a hyper-latent (z).  Its decode precedes
    #: y's (y's tables come from it), so its lanes' steps are latency on every image, and a hyper-latent
    #: is small: a Kodak image's 12,288 symbols in 12 lanes instead of 2-3 cost about 35 bytes.
    rans_hyper_lane_symbols: int = 1024  # VISEMZ_RANS_HYPER_LANE_SYMBOLS
    #: Conditional rANS: skip from the lanes every symbol whose table gives the value 0 at least this
    #: frequency (of 65536), i.e. a 0 that is nearly certain, and list the rare non-zero ones instead
    #: (stream version 3; 0 writes version 2, skipping none).  Such symbols cost next to no bits but a
    #: sequential step each: 65531 (the two narrowest Gaussian scales, a factorized prior's unused
    #: channels) left 0.43x of y's steps at quality 1 on Kodak for the same bytes (CPU,
    #: docs/results/codec/rans_skip.jsonl).  0 because on a GPU it costs more than it saves (H200,
    #: docs/results/codec/rans_skip.jsonl: the rANS sections' encode + decode 0.84x at Kodak
    #: quality 1, 1.22-1.62x at 3-8: version 3 adds host waits per section); opt in for CPU
    #: coding (0.48x the time at quality 1) or the X-rays' bytes (0.90-0.98x at quality 1).
    rans_skip_freq: int = 0  # VISEMZ_RANS_SKIP_FREQ
    #: Image codec: core tile size in pixels (a multiple of 64 in 64..32768: ``tiling.check_tile``).  An
    #: image larger than one tile is compressed tile by tile (image formats 4 and 5), so GPU memory follows the
    #: tile batch, not the image.
    #: 4096 because every tile carries its own hyperprior and coding (measured, CPU, mbt2018-mean,
    #: a 1538x2493 X-ray: tiles of 1024 took 1.12-1.46x the bytes of one tile) and the network runs
    #: faster on large windows (H200, visemz.benchmarks.tiles: 48 Mpx/s in tiles of 1024, 127 Mpx/s
    #: for a 4096x4096 image at 6.3 GB peak): images up to 4096 square stay one tile.
    tile: int = 4096  # VISEMZ_TILE
    #: Image codec: tiles per batch through the network (peak GPU memory grows with it: one tile
    #: of 4096 peaked at 6.3 GB on the H200).
    tile_batch: int = 1  # VISEMZ_TILE_BATCH
    #: Image codec: encoder-side latent refinement steps (``visemz/image/refine.py``; 0: off).  Each step is a
    #: forward and backward pass of the synthesis (and hyper-synthesis) on the image: encoding costs
    #: far more, decoding nothing, and the file format is unchanged.
    refine: int = 0  # VISEMZ_REFINE
    #: Image codec on a GPU: 1 runs the float32 networks (analysis, and the synthesis of files without
    #: max_error) with TF32 convolutions, 0 in full float32.  Measured (visemz.benchmarks.network, quality 4):
    #: analysis 1.4-2.0x (H100) and 2.9x (H200), synthesis 1.9-2.7x faster on Kodak, 3.1-3.7x on a 1.5k x 2.5k
    #: X-ray; g_s moved by at most 4.5e-4 of the range from a float64 synthesis (within the codec's GPU-CPU
    #: tolerance: one uint8 level, 1e-3 of a uint16 image's range) and 0.01-0.06% of the symbols rounded the
    #: other way (bits only: any symbols decode anywhere).  The float64 parts (the hyperprior's
    #: scales, max_error's synthesis) are untouched.
    tf32: int = 1  # VISEMZ_TF32
    #: Image codec on a GPU: 1 runs the float64 networks' wide convolutions (the residual prior's, and the layers
    #: of the float64 synthesis with 48 or more output channels) as one Triton implicit-GEMM kernel each
    #: (``models/conv64.py``), where Triton is installed; 0 on ATen's im2col + GEMM.  Measured on an H200 (float64,
    #: the layers of a 2048 x 2048 image): the prior's 3 x 3 convolutions 1.8-2.3x, g_s's 5 x 5 transposed
    #: convolution of 128 channels 2.3x, its IGDN 1.3-1.8x faster; a lossless 2048 x 2048 compress took 60-67
    #: ms instead of 89-97.  The same values up to float64 rounding, which the residual coder allows for (that
    #: X-ray's files were byte for byte the same).
    implicit_gemm: int = 1  # VISEMZ_IMPLICIT_GEMM
    #: Image codec on a GPU: CUDA graphs of the networks' passes kept at most (``models/graphs.py``: one per
    #: model, pass, input shape and quality, captured at its first use; least recently used dropped, each on a
    #: capture stream of its own with torch's cuBLAS workspace for it); 0: none, every operator launched from Python.
    graphs: int = 16  # VISEMZ_GRAPHS
    #: Image codec on a GPU: largest input (pixels of the image or tile window) whose passes are graphed.  A
    #: graph keeps its own GPU memory for the activations, about one eager pass's peak.
    graph_pixels: int = 1 << 22  # VISEMZ_GRAPH_PIXELS
    #: Image codec: the most values (H x W x C, and P x H x W x C for a page stack) an image may have, checked
    #: before any work by the encoder and by every decoder against the header's shape (so a small file that
    #: declares a huge image is refused, not allocated).  2^28 (a 16384 x 16384 gray image, 1 GiB of float32)
    #: by default; the format's own ceiling is 2^30 (``pixels.MAX_PIXELS``).
    max_pixels: int = 1 << 28  # VISEMZ_MAX_PIXELS


DEVICES = ("auto", "cpu", "cuda")
LOADERS = ("auto", "dali", "kvikio", "cpu")
MAX_REFINE = 10_000  # refinement steps: beyond this an encode would run for hours, a mistake rather than a wish
MAX_LANE_SYMBOLS = 1 << 20  # rans_layout.MAX_LANE_SYMBOLS: keeps a lane's steps within their limit
MAX_PIXELS = 1 << 30  # pixels.MAX_PIXELS, the format's ceiling on an image's values


def real_number(value) -> bool:
    """Whether ``value`` is a real number, an int or a float (NumPy's too): not a bool (nor NumPy's), a string, None."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def whole_number(value) -> bool:
    """Whether ``value`` is an integer (NumPy's too): not a bool (Python counts bools as ints), a float, None."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_max_error(max_error) -> float | None:
    """None, or ``max_error`` as a float when it is a finite number >= 0 (whether it must be whole depends on the
    image's dtype: ``pixels.check_max_error``), else InvalidArgumentError naming it.  Here, without torch, so that a
    command and the Zarr codec check it before any work."""
    if max_error is None:
        return None
    if not real_number(max_error) or not math.isfinite(max_error) or max_error < 0:
        raise InvalidArgumentError(f"max_error={max_error!r}: expected a finite number >= 0 (0: lossless)")
    return float(max_error)


def check_region(region, shape: tuple[int, ...] | None = None) -> tuple[int, int, int, int]:
    """A region (y0, y1, x0, x1) as four ints: integers (NumPy's too), each window's start before its end and, given
    an image's ``shape`` (H, W, ...), within it; else InvalidArgumentError naming the region.  Here, without torch,
    so that a command checks it before it opens a file."""
    if not isinstance(region, (tuple, list)) or len(region) != 4 or \
            not all(whole_number(v) for v in region):
        raise InvalidArgumentError(f"region={region!r}: expected four integers (y0, y1, x0, x1)")
    y0, y1, x0, x1 = (int(v) for v in region)
    if not (0 <= y0 < y1 and 0 <= x0 < x1):
        raise InvalidArgumentError(f"region={tuple(region)!r} is empty or starts before 0: expected 0 <= y0 < y1 "
                                   "and 0 <= x0 < x1")
    if shape is not None and not (y1 <= shape[0] and x1 <= shape[1]):
        raise InvalidArgumentError(f"region={tuple(region)!r} is outside the {shape[0]} x {shape[1]} image")
    return (y0, y1, x0, x1)


def check_steps(refine) -> int:
    """A refinement step count as an int in 0..MAX_REFINE, or InvalidArgumentError naming the bad value (here,
    beside its limit, so that the CLI checks it before torch loads)."""
    if isinstance(refine, bool) or not isinstance(refine, numbers.Integral) or not 0 <= refine <= MAX_REFINE:
        raise InvalidArgumentError(f"refine={refine!r}: expected a whole number of steps in 0..{MAX_REFINE}")
    return int(refine)


ENV = {f.name: "VISEMZ_" + f.name.upper() for f in fields(Defaults)}
TYPES = {f.name: type(f.default) for f in fields(Defaults)}


def calibration_kib(raw: str) -> tuple[int, int] | None:
    """The two sizes (KiB) of a ``collective_calibration_kib`` value, or None if it is not two, the smaller first."""
    try:
        kib = [int(s) for s in raw.split(",")]
    except ValueError:
        return None
    return (kib[0], kib[1]) if len(kib) == 2 and 0 < kib[0] < kib[1] else None


def _within(lo: int, hi: int | None = None) -> Callable[[int], bool]:
    return lambda v: lo <= v and (hi is None or v <= hi)


MAX_STREAMS = 64  # a folder job's workers in one process (each a thread and, on a GPU, a CUDA stream of its own)
MAX_WORKERS = 1024  # threads, and items waiting between a job's stages: each holds memory, so a bound up front


# setting -> (whether a value is allowed, what is): the rule a value must meet, from the environment or a
# program alike.  A setting that is not here takes any value of its type, except ``tile``, whose rule is the
# writers' and readers' own (``tiling.check_tile``, applied to VISEMZ_TILE when tiling is imported and to a
# program's value by ``defaults.set``): tiling imports the settings, so they cannot import it.
RULES: dict[str, tuple[Callable, str]] = {
    "device": (lambda v: v in DEVICES, "auto, cpu or cuda"),
    "entropy_chunk": (_within(4096, 16 << 20), "4096..16777216"),
    "entropy_batch": (_within(0, 1), "0 or 1"),
    "zstd_level": (_within(-(1 << 17), 22), "-131072..22 (zstd's levels; negative: its fast ones)"),
    "threads": (_within(0, MAX_WORKERS), f"0..{MAX_WORKERS} (0: os.cpu_count())"),
    "streams": (_within(0, MAX_STREAMS), f"0..{MAX_STREAMS} (0: automatic)"),
    "processes": (_within(1, 64), "1..64"),
    "loader": (lambda v: v in LOADERS, "auto, dali, kvikio or cpu"),
    "queue_depth": (_within(0, MAX_WORKERS), f"0..{MAX_WORKERS} (0: twice the streams)"),
    "dali_batch": (_within(1), ">= 1"),
    "collective_calibration_kib": (lambda v: calibration_kib(v) is not None,
                                   "two sizes in KiB, the smaller first (e.g. 1024,262144)"),
    "collective_inband_kib": (_within(0), ">= 0 (0: off)"),
    "rans_lane_bytes": (_within(1), ">= 1"),
    "rans_lane_symbols": (_within(1, MAX_LANE_SYMBOLS), f"1..{MAX_LANE_SYMBOLS}"),
    "rans_hyper_lane_symbols": (_within(1, MAX_LANE_SYMBOLS), f"1..{MAX_LANE_SYMBOLS}"),
    "rans_skip_freq": (_within(0, 1 << 16), "0 (skip none) or a frequency in 1..65536"),
    "tile_batch": (_within(1), ">= 1"),
    "refine": (_within(0, MAX_REFINE), f"0..{MAX_REFINE} refinement steps"),
    "tf32": (_within(0, 1), "0 or 1"),
    "implicit_gemm": (_within(0, 1), "0 or 1"),
    "graphs": (_within(0), ">= 0 (0: none)"),
    "graph_pixels": (_within(0), ">= 0"),
    "max_pixels": (_within(1, MAX_PIXELS), f"1..{MAX_PIXELS} values"),
}


def check(name: str, value, label: str | None = None):
    """``value`` as setting ``name`` holds it, if the setting's type and rule allow it; else InvalidArgumentError
    naming ``label`` (the setting's name unless given) and the value.  An int setting takes integers only, not
    bools or floats, as visemz's other integer arguments do."""
    label = label or name
    kind = TYPES[name]
    if kind is int and (isinstance(value, bool) or not isinstance(value, numbers.Integral)) or \
            kind is str and not isinstance(value, str):
        raise InvalidArgumentError(f"{label}={value!r}: expected {'an integer' if kind is int else 'a string'}")
    value = kind(value)
    test, allowed = RULES.get(name, (None, None))
    if test is not None and not test(value):
        raise InvalidArgumentError(f"{label}={value!r}: expected {allowed}")
    return value


def from_env(environ: Mapping[str, str] = os.environ) -> Defaults:
    """The settings with each VISEMZ_* variable of ``environ`` in place of its default, every value checked
    (InvalidArgumentError naming the variable)."""
    values = {}
    for name, var in ENV.items():
        raw = environ.get(var)
        if raw is None:
            continue
        try:
            value = TYPES[name](raw)
        except ValueError:
            raise InvalidArgumentError(f"{var}={raw!r} is not a valid {TYPES[name].__name__}") from None
        values[name] = check(name, value, var)
    return Defaults(**values)
