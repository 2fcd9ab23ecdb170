"""CUDA graphs of the networks' forward passes: one launch instead of a hundred Python-level calls.

    out = graphs.run(fn, (x,), key=("analyse", quality, crop), owner=net, pixels=h * w)

A Kodak image's compress and decompress spent about two thirds of their time on the host
(13 ms a round trip on an H200, the GPU busy 4.4 ms of it), much of it PyTorch's
per-operator dispatch of the analysis, hyper-synthesis and synthesis networks: a few hundred
operators, each a Python call, a dispatch and a launch.  A CUDA graph captured once per
(function, model, input shapes and dtypes, quality...) replays all of them in one launch.

``run`` captures ``fn`` on its first call for a key (one eager warm-up run first, then the
capture, then a replay: the first result of a key, too, comes from its graph), and replays it afterwards: the
inputs are copied into the graph's own input tensors, the graph launched on the current
stream, and the outputs cloned out of the graph's memory, so they stay valid after the next
replay.  Streams share a graph: a replay waits (on the GPU, not the host) for the previous
replay's outputs to be cloned, and a lock orders the host's enqueueing.

Used only where it is safe and cheap: CUDA inputs, no autograd, not inside another capture,
inputs of at most ``VISEMZ_GRAPH_PIXELS`` pixels (a graph keeps its own memory for the
network's activations, about the peak of one eager pass), and at most ``VISEMZ_GRAPHS`` graphs
per process (least recently used dropped; 0 turns graphs off).  ``fn`` must be capturable:
no host reads, no host-to-device copies (the models' gains are cached per quality, so the
warm-up makes them; ``keep`` holds the cached tensors with the graph), no data-dependent shapes.
A capture that fails turns graphs off for the process (a failed capture may leave CUDA state
behind), so a capture problem costs speed, never a result; one that runs out of memory leaves
its key eager.  A key's results come from its graph while the graph is held; a key captured
again after being dropped (or running eagerly) may take other cuDNN kernels, so its float
results can differ in the last bits, as between any two loads of the GPU.  Captures take a lock, one at a
time, one per key; a graph dropped from the cache waits for its last replay first.  Other threads keep
launching work on their own streams meanwhile, but a device-wide synchronisation during a capture
fails (in whichever thread): the codec's and pipeline's go through ``synchronize`` /
``outside_capture``, which wait for a capture to end.

Each held graph was captured on a stream of its own, which no other held graph was captured on
(``_capture_stream``; a stream goes back to the pool once its graph is dropped and reset).  torch keys
cuBLAS's workspace by handle and stream and a capture bakes its address into the graph: graphs
captured on one shared stream shared one workspace, and two of them replayed side by side on two
lanes' streams (a float64 hyper-synthesis of one tile and another's) overwrote each other's partial
sums: the scales, hence the table indexes, of some tiles were wrong, and their files did not decode.
"""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from .. import defaults

_LOCK = threading.Lock()
_GRAPHS: OrderedDict[tuple, "_Graph | None"] = OrderedDict()  # key -> graph (None: did not capture), oldest first
_FAILED_MAX = 256  # keys remembered as not capturable (out of memory while capturing)


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: tuple[torch.Tensor, ...]
    outputs: object  # a tensor, or a tuple / dict of tensors, in the graph's memory
    owner: object  # what the graph reads beside its inputs (the model's weights): kept alive with it
    kept: object  # more tensors it reads (``keep``'s: the gains of its quality), kept alive with it
    stream: "_CaptureStream"  # captured on it, which no other held graph was: it holds the graph's cuBLAS workspace
    done: torch.cuda.Event = field(default_factory=torch.cuda.Event)  # recorded after each replay's outputs are out
    lock: threading.Lock = field(default_factory=threading.Lock)
    retired: bool = False  # dropped from the cache: a caller still holding it runs eagerly instead


