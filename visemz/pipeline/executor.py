"""The multi-stream executor: load -> compute -> write, overlapped, with bounded queues.

    feeds ──▶ [loaded queue] ──▶ N lanes (compute) ──▶ [computed queue] ──▶ writers ──▶ results

* A **feed** is an iterable of ``(index, payload)`` pairs run by its own thread (the CPU
  loader's thread pool, DALI's batches, ...).  A payload is what ``compute`` takes, or an
  ``ItemResult`` (the item is finished, e.g. skipped) or an exception (it failed).
* A **lane** is one compute worker: a thread with, on a GPU, its own ``torch.cuda.Stream``
  made current for torch and for cupy (``cuda.external_stream`` on the same handle), so
  inference, the encoder kernels and nvCOMP of one image run in order on one stream while
  other lanes fill the GPU.  Host images reach the device through the lane's pinned buffer.
* **Writers** are threads, because fsync blocks.

Both queues are bounded (``queue_depth``), so at most loaders + 2 depth + lanes + writers
items are in memory, whatever the folder's size.  An exception raised for one item (a
``VisemzError``, a ``MemoryError``, any other ``Exception``) fails that item only and is
reported with it; a failure of the machinery itself (a feed's iteration, the progress
callback, Ctrl-C) stops every stage and is raised to the caller (never a hang).  Without a
GPU the lanes are plain threads: the same executor is the CPU thread pool.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch

from .. import config, cuda, defaults
from ..defaults import cpu_threads
from ..errors import InvalidArgumentError, VisemzError
from ..image.pixels import DTYPES  # what a lane uploads as it is: the dtypes an image may have
from .results import ItemResult

_END = object()  # end of a queue's stream
_POLL = 0.1  # seconds between checks of the abort flag while blocked


@dataclass(frozen=True)
class ExecutorConfig:
    streams: int = 0  # compute lanes; 0: the streams setting, else automatic (auto_streams)
    queue_depth: int = 0  # items per queue; 0: the queue_depth setting, else twice the streams
    writers: int = 4  # writer threads (fsync-bound)

    def __post_init__(self):
        config.check("streams", self.streams)  # the settings' bounds: a thread each, items waiting hold memory
        config.check("queue_depth", self.queue_depth)
        if self.writers < 1:
            raise InvalidArgumentError(f"writers={self.writers}: expected >= 1")


def auto_streams(device: str) -> int:
    """One lane per 16 SMs of the current GPU (2..8; 8 on an H100), one per core on a CPU."""
    if device != "cuda":
        return cpu_threads()

    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return max(2, min(8, sms // 16))


def resolve(cfg: ExecutorConfig, device: str) -> tuple[int, int]:
    """(lanes, queue depth) for ``cfg`` on ``device``."""
    streams = cfg.streams or defaults.get("streams") or auto_streams(device)
    return streams, cfg.queue_depth or defaults.get("queue_depth") or 2 * streams


# ---------------------------------------------------------------------- lanes
class CpuLane:
    """A compute worker on the CPU: inputs stay where they are."""

    device = "cpu"

    def __init__(self, index: int):
        self.index = index

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def to_device(self, pixels):
        return pixels

    def finish(self) -> None:
        pass




class CudaLane:
    """A compute worker with its own CUDA stream (torch and cupy) and a pinned staging buffer.

    Built in the main thread, entered in the lane's own thread: torch's and cupy's current
    device and stream are per thread, so each lane sets both for itself."""

    device = "cuda"

    def __init__(self, index: int, device_index: int):
        self.index, self.device_index = index, device_index
        self.stream = None  # torch.cuda.Stream, made on entry
        self._stack = contextlib.ExitStack()
        self._staging = None  # pinned host buffer (torch uint8), grown on demand
        self._uploaded = None  # event after the last upload out of the staging buffer

    def __enter__(self):
        import cupy
        torch.cuda.set_device(self.device_index)
        cupy.cuda.Device(self.device_index).use()
        self.stream = torch.cuda.Stream(device=self.device_index)
        self._stack.enter_context(torch.cuda.stream(self.stream))
        self._stack.enter_context(cuda.external_stream(self.stream.cuda_stream, self.device_index))
        return self

    def __exit__(self, *exc):
        self.finish()
        self._stack.close()
        return False

    def to_device(self, pixels):
        """A host array -> a CUDA tensor uploaded on this lane's stream; CUDA tensors are kept."""
        if isinstance(pixels, torch.Tensor) and pixels.is_cuda:
            pixels.record_stream(self.stream)  # made on a loader's stream, used (and freed) here
            return pixels
        if not isinstance(pixels, np.ndarray) or pixels.dtype.name not in DTYPES or pixels.size == 0:
            return pixels  # the codec names what is wrong with it
        return self._upload(pixels)

    def _upload(self, arr: np.ndarray):
        flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        if self._uploaded is not None:
            self._uploaded.synchronize()  # the previous upload has left the staging buffer
        if self._staging is None or self._staging.numel() < flat.size:
            self._staging = torch.empty(max(flat.size, 3 * flat.size // 2), dtype=torch.uint8, pin_memory=True)
        host = self._staging[: flat.size]
        host.numpy()[:] = flat
        dev = torch.empty(flat.size, dtype=torch.uint8, device=f"cuda:{self.device_index}")
        dev.copy_(host, non_blocking=True)
        self._uploaded = torch.cuda.Event()
        self._uploaded.record(self.stream)
        return dev.view(getattr(torch, arr.dtype.name)).reshape(arr.shape)

    def finish(self) -> None:
        """Wait for this lane's queued GPU work, so its outputs can leave the lane."""
        if self.stream is not None:
            self.stream.synchronize()


def make_lanes(device: str, count: int) -> list:
    if device != "cuda":
        return [CpuLane(i) for i in range(count)]

    here = torch.cuda.current_device()  # under torchrun, the rank's GPU
    return [CudaLane(i, here) for i in range(count)]


# ---------------------------------------------------------------------- feeds
def parallel_feed(indices: Iterable[int], load: Callable[[int], Any], workers: int) -> Iterator[tuple[int, Any]]:
    """(index, load(index)) from a thread pool, in completion order, at most ``workers`` in flight.

    An exception ``load`` raises becomes the item's payload (it fails alone)."""
    pending: set = set()
    todo = iter(indices)
    with cf.ThreadPoolExecutor(max(1, workers), thread_name_prefix="visemz-load") as pool:
        try:
            while True:
                for i in todo:
                    pending.add(pool.submit(_load_one, load, i))
                    if len(pending) >= workers:
                        break
                if not pending:
                    return
                finished, pending = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
                for f in finished:
                    yield f.result()
        finally:
            for f in pending:
                f.cancel()


def _load_one(load, i: int):
    try:
        return i, load(i)
    except Exception as e:  # noqa: BLE001 (the item fails, with this as its reason)
        return i, e


def describe(e: Exception) -> str:
    """An item's failure as its report says it."""
    if isinstance(e, VisemzError):
        return str(e)
    if isinstance(e, MemoryError):
        return "out of memory" + (f": {e}" if str(e) else "")
    return f"unexpected {type(e).__name__}: {e}"


# ---------------------------------------------------------------------- the run
class _Aborted(Exception):
    """Raised inside a stage thread when another stage failed: unwind quietly."""


class _Run:
    def __init__(self, names: Sequence[str], depth: int, lanes: int, writers: int):
        self.names = names
        self.loaded: queue.Queue = queue.Queue(depth)
        self.computed: queue.Queue = queue.Queue(depth)
        self.results: queue.Queue = queue.Queue()  # small ItemResults only
        self.abort = threading.Event()
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._left = {"feeds": 0, "lanes": lanes}  # workers of a stage still running
        self.lanes, self.writers = lanes, writers

    # blocking operations that give up when another stage failed
    def put(self, q: queue.Queue, x) -> None:
        while True:
            if self.abort.is_set():
                raise _Aborted
            try:
                return q.put(x, timeout=_POLL)
            except queue.Full:
                continue

    def get(self, q: queue.Queue):
        while True:
            if self.abort.is_set():
                raise _Aborted
            try:
                return q.get(timeout=_POLL)
            except queue.Empty:
                continue

    def fail(self, exc: BaseException) -> None:
        with self._lock:
            if self.error is None:
                self.error = exc
        self.abort.set()

    def finished(self, i: int, payload) -> bool:
        """Route an already finished payload (result or per-item error) to the results."""
        if isinstance(payload, ItemResult):
            self.put(self.results, (i, payload))
            return True
        if isinstance(payload, Exception):
            self.put(self.results, (i, ItemResult(self.names[i], "failed", error=describe(payload))))
            return True
        return False

    def _worker_done(self, stage: str, downstream: queue.Queue, consumers: int) -> None:
        """A worker of ``stage`` stopped; the last one tells each of the next stage's ``consumers`` to end."""
        with self._lock:
            self._left[stage] -= 1
            last = self._left[stage] == 0
        if last and not self.abort.is_set():
            for _ in range(consumers):
                self.put(downstream, _END)

    # stage bodies
    def feed(self, source: Iterable) -> None:
        it = iter(source)
        try:
            for i, payload in it:
                self.put(self.loaded, (i, payload))
        finally:
            if hasattr(it, "close"):  # a generator: let it release its pool or pipeline now
                it.close()
            self._worker_done("feeds", self.loaded, self.lanes)

    def lane(self, lane, compute) -> None:
        try:
            with lane:
                while (x := self.get(self.loaded)) is not _END:
                    i, payload = x
                    if self.finished(i, payload):
                        continue
                    try:
                        out = compute(lane, i, payload)
                    except Exception as e:  # noqa: BLE001 (this item fails; the others go on)
                        out = e
                    if not self.finished(i, out):
                        self.put(self.computed, (i, out))
        finally:
            self._worker_done("lanes", self.computed, self.writers)

    def writer(self, write) -> None:
        while (x := self.get(self.computed)) is not _END:
            i, out = x
            try:
                res = write(i, out)
            except Exception as e:  # noqa: BLE001 (this item fails; the others go on)
                res = e
            self.finished(i, res)

    def start(self, target, *args, name: str) -> threading.Thread:
        def body():
            try:
                target(*args)
            except _Aborted:
                pass
            except BaseException as e:  # a bug or a resource failure: stop every stage
                self.fail(e)

        t = threading.Thread(target=body, name=name, daemon=True)
        t.start()
        return t


def run(names: Sequence[str], feeds: list[Iterable], compute: Callable, write: Callable, lanes: list,
        depth: int, writers: int = 4, progress: Callable[[ItemResult], None] | None = None) -> list[ItemResult]:
    """Run every item through feed -> compute(lane, index, payload) -> write(index, output).

    Returns one ItemResult per name, in the order of ``names``; ``progress`` sees each as it
    finishes.  ``write`` returns the item's ItemResult."""
    r = _Run(names, max(1, depth), len(lanes), writers)
    r._left["feeds"] = len(feeds)
    threads = [r.start(r.feed, f, name=f"visemz-feed-{k}") for k, f in enumerate(feeds)]
    threads += [r.start(r.lane, lane, compute, name=f"visemz-lane-{lane.index}") for lane in lanes]
    threads += [r.start(r.writer, write, name=f"visemz-write-{k}") for k in range(writers)]
    if not feeds:  # nothing to load: release the lanes at once
        for _ in lanes:
            r.loaded.put(_END)
    collected: dict[int, ItemResult] = {}
    try:
        while True:
            try:
                i, res = r.results.get(timeout=_POLL)
            except queue.Empty:
                if not any(t.is_alive() for t in threads) and r.results.empty():
                    break
                continue
            collected[i] = res
            if progress:
                progress(res)
    except BaseException as e:  # Ctrl-C or a failing progress callback: stop the stages too
        r.fail(e)
    finally:
        for t in threads:
            t.join()
    if r.error is not None:
        raise r.error
    if len(collected) != len(names):
        missing = [names[i] for i in range(len(names)) if i not in collected][:5]
        raise RuntimeError(f"executor lost {len(names) - len(collected)} items, e.g. {missing}")  # a bug, never input
    return [collected[i] for i in range(len(names))]
