"""A folder job's hold on its destination: one job at a time, no leftovers, every output recorded.

Rank 0 locks the destination (``writers.FolderLock``) and removes the temporary files a killed run
left; every rank then reads the records (``manifest.Manifest``: the manifest and any journals),
decides per output (``triage``), places each output atomically after recording it in its journal
(``place``), and rank 0 writes the manifest of the whole run (``finish``).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch.distributed as dist

from ..errors import InvalidArgumentError, VisemzError
from ..io import files, writers
from . import manifest
from .results import ItemResult, Summary


def _agree(world: int, error: BaseException | None) -> None:
    """Every rank raises rank 0's setup error (the lock, the cleanup), or none does."""
    if world == 1:
        if error is not None:
            raise error
        return
    box = [None if error is None else str(error)]
    dist.broadcast_object_list(box, src=0)
    if box[0] is not None:
        raise error if error is not None else InvalidArgumentError(box[0])


class Destination:
    """A job's hold on its destination: rank 0 locks it and removes the temporary files a killed
    run left; then every rank reads the records (manifest and journals) and opens its journal."""

    def __init__(self, dst: Path, rank: int, world: int, legacy_owned=None):
        self.dst, self.rank, self.world = dst.absolute(), rank, world
        self.legacy_owned = legacy_owned
        self.notes: list[str] = []
        self._stack = contextlib.ExitStack()

    def __enter__(self):
        error = None
        if self.rank == 0:
            try:
                self._stack.enter_context(writers.FolderLock(self.dst))
                self._remove_temporaries()
            except VisemzError as e:
                error = e
        _agree(self.world, error)
        self.records = manifest.Manifest(self.dst, self.legacy_owned)
        self.journal = manifest.Journal(self.dst, self.rank)
        return self

    def _remove_temporaries(self) -> None:
        stale = writers.stale_temporaries(self.dst)
        for p in stale:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
        if stale:
            self.notes.append(f"removed {len(stale)} temporary file(s) an interrupted run left in "
                              f"{files.shown(self.dst)}")

    def __exit__(self, *exc):
        self.journal.close()
        self._stack.close()
        return False

    def triage(self, items: list[files.Item], settings: dict, resume: bool, owned: dict, reasons: dict):
        """The executor's triage: a finished result (failed, refused, skipped) or None (to do)."""
        def one(i: int) -> ItemResult | None:
            item = items[i]
            if item.problem:
                return ItemResult(item.rel, "failed", error=f"{files.shown(item.rel)} {item.problem}")
            d = self.records.decide(item, settings, resume)
            owned[i] = d.owned
            if d.action == "skip":
                return ItemResult(item.rel, "skipped", record=d.owned)
            if d.action == "refuse":
                return ItemResult(item.rel, "failed", error=d.reason, record=d.owned)
            reasons[i] = d.reason
            return None

        return one

    def place(self, item: files.Item, data, settings: dict, source: files.Identity | None, owned) -> manifest.Record:
        """Write an output atomically, recording it (with its source and settings) before it is renamed
        into place; ``data``: its bytes, or a function ``data(before_replace)`` that writes the file
        atomically (``writers.atomic_file``) and calls ``before_replace`` with the open temporary file."""
        if owned is None and os.path.lexists(item.dst):  # appeared since the triage: not ours
            raise writers.OutputError(f"output '{files.shown(item.dst)}' appeared while the job ran; "
                                      "it is left as it is")
        placed = {}

        def record(f):
            out = manifest.output_identity(f, data if isinstance(data, (bytes, bytearray)) else None)
            placed["record"] = manifest.Record(out, source or files.identify(item.src), settings)
            self.journal.record(self.records.key(item.dst), placed["record"])

        if isinstance(data, (bytes, bytearray)):
            writers.write_atomic(item.dst, data, before_replace=record)
        else:
            data(record)
        return placed["record"]

    def finish(self, summary: Summary, per_rank: list[Summary], items: list[files.Item], doc: dict) -> None:
        """Rank 0: the manifest of the whole run (journals folded in, then removed)."""
        outputs = {self.records.key(it.dst) for it in items}
        carried = {}
        for out in set(self.records.records) - outputs:  # outputs of sources this run did not see
            rec = self.records.owner(self.dst / out)
            if rec is not None:
                carried[out] = rec
        listed = [dict(rel=r.rel, output=r.output, status=r.status, rank=k, error=r.error, reason=r.reason,
                       bytes_in=r.bytes_in, bytes_out=r.bytes_out, loader=r.loader, note=r.note, record=r.record)
                  for k, s in enumerate(per_rank) for r in s.results]
        doc = dict(doc, summary=summary.to_dict(), per_rank=[s.to_dict() for s in per_rank])
        try:
            manifest.write(self.dst, doc, listed, carried)
        except VisemzError as e:
            summary.notes.append(f"the manifest could not be written ({e}); the next run reads this run's journal")
            return
        for j in self.records.journals():
            with contextlib.suppress(FileNotFoundError):
                j.unlink()


def finished(results: list[ItemResult], items: list[files.Item], dest: Destination, owned: dict, reasons: dict):
    """Each result with its output's key, its record (a failed item keeps the record of the file that
    stays at its output) and the reason a done item was made again."""
    for i, r in enumerate(results):
        r.output = dest.records.key(items[i].dst)
        if r.record is None and r.status != "done":
            r.record = owned.get(i)
        if r.record is not None and r.record.output is None:  # an earlier visemz's output, kept: known from now on
            try:
                r.record = manifest.Record(files.identify(items[i].dst), None, {})
            except OSError:
                r.record = None
        if r.status == "done":
            r.reason = reasons.get(i, "")
    return results
