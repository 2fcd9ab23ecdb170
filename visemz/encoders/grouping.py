"""Group commit: requests from several threads that arrive while one batch runs go out as the next batch.

    group = Grouped(run)            # run(list of payloads) -> list of results, one per payload
    result = group.submit(payload)  # from any thread; blocks until its batch has run

The first request finds the group idle and runs at once, alone: a single thread pays no
waiting.  Requests that arrive while a batch runs queue up; when it ends, the oldest of them
leads the next batch, which takes every request queued by then.  So the batches grow with the
load (one per pipeline lane in flight) and no request waits for more than the batch before it.

The entropy stage uses it to put the zstd frames of every image in flight into one nvCOMP
launch (``gpu.compress_many``).  An exception of ``run`` is raised in every thread of its batch.
"""

from __future__ import annotations

import threading
from typing import Callable, Generic, Sequence, TypeVar

P = TypeVar("P")
R = TypeVar("R")


class _Request(Generic[P, R]):
    __slots__ = ("payload", "result", "error", "finished", "wake")

    def __init__(self, payload: P):
        self.payload = payload
        self.result: R | None = None
        self.error: BaseException | None = None
        self.finished = False
        self.wake = threading.Event()  # set when the request is finished or must lead the next batch


class Grouped(Generic[P, R]):
    """Runs ``run`` on batches of the payloads that threads submit; at most one batch at a time."""

    def __init__(self, run: Callable[[Sequence[P]], Sequence[R]]):
        self._run = run
        self._lock = threading.Lock()
        self._queue: list[_Request] = []
        self._busy = False  # a batch is being taken or run
        self.batches = 0  # batches run so far, and the payloads they held (what the grouping achieved)
        self.payloads = 0

    def pending(self) -> int:
        """Requests queued for the next batch (not counting the batch that runs)."""
        with self._lock:
            return len(self._queue) if self._busy else 0

    def submit(self, payload: P) -> R:
        req: _Request = _Request(payload)
        with self._lock:
            self._queue.append(req)
            lead = not self._busy
            self._busy = True
        if not lead:
            req.wake.wait()
        if not req.finished:  # idle group, or handed the lead by the batch before
            self._lead()
        if req.error is not None:
            raise req.error
        return req.result

    def _lead(self) -> None:
        with self._lock:
            batch, self._queue = self._queue, []
        try:
            results = self._run([r.payload for r in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"a grouped run returned {len(results)} results for {len(batch)} requests")
            for r, res in zip(batch, results):
                r.result = res
        except BaseException as e:  # every waiting thread learns why, not only this one
            for r in batch:
                r.error = e
        finally:
            with self._lock:
                self.batches += 1
                self.payloads += len(batch)
                nxt = self._queue[0] if self._queue else None
                self._busy = nxt is not None
            for r in batch:
                r.finished = True
                r.wake.set()
            if nxt is not None:
                nxt.wake.set()  # it leads the next batch