def run(fn, inputs: tuple[torch.Tensor, ...], *, key: tuple, owner, pixels: int, keep=None):
    """``fn(*inputs)``, from a CUDA graph where ``usable``; else eagerly.  ``key``: what besides the
    inputs' shapes, dtypes and device decides the work ``fn`` does (its name, a quality, a crop...);
    ``owner``: the model it reads (its identity joins the key, and the graph keeps it alive); ``keep``:
    None or a function returning the other tensors ``fn`` reads that its caller does not hold (cached
    tensors such as a quality's gains, which a full cache drops): called just before the capture, its
    result is kept with the graph, so that their memory is never reused while the graph may run."""
    if not usable(inputs, pixels):
        return fn(*inputs)
    full = (key, id(owner), inputs[0].device, tuple((tuple(t.shape), t.dtype) for t in inputs),
            torch.backends.cudnn.allow_tf32)  # a graph keeps the kernels of the math setting it was captured under
    entry = _lookup(full)
    if entry is False:
        with _CAPTURE_LOCK:  # one capture at a time, and one per key: the first caller's
            entry = _lookup(full)
            if entry is False:
                entry = _capture(fn, inputs, owner, keep) if not _BROKEN else None
                _insert(full, entry)
    if entry is None:  # did not capture
        return fn(*inputs)
    out = _replay(entry, inputs)
    return fn(*inputs) if out is None else out


_CAPTURE_LOCK = threading.RLock()  # re-entrant: a capture's warm-up may itself call outside_capture code
_BROKEN = False  # a capture failed: none is tried again in this process (a failed capture can leave CUDA state)


@contextmanager
def outside_capture():
    """No capture runs while this is held.  For work that may not overlap any stream's capture, whatever
    thread it runs in: a device-wide synchronisation (CUDA refuses it while a stream captures, and the
    capture breaks too), third-party decoders that may synchronise or free device memory (DALI)."""
    with _CAPTURE_LOCK:
        yield


def synchronize(device=None) -> None:
    """``torch.cuda.synchronize(device)``, never during a capture (``outside_capture``)."""
    with _CAPTURE_LOCK:
        torch.cuda.synchronize(device)


def _lookup(key: tuple):
    """The key's graph, None (it did not capture) or False (not tried yet)."""
    with _LOCK:
        entry = _GRAPHS.get(key, False)
        if entry is not False:
            _GRAPHS.move_to_end(key)
        return entry


def pixels(t: torch.Tensor, stride: int = 1) -> int:
    """Image pixels behind a (B, C, H, W) tensor whose positions are ``stride`` pixels apart (1: the image
    itself, 16: the latent y, 64: the hyper-latent z)."""
    return t.shape[0] * t.shape[-2] * t.shape[-1] * stride * stride


def usable(inputs: tuple[torch.Tensor, ...], pixels: int) -> bool:
    """Whether ``run`` would use a graph for these inputs: CUDA tensors on one device, graphs on (and no capture
    failed), no autograd, not already capturing, at most ``VISEMZ_GRAPH_PIXELS`` pixels."""
    if defaults.get("graphs") == 0 or _BROKEN or pixels > defaults.get("graph_pixels") or not inputs:
        return False
    d = inputs[0].device
    if d.type != "cuda" or any(t.device != d for t in inputs) or torch.is_grad_enabled():
        return False
    return not torch.cuda.is_current_stream_capturing()


def clear() -> None:
    """Drop every graph (after the GPU finished with each), e.g. to give their memory back; captures are
    tried again after one failed."""
    global _BROKEN
    _BROKEN = False
    with _LOCK:
        entries = list(_GRAPHS.values())
        _GRAPHS.clear()
    for e in entries:
        if e is not None:
            _retire(e)


def count() -> int:
    """Graphs held now (keys that did not capture not counted)."""
    with _LOCK:
        return sum(e is not None for e in _GRAPHS.values())


def _capture(fn, inputs: tuple[torch.Tensor, ...], owner, keep) -> _Graph | None:
    """A graph of ``fn`` (None: it ran out of memory capturing).  The warm-up's own errors (a bad input, out of
    memory) are the caller's, as an eager run's would be; a capture that fails otherwise turns graphs off."""
    global _BROKEN
    device = inputs[0].device
    caller = torch.cuda.current_stream(device)
    static = tuple(t.clone() for t in inputs)
    own = _capture_stream(device)
    cap = own.torch
    cap.wait_stream(caller)
    try:
        with torch.cuda.stream(cap):
            fn(*static)  # warm-up: cuDNN's plans, workspaces, the gains' cached tensors
    except BaseException:
        _FREE_STREAMS.append(own)
        raise
    caller.wait_stream(cap)
    kept = keep() if keep is not None else None
    graph = torch.cuda.CUDAGraph()
    try:
        # thread_local: other threads (pipeline lanes) keep working on their streams during the capture
        with torch.cuda.graph(graph, stream=cap, capture_error_mode="thread_local"):
            outputs = fn(*static)
    except Exception as e:  # noqa: BLE001 (any capture failure: the eager path gives the same results)
        # torch.cuda.graph's exit ends the capture before it restores the caller's stream, so a capture that
        # fails to end leaves the capture stream current: the thread's torch work would then run unordered
        # with its cupy work (the coders', on the legacy stream) and with everything else on the caller's
        torch.cuda.set_stream(caller)
        _settle(device)
        del graph
        _FREE_STREAMS.append(own)
        if isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e):
            return None  # this key runs eagerly; others still capture
        _BROKEN = True
        warnings.warn(f"visemz: a network pass did not capture as a CUDA graph; CUDA graphs are off in this "
                      f"process, every pass runs eagerly: {e}", RuntimeWarning, stacklevel=3)
        return None
    return _Graph(graph, static, outputs, owner, kept, own)


