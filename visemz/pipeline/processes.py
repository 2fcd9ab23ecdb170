"""A folder job in several worker processes of this host (``visemz compress --processes N``).

A GPU image's compress is mostly host work (Python, launches), and the streams of one
process share its interpreter lock: on an H200, 4 streams of one process compressed Kodak 1.09x
as fast as one stream.  Processes each bring their own interpreter.  ``run`` starts N of them (spawned,
so no CUDA state is inherited), each a rank of a Gloo group with a file rendezvous in a temporary
folder, as torchrun's ranks are: rank r takes shard r of the folder and GPU r mod count, and rank 0
gathers every rank's results (the manifest) and hands its summary back.  A worker that fails makes
``run`` stop the others and raise its error.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import pickle
import queue as queue_module
import tempfile
import traceback
from datetime import timedelta
from pathlib import Path

from .. import defaults
from ..config import whole_number
from ..errors import InvalidArgumentError, VisemzError

MAX_PROCESSES = 64
POLL_SECONDS = 0.2


class WorkerFailedError(VisemzError):
    """A worker process of a multi-process job died or raised an error that cannot travel back."""


def check_processes(n) -> int:
    if not whole_number(n) or not 1 <= n <= MAX_PROCESSES:
        raise InvalidArgumentError(f"processes={n!r}: expected an integer in 1..{MAX_PROCESSES}")
    return int(n)


def run(n: int, job, *args, device: str | None = None):
    """``job(*args, rank=r, world=n)`` in ``n`` spawned processes (n == 1: here, without a group); the
    result of rank 0.  ``device``: "cuda" puts worker r on GPU r mod count first.  The workers run with the
    settings in force here (``defaults``), not only those of the environment they inherit."""
    check_processes(n)
    if n == 1:
        return job(*args, rank=0, world=1)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="visemz-ranks-") as tmp:
        store = Path(tmp) / "rendezvous"
        settings = dataclasses.asdict(defaults.current())
        # not daemons: a worker may start processes of its own (DALI's parallel sources); the finally below
        # stops any still running when this returns
        procs = [ctx.Process(target=_worker, args=(r, n, str(store), device, settings, results, job, args))
                 for r in range(n)]
        for p in procs:
            p.start()
        try:
            return _collect(procs, results)
        finally:
            for p in procs:
                if p.is_alive():
                    p.terminate()
                p.join()


def _collect(procs, results):
    """Rank 0's result, once every worker has reported; the first error any reports, raised."""
    reports: dict[int, tuple] = {}
    while len(reports) < len(procs):
        try:
            rank, ok, value = results.get(timeout=POLL_SECONDS)
        except queue_module.Empty:
            dead = [r for r, p in enumerate(procs) if r not in reports and p.exitcode is not None]
            if not dead:
                continue
            try:  # a worker that exited after reporting: its report may still be on its way
                rank, ok, value = results.get(timeout=5.0)
            except queue_module.Empty:
                raise WorkerFailedError(f"worker process {dead[0]} of {len(procs)} exited with code "
                                        f"{procs[dead[0]].exitcode} before reporting") from None
        reports[rank] = (ok, value)
        if not ok:  # the first error to arrive: the others' are mostly this one's echo (a peer gone)
            raise value if isinstance(value, BaseException) else WorkerFailedError(f"worker {rank}: {value}")
    return reports[0][1]


def _worker(rank: int, world: int, store: str, device: str | None, settings: dict, results, job, args) -> None:
    import torch.distributed as dist

    try:
        defaults.set(**settings)
        if device == "cuda":
            from ..device import use_gpu

            use_gpu(rank, share=True)
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=timedelta(minutes=30))
        # every rank's connections made before any goes on: a rank whose quick job ends tears the group down, and a
        # peer still handshaking (a loaded machine) then fails with "connection closed by peer"
        dist.barrier()
        value = job(*args, rank=rank, world=world)
        results.put((rank, True, value if rank == 0 else None))
    except BaseException as e:  # noqa: BLE001 (reported to the parent, which raises it)
        _report_error(results, rank, e)
        results.close()
        results.join_thread()  # in the parent's pipe before the group goes: the peers' errors echo this one
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _report_error(results, rank: int, e: BaseException) -> None:
    try:
        pickle.loads(pickle.dumps(e))  # the queue pickles later, in a thread: try it here
        results.put((rank, False, e))
    except Exception:  # noqa: BLE001 (an error that does not travel: its text instead)
        results.put((rank, False, "".join(traceback.format_exception(e))))
