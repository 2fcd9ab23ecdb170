"""Group commit: the requests that threads submit while one batch runs go out together as the next batch.

    group = Grouped(run)                 # run(list of payloads) -> list of results, one per payload
    result = group.submit(payload)       # from any thread; blocks until its batch has run
    future = group.submit_async(payload) # the same, without waiting: future.result() later

A worker thread of the group runs the batches, one at a time.  A request that finds it idle runs at
once, alone: a single caller pays no waiting.  Requests that arrive while a batch runs queue up, and
the next batch takes every one queued by then, so batches grow with the load (one request per
pipeline lane in flight) and no request waits for more than the batch before it.

The GPU entropy stage uses it to put the zstd chunks of every image in flight into one nvCOMP
launch (``gpu.compress_many``), on the worker's own CUDA stream, so that it overlaps the callers'
other work (the rANS coder, the next image's network).  An exception of ``run`` is raised in every
caller of its batch.
"""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import Future
from typing import Callable, ContextManager, Generic, Sequence, TypeVar

P = TypeVar("P")
R = TypeVar("R")


class Grouped(Generic[P, R]):
    """Runs ``run`` on batches of the payloads that threads submit, in a worker thread of its own.

    ``context``: made and entered by the worker thread around its whole life (the GPU stage makes its
    device and CUDA stream current there).  The worker is a daemon thread that lives as long as the
    process (named ``visemz-service-...``: not a stage of a pipeline run, which leaves no thread behind)."""

    def __init__(self, run: Callable[[Sequence[P]], Sequence[R]], name: str = "visemz-service-group",
                 context: Callable[[], ContextManager] = contextlib.nullcontext):
        self._run, self._name, self._context = run, name, context
        self._cv = threading.Condition()
        self._queue: list[tuple[P, Future]] = []
        self._worker: threading.Thread | None = None
        self.batches = 0  # batches run so far, and the requests they held (what the grouping achieved)
        self.payloads = 0

    def pending(self) -> int:
        """Requests queued for the next batch (those of the batch that runs are not counted)."""
        with self._cv:
            return len(self._queue)

    def submit(self, payload: P) -> R:
        return self.submit_async(payload).result()

    def submit_async(self, payload: P) -> Future:
        fut: Future = Future()
        with self._cv:
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._serve, name=self._name, daemon=True)
                self._worker.start()
            self._queue.append((payload, fut))
            self._cv.notify()
        return fut

    def _serve(self) -> None:
        try:
            with self._context():
                while True:
                    with self._cv:
                        while not self._queue:
                            self._cv.wait()
                        batch, self._queue = self._queue, []
                    self._run_batch(batch)
        except BaseException as e:  # the context failed (no device): the queued callers learn why, none hangs
            with self._cv:
                batch, self._queue = self._queue, []
                self._worker = None  # the next request starts a new worker
            for _, f in batch:
                f.set_exception(e)

    def _run_batch(self, batch: list) -> None:
        try:
            results = self._run([p for p, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"a grouped run returned {len(results)} results for {len(batch)} requests")
        except BaseException as e:  # every caller of the batch learns why
            outcome = [(f.set_exception, e) for _, f in batch]
        else:
            outcome = [(f.set_result, r) for (_, f), r in zip(batch, results)]
        with self._cv:
            self.batches += 1
            self.payloads += len(batch)
        for setter, value in outcome:
            setter(value)
