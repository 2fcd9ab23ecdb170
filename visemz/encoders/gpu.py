"""The GPU path: block-encoder kernels (cupy RawModule via nvrtc) and nvCOMP entropy.

Everything stays on the device; the host reads back only the final stream size
(encode) or the 24-byte block header and an error word (decode).  The bytes
equal the NumPy reference's for every input (tests/test_gpu_encoder.py).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import os
import threading
from importlib import resources
from typing import Callable, NamedTuple

import numpy as np

from .. import cuda, defaults
from ..errors import CorruptStreamError, DeviceUnavailableError, VisemzError
from . import entropy as E
from . import layout as L
from . import stream
from .grouping import Grouped

THREADS = 256


BLOCK_SOURCE = ("visemz.encoders", "cuda/block.cu")
# block.cuh, the building blocks every kernel source that uses the block stream includes
INCLUDE_DIR = resources.files("visemz.encoders").joinpath("cuda")


@functools.lru_cache(maxsize=None)
def _module(package: str, path: str, device_id: int):
    cp = cuda.require_cupy()
    src = resources.files(package).joinpath(path).read_text()
    with cp.cuda.Device(device_id):  # cupy targets the device's own arch
        return cp.RawModule(code=src, options=("-std=c++17", f"-I{INCLUDE_DIR}"))


def kernel(name: str, source: tuple[str, str] = BLOCK_SOURCE):
    """A kernel of a CUDA source (package, path), compiled with nvrtc once per device: the block
    encoder's by default; other sources (the float codecs' floats.cu) include block.cuh."""
    cp = cuda.require_cupy()
    return _module(*source, cp.cuda.Device().id).get_function(name)


# global_stats output: value, block-min and block-max histograms, then non-zero planes per width
N_STATS = 3 * L.N_CATEGORIES + len(L.GLOBAL_WIDTHS)


class Scratch(NamedTuple):
    """Zeroed scratch of one launch with decoupled look-back (views of the stream's ``Workspace``)."""

    status: object  # uint64 per tile: the look-back's aggregate / prefix words
    stats: object  # uint64[N_STATS]: global_stats' histograms
    out_size: object  # uint64[1]: the stream size the last tile writes
    tile_counter: object  # uint32[1]: tiles take their index from it in launch order


class Workspace:
    """Per-(device, stream) scratch: look-back status words, tile counter, stats and size cells.

    One per stream so that kernels on several streams (the multi-stream pipeline, the
    collectives' parts) never share status words or counters."""

    def __init__(self, cp):
        self.cp = cp
        self.status = cp.zeros(0, cp.uint64)
        # [0, N_STATS) stats | N_STATS: out_size | N_STATS + 1: tile counter (low 32 bits)
        self.small = cp.zeros(N_STATS + 2, cp.uint64)

    def reset(self, ntiles: int) -> Scratch:
        cp = self.cp
        if self.status.size < ntiles:
            self.status = cp.zeros(max(ntiles, 1024), cp.uint64)
        else:
            self.status[:ntiles].fill(0)
        self.small.fill(0)
        s = self.small
        return Scratch(self.status, s[:N_STATS], s[N_STATS : N_STATS + 1], s[N_STATS + 1 : N_STATS + 2].view(cp.uint32))


@functools.lru_cache(maxsize=256)
def _workspace(device_id: int, stream_ptr: int) -> Workspace:
    return Workspace(cuda.require_cupy())


def workspace(ntiles: int) -> Scratch:
    """The current device and stream's scratch, zeroed for a launch over ``ntiles`` tiles.

    Work queued on the stream before still sees the old values: the zeroing is queued after it."""
    cp = cuda.require_cupy()
    return _workspace(cp.cuda.Device().id, cp.cuda.get_current_stream().ptr).reset(ntiles)


def _as_int32(arr):
    cp = cuda.require_cupy()
    a = cuda.as_cupy(arr)
    L.check_dtype(a.dtype.name)
    return cp.ascontiguousarray(a.reshape(-1), dtype=cp.int32)


def sm_count() -> int:
    cp = cuda.require_cupy()
    return _sm_count(cp.cuda.Device().id)


@functools.lru_cache(maxsize=None)
def _sm_count(device_id: int) -> int:
    """Cached: cupy's ``Device.attributes`` queries every attribute of the device on each call."""
    cp = cuda.require_cupy()
    return cp.cuda.Device(device_id).attributes["MultiProcessorCount"]


def global_stats(v, stats) -> None:
    """Histograms for the global width choice, accumulated into ``stats`` (zeroed by the caller)."""
    grid = min(-(-v.size // (THREADS // 32 * 64)), sm_count() * 8)
    kernel("global_stats")((grid,), (THREADS,), (v, np.int64(v.size), stats))


def encode_block_stream(arr, policy: int, bitshuffle: bool):
    """int array on the GPU -> (uint8 cupy buffer of the block stream, its size as a 1-element device array).

    No host synchronisation: the size stays on the device until the caller reads it.
    """
    cp = cuda.require_cupy()
    v = _as_int32(arr)
    n = v.size
    L.check_count(n)
    out = cp.empty(L.max_stream_size(policy, n), cp.uint8)
    if n == 0:
        hdr = L.Header(policy, bitshuffle, 0, 0, 0, 0).pack()
        out[: len(hdr)] = cp.asarray(np.frombuffer(hdr, np.uint8))
        return out, cp.asarray([len(hdr)], cp.uint64)
    ntiles = L.n_tiles(n)
    status, stats, out_size, counter = workspace(ntiles)
    args_tail = (np.int32(bitshuffle), out, status, counter, out_size)
    if policy == L.POLICIES["global"]:
        global_stats(v, stats)
        kernel("global_encode")((ntiles,), (THREADS,), (v, np.int64(n), stats) + args_tail)
    else:
        kernel("block_encode")((ntiles,), (THREADS,), (v, np.int64(n)) + args_tail)
    return out, out_size.copy()


def encode_raw(arr, policy: int, bitshuffle: bool):
    """The block stream as a cupy uint8 array (reads its size: one host sync)."""
    return encode_raws([(arr, policy, bitshuffle)])[0]


def encode_raws(items) -> list:
    """[(array, policy, bitshuffle)] -> their block streams (cupy uint8), all sizes read in one host sync."""
    cp = cuda.require_cupy()
    outs, sizes = zip(*(encode_block_stream(*it) for it in items)) if items else ((), ())
    if not outs:
        return []
    nbytes = (cp.concatenate(sizes) if len(sizes) > 1 else sizes[0]).get().tolist()
    for out, n in zip(outs, nbytes):
        if n > out.size:  # the kernel's look-back gave up (see look_back in block.cuh)
            raise VisemzError(f"GPU block encoder failed (reported size {n:#x})")
    return [out[:n] for out, n in zip(outs, nbytes)]


def decode_block_stream(raw):
    """Block stream on the GPU (cupy uint8) -> int32 cupy array; reads the 24-byte header and an error word."""
    cp = cuda.require_cupy()
    if raw.size < L.HEADER_SIZE:
        raise CorruptStreamError(f"block stream of {raw.size} bytes is shorter than its {L.HEADER_SIZE}-byte header")
    head = memoryview(raw[: L.HEADER_SIZE].get().tobytes())
    hdr = L.parse_header(head, total=raw.size)
    out = cp.empty(hdr.n, cp.int32)
    if hdr.n == 0:
        return out
    err = cp.zeros(1, cp.int32)
    if hdr.policy == L.POLICIES["global"]:
        args = (raw, np.int64(hdr.n), np.uint32(hdr.width), np.int32(hdr.bitshuffle), np.uint32(hdr.payload), out, err)
        kernel("global_decode")((hdr.ntiles,), (THREADS,), args)
    else:
        args = (raw, np.int64(hdr.n), np.int32(hdr.bitshuffle), np.uint32(hdr.payload), out, err)
        kernel("block_decode")((hdr.ntiles,), (THREADS,), args)
    code = int(err.get()[0])
    if code:
        raise CorruptStreamError(f"block stream is inconsistent (GPU decoder error bits 0x{code:x})")
    return out


# ---------------------------------------------------------------- nvCOMP
@functools.lru_cache(maxsize=None)
def _nvcomp():
    try:
        from nvidia import nvcomp
    except ImportError:
        raise DeviceUnavailableError("nvCOMP is not installed: pip install 'visemz[gpu]' "
                                     "(nvidia-nvcomp-cu13)") from None
    _use_cupy_pools(nvcomp, cuda.require_cupy())
    return nvcomp


def _use_cupy_pools(nvcomp, cp) -> None:
    """nvCOMP's scratch and result buffers come from cupy's memory pools (process-wide setting).

    Its own allocator frees every call's buffers with cudaFree / cudaFreeHost, which wait for
    the whole device: each image's entropy stage then stalls every other stream's work.  cupy's
    device pool keeps freed blocks per stream (reused in stream order); its pinned pool is only
    given buffers that nvCOMP reads after a synchronisation."""
    nvcomp.set_device_allocator(lambda nbytes, stream: cp.cuda.alloc(nbytes))
    nvcomp.set_pinned_allocator(lambda nbytes, stream: cp.cuda.alloc_pinned_memory(nbytes))
    atexit.register(_restore_allocators, nvcomp)


def _restore_allocators(nvcomp) -> None:
    """Give nvCOMP back its own allocators before the interpreter goes: it keeps the Python
    callables in C++ statics, and releasing them after Python is finalised is a segfault at exit."""
    _codec.cache_clear()
    gc.collect()  # nvCOMP arrays from our allocator are freed while cupy's pools still exist
    nvcomp.set_device_allocator(None)
    nvcomp.set_pinned_allocator(None)


def _wait(cp) -> None:
    """Wait for this stream's work with the GIL released.

    nvCOMP's arrays learn their sizes by a synchronisation inside the call that reads them,
    which holds the GIL: other pipeline lanes could not even launch work meanwhile."""
    cp.cuda.get_current_stream().synchronize()


@functools.lru_cache(maxsize=64)
def _codec(algorithm: str, device_id: int, stream_ptr: int, thread: int, options: tuple):
    nv = _nvcomp()
    return nv.Codec(
        algorithm=algorithm,
        bitstream_kind=nv.BitstreamKind.RAW,
        device_id=device_id,
        cuda_stream=stream_ptr,
        **dict(options),
    )


def codec(algorithm: str, **options):
    """An nvCOMP RAW-bitstream codec bound to the current device and stream (cached per thread too:
    nvCOMP's codecs hold scratch state and must not be called from two threads at once)."""
    cp = cuda.require_cupy()
    return _codec(algorithm, cp.cuda.Device().id, cp.cuda.get_current_stream().ptr, threading.get_ident(),
                  tuple(sorted(options.items())))


def _entropy_codec(kind: int):
    return codec("Zstd") if kind == E.KINDS["zstd"] else codec("ANS", data_type="|u1")


def compress_frames(raw, kind: int, chunk: int) -> list:
    """Block stream on the GPU -> list of compressed frames (cupy uint8 views), one per chunk (one nvCOMP call)."""
    cp = cuda.require_cupy()
    return _encode_pieces(cp, kind, [raw[a:b] for a, b in E.chunk_bounds(raw.size, chunk)])


def _encode_pieces(cp, kind: int, pieces: list) -> list:
    """Chunks (cupy uint8) -> their frames (cupy uint8), in one nvCOMP launch on the current stream."""
    if not pieces:
        return []
    return _collect(cp, _launch_pieces(cp, kind, pieces))


def _launch_pieces(cp, kind: int, pieces: list) -> list:
    """Chunks (cupy uint8) -> nvCOMP's arrays of their frames, launched on the current stream, not waited for."""
    nv = _nvcomp()
    s = cp.cuda.get_current_stream().ptr
    return _entropy_codec(kind).encode([nv.as_array(p, cuda_stream=s) for p in pieces])


def _collect(cp, frames: list) -> list:
    """nvCOMP's frame arrays of a launch on the current stream -> cupy uint8 views, once the stream is done."""
    _wait(cp)
    return [cp.asarray(f).view(cp.uint8).reshape(-1) for f in frames]


@functools.lru_cache(maxsize=256)
def _side_stream(device_id: int, caller_ptr: int):
    """A non-blocking stream beside a caller's stream (one per device and caller stream)."""
    cp = cuda.require_cupy()
    with cp.cuda.Device(device_id):
        return cp.cuda.Stream(non_blocking=True)


def _encode_alone(cp, kind: int, streams: list[list]) -> Callable[[], list[list[bytes]]]:
    """Each of one or more streams' chunks in an nvCOMP launch of its own (its own length as the launch's largest
    chunk, so its bytes are those of a launch on the caller's stream) -> a function giving each one's frames (host
    bytes).

    The launches run on a side stream of the caller's, which first waits for the caller's work so far (the
    block encoder), and the last one is not waited for here: the caller's stream goes on meanwhile (the
    rANS coder of the latent sections), instead of waiting about a millisecond for nvCOMP's zstd of a few
    kilobytes (a hyperprior's symbols).  Any earlier one is waited for and read before the next launch, as
    on the caller's stream before (nvCOMP's codec holds scratch state between calls)."""
    caller = cp.cuda.get_current_stream()
    side = _side_stream(cp.cuda.Device().id, caller.ptr)
    ready = cp.cuda.Event(block=False, disable_timing=True)
    ready.record(caller)
    side.wait_event(ready)
    with side:
        done = [_to_host(cp, _encode_pieces(cp, kind, p)) for p in streams[:-1]]
        last = _launch_pieces(cp, kind, streams[-1]) if streams[-1] else []

    def frames() -> list[list[bytes]]:
        with side:
            return done + [_to_host(cp, _collect(cp, last))]

    return frames


def _to_host(cp, frames: list) -> list[bytes]:
    """Device frames -> host bytes, in one copy."""
    if not frames:
        return []
    host = (cp.concatenate(frames) if len(frames) > 1 else frames[0]).get().tobytes()
    ends = np.cumsum([f.size for f in frames]).tolist()
    return [host[a:b] for a, b in zip([0] + ends[:-1], ends)]


class _Chunks(NamedTuple):
    """One thread's request to the grouped entropy stage: its chunks, ready once ``ready`` has passed."""

    pieces: list  # cupy uint8 views of block streams (the submitter keeps them until it has the frames)
    ready: object  # cupy Event recorded on the submitter's stream after the block encoder


def _run_group(kind: int, requests: list) -> list[list[bytes]]:
    """The grouped requests' chunks in one nvCOMP launch on the group worker's stream, which first waits
    for each submitter's block encoder (an event on the submitter's stream); one copy of every frame
    to the host."""
    cp = cuda.require_cupy()
    stream = cp.cuda.get_current_stream()
    for r in requests:
        stream.wait_event(r.ready)
    host = _to_host(cp, _encode_pieces(cp, kind, [p for r in requests for p in r.pieces]))
    out, pos = [], 0
    for r in requests:
        out.append(host[pos : pos + len(r.pieces)])
        pos += len(r.pieces)
    return out


@contextlib.contextmanager
def _worker_stream(device_id: int):
    """The group worker's device and its own non-blocking CUDA stream, current for cupy in its thread."""
    cp = cuda.require_cupy()
    cp.cuda.Device(device_id).use()
    with cp.cuda.Stream(non_blocking=True):
        yield


_GROUPS: dict[tuple, Grouped] = {}
_GROUPS_LOCK = threading.Lock()


def _group(device_id: int, kind: int, chunk: int) -> Grouped:
    """The entropy stage's group commit for one device, entropy kind and frame size (per process: a
    forked child gets its own worker)."""
    key = (os.getpid(), device_id, kind, chunk)
    with _GROUPS_LOCK:
        if key not in _GROUPS:
            _GROUPS[key] = Grouped(functools.partial(_run_group, kind),
                                   f"visemz-service-entropy-{device_id}-{E.NAMES[kind]}-{chunk}",
                                   functools.partial(_worker_stream, device_id))
        return _GROUPS[key]


def group_counts() -> dict[str, tuple[int, int]]:
    """{"cuda:<device>:<entropy>:<frame size>": (launches, requests)} of the grouped entropy stage so far in
    this process: requests / launches is how many ints-stream calls (images, tiles) shared a launch."""
    with _GROUPS_LOCK:
        return {f"cuda:{dev}:{E.NAMES[kind]}:{chunk}": (g.batches, g.payloads)
                for (pid, dev, kind, chunk), g in _GROUPS.items() if pid == os.getpid()}


def compress_many(raws: list, kind: int, chunk: int) -> Callable[[], list[list[bytes]]]:
    """Block streams on the GPU -> a function giving each one's frames (host bytes), one frame per chunk
    of ``chunk`` bytes.

    The streams of one frame or more (a latent's symbols, a residual) go, together with those that
    other threads (pipeline lanes) submit meanwhile, into one nvCOMP launch on the group worker's own
    stream (``grouping.Grouped``), under way when this returns; the function waits for it.  nvCOMP
    compresses each chunk alone, and every chunk of such a launch is compressed with the launch's
    largest chunk (a parameter of nvCOMP's batched API) equal to the frame size, as when its stream was
    launched alone: the bytes are those of one launch per stream.  A stream shorter than one frame
    (a hyperprior's few symbols, an exception list) had its own length as that parameter, so it is
    launched alone (while the grouped launch runs), on a side stream of the caller's, the last such
    launch under way when this returns (``_encode_alone``); so is every ANS stream (zstd only is
    grouped).  The caller keeps ``raws`` until it has the frames.  ``VISEMZ_ENTROPY_BATCH=0``: every
    stream alone, one launch each (the per-stream path)."""
    cp = cuda.require_cupy()
    pieces = [[raw[a:b] for a, b in E.chunk_bounds(raw.size, chunk)] for raw in raws]
    # Only zstd is grouped: nvCOMP's ANS frames were measured (H200) to differ from byte 24
    # between two launches of the same stream, so grouping could not be checked to keep its bytes.
    groupable = defaults.get("entropy_batch") and kind == E.KINDS["zstd"]
    grouped = [i for i, raw in enumerate(raws) if groupable and raw.size >= chunk]
    future = None
    if grouped:
        stream = cp.cuda.get_current_stream()
        ready = cp.cuda.Event(block=False, disable_timing=True)
        ready.record(stream)
        future = _group(cp.cuda.Device().id, kind, chunk).submit_async(
            _Chunks([p for i in grouped for p in pieces[i]], ready))
    alone_ids = sorted(set(range(len(raws))) - set(grouped))
    alone_frames = _encode_alone(cp, kind, [pieces[i] for i in alone_ids]) if alone_ids else list

    def frames() -> list[list[bytes]]:
        alone = dict(zip(alone_ids, alone_frames()))
        host, pos = (future.result() if future is not None else []), 0
        out = []
        for i, p in enumerate(pieces):
            if i in alone:
                out.append(alone[i])
            else:
                out.append(host[pos : pos + len(p)])
                pos += len(p)
        return out

    return frames


def decompress_frames(frames: list, kind: int, sizes: list[int]):
    """Host frames -> the block stream on the GPU (cupy uint8), each frame checked against its size."""
    cp = cuda.require_cupy()
    nv = _nvcomp()
    s = cp.cuda.get_current_stream().ptr
    # nvCOMP wants aligned compressed chunks (ANS faults on odd addresses): 16-byte slots.
    starts = np.cumsum([0] + [-(-len(f) // 16) * 16 for f in frames])
    host = np.zeros(int(starts[-1]), np.uint8)
    for f, a in zip(frames, starts):
        host[a : a + len(f)] = np.frombuffer(f, np.uint8)
    joined = cp.asarray(host)
    views = [nv.as_array(joined[a : a + len(f)], cuda_stream=s) for f, a in zip(frames, starts.tolist())]
    try:
        outs = _entropy_codec(kind).decode(views, data_type="|u1")
        _wait(cp)
    except RuntimeError as e:
        raise CorruptStreamError(f"nvCOMP could not decode a frame: {e}") from None
    outs = [cp.asarray(o).view(cp.uint8).reshape(-1) for o in outs]
    got = [o.size for o in outs]
    if got != list(sizes):
        raise CorruptStreamError(f"entropy frames decoded to sizes {got[:4]}..., expected {list(sizes)[:4]}...")
    return cp.concatenate(outs) if outs else cp.zeros(0, cp.uint8)


# ---------------------------------------------------------------- public
def encode_ints(arr, cfg) -> bytes:
    return start_encode_ints([(arr, cfg)])()[0]


def start_encode_ints(items) -> Callable[[], list[bytes]]:
    """[(GPU integer array, EncoderConfig)] -> a function giving their ints streams.  The block encoder runs
    per array, one host sync reads every size, and every chunk of every array goes into one grouped
    entropy launch per kind, under way when this returns: the caller's stream may work meanwhile."""
    raws = encode_raws([(a, L.POLICIES[cfg.policy], cfg.bitshuffle) for a, cfg in items])
    kinds = [E.KINDS[cfg.entropy] for _, cfg in items]
    chunk = defaults.get("entropy_chunk")  # read once: the frames and the headers must agree
    launched = []
    for kind in sorted(set(kinds) - {E.KINDS["none"]}):
        mine = [i for i, k in enumerate(kinds) if k == kind]
        launched.append((mine, compress_many([raws[i] for i in mine], kind, chunk)))
    plain = [i for i, k in enumerate(kinds) if k == E.KINDS["none"]]
    plain_bytes = _to_host(cuda.require_cupy(), [raws[i] for i in plain])

    def finish() -> list[bytes]:
        frames: list = [None] * len(items)
        for i, b in zip(plain, plain_bytes):
            frames[i] = [b]
        for mine, result in launched:
            for i, f in zip(mine, result()):
                frames[i] = f
        return [stream.pack(raw.size, kind, chunk, f) for raw, kind, f in zip(raws, kinds, frames)]

    return finish


def decode_ints(parsed: stream.Frames):
    cp = cuda.require_cupy()
    if parsed.entropy == E.KINDS["none"]:
        raw = cp.asarray(np.frombuffer(parsed.frames[0], np.uint8))
    else:
        raw = decompress_frames(parsed.frames, parsed.entropy, parsed.sizes)
    return decode_block_stream(raw)