def _settle(device) -> None:
    try:
        torch.cuda.synchronize(device)
    except Exception:  # noqa: BLE001 (the failed capture's own state; the eager path reports real errors)
        pass


@dataclass(frozen=True)
class _CaptureStream:
    raw: object  # the cupy stream that owns the CUDA stream
    torch: torch.cuda.ExternalStream  # torch's view of it
    device: int


_FREE_STREAMS: list[_CaptureStream] = []  # capture streams whose graph was dropped (taken under _CAPTURE_LOCK)


def _capture_stream(device: torch.device) -> _CaptureStream:
    """A stream of this device that nothing else uses and no held graph was captured on: one freed by a dropped
    graph, or a new one (so there are at most as many as graphs held at once, plus one).  Made by cupy,
    outside torch's pool of 32 shared streams, which torch.cuda.Stream() hands out in turn (and
    torch.cuda.graph's default capture stream is one of them): after 32 pipeline lanes a lane could get the
    very stream a capture is recording, and its work would go into the graph."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    for k, s in enumerate(_FREE_STREAMS):
        if s.device == index:
            return _FREE_STREAMS.pop(k)
    from ..cuda import require_cupy

    cp = require_cupy()
    with cp.cuda.Device(index):
        raw = cp.cuda.Stream(non_blocking=True)
    return _CaptureStream(raw, torch.cuda.ExternalStream(raw.ptr, device=torch.device("cuda", index)), index)


def _insert(key: tuple, entry: _Graph | None) -> None:
    dropped = []
    with _LOCK:
        _GRAPHS[key] = entry
        _GRAPHS.move_to_end(key)
        while sum(e is not None for e in _GRAPHS.values()) > defaults.get("graphs"):
            old = next(k for k, e in _GRAPHS.items() if e is not None)
            dropped.append(_GRAPHS.pop(old))
        failed = [k for k, e in _GRAPHS.items() if e is None]
        for k in failed[: max(0, len(failed) - _FAILED_MAX)]:
            del _GRAPHS[k]
    for e in dropped:
        _retire(e)


def _retire(entry: _Graph) -> None:
    """A graph leaving the cache: no replay starts on it any more, and the last one has finished, before its
    memory goes back to the allocator (which does not know that a replay still uses it)."""
    with entry.lock:
        entry.retired = True
        entry.done.synchronize()
        # the graph goes before its stream is reused: torch may clear that stream's cuBLAS workspace as it does
        entry.graph.reset()
    with _CAPTURE_LOCK:
        _FREE_STREAMS.append(entry.stream)


def _replay(entry: _Graph, inputs: tuple[torch.Tensor, ...]):
    stream = torch.cuda.current_stream(inputs[0].device)
    with entry.lock:  # the enqueue order of copy-in, replay, copy-out is one caller's at a time
        if entry.retired:
            return None
        stream.wait_event(entry.done)  # another stream's replay has cloned its outputs
        for s, t in zip(entry.inputs, inputs):
            s.copy_(t)
        entry.graph.replay()
        out = _clone(entry.outputs)
        entry.done.record(stream)
    return out


def _clone(outputs):
    if isinstance(outputs, torch.Tensor):
        return outputs.clone()
    if isinstance(outputs, dict):
        return {k: _clone(v) for k, v in outputs.items()}
    if isinstance(outputs, (tuple, list)):
        return type(outputs)(_clone(v) for v in outputs)
    raise TypeError(f"a graphed function returned {type(outputs).__name__}, not tensors")
