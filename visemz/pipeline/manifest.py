"""What a folder job knows it wrote: the manifest of a destination, and the decision per output.

Every output a job places is recorded first: its identity (size, modification time, xxh64), the
identity of the source it was made from, and the settings that shaped it.  A record goes into the
rank's journal (``.visemz-journal-R.jsonl``, one JSON line each, written out with one system call)
*before* the output is renamed into place, so a job killed at any moment leaves no output it has no
record of (a killed process's writes stay in the system's cache; no fsync is spent per line); at
the end the journal is folded into ``visemz-manifest.json`` and removed.

A rerun decides per output (``Manifest.decide``):

* no file there: write it;
* a file there that no record describes (the user's, or changed since): refuse it, never write over it;
* ours, but made from a source that changed since, or with other settings: write it again, saying why;
* ours and current: skip it.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidArgumentError
from ..io import writers
from ..io.files import Identity, Item, identify, shown

MANIFEST = "visemz-manifest.json"
JOURNAL_PREFIX = ".visemz-journal-"
VERSION = 2  # 1: visemz 0.1's, with no identities (its outputs are made again once, as an earlier visemz's)


@dataclass(frozen=True)
class Record:
    """One output as placed: its identity, its source's (None when unknown) and its settings."""

    output: Identity | None
    source: Identity | None
    settings: dict

    def to_dict(self) -> dict:
        return {"output": self.output and self.output.to_dict(), "source": self.source and self.source.to_dict(),
                "settings": self.settings}

    @classmethod
    def from_dict(cls, d) -> "Record | None":
        if not isinstance(d, dict) or not isinstance(d.get("settings"), dict):
            return None
        return cls(Identity.from_dict(d.get("output") or {}), Identity.from_dict(d.get("source") or {}), d["settings"])


@dataclass(frozen=True)
class Decision:
    action: str  # "write", "skip" or "refuse"
    reason: str = ""  # why an output is written again, or refused
    owned: Record | None = None  # the record of the file now at the output path, when it is ours


def settings_change(old: dict, new: dict) -> str:
    """'quality 4.0 -> 8.0, max_error None -> 0': what differs between two settings."""
    keys = sorted(set(old) | set(new))
    return ", ".join(f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in keys if old.get(k) != new.get(k))


class Manifest:
    """The records of a destination folder: its manifest and any journals a killed run left."""

    def __init__(self, dst: Path, legacy_owned=None):
        """``legacy_owned(path)``: whether a file listed as done by a version-1 manifest is an output
        (e.g. a complete .vsz container); such files are ours but carry no identities.

        Records are keyed by the output's path relative to ``dst`` ('/'-separated)."""
        self.dst = dst.absolute()
        self.records: dict[str, list[Record]] = {}
        self.extra: dict = {}
        self._legacy_owned = legacy_owned
        self._legacy: set[str] = set()
        self._load()

    # ------------------------------------------------------------------ reading
    def _load(self) -> None:
        path = self.dst / MANIFEST
        if path.exists():
            try:
                doc = json.loads(path.read_bytes())
                files = doc["files"]
            except (OSError, ValueError, KeyError, TypeError):
                raise InvalidArgumentError(f"'{shown(path)}' is not a visemz manifest: move it away, or choose "
                                           "another destination") from None
            if doc.get("version") == VERSION:
                settings = doc.get("settings_table") or []
                for f in files:
                    rec = f.get("record")
                    k = rec.get("settings") if isinstance(rec, dict) else None
                    if isinstance(k, int) and 0 <= k < len(settings):
                        rec = dict(rec, settings=settings[k])
                    self._add(f.get("output"), Record.from_dict(rec))
            else:  # version 1: the sources a compression did (its outputs: each name + .vsz), nothing else
                self._legacy = {f"{f['rel']}.vsz" for f in files if isinstance(f, dict)
                                and isinstance(f.get("rel"), str) and f.get("status") in ("done", "skipped")}
        for journal in sorted(self.dst.glob(JOURNAL_PREFIX + "*.jsonl")):
            for line in journal.read_bytes().splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue  # a line cut short by a kill
                if isinstance(entry, dict):
                    self._add(entry.get("output"), Record.from_dict(entry.get("record")))

    def _add(self, out, record: Record | None) -> None:
        if isinstance(out, str) and record is not None and record.output is not None:
            self.records.setdefault(out, []).append(record)

    def key(self, path: Path) -> str:
        """An output's key: its path relative to the destination."""
        return path.relative_to(self.dst).as_posix()

    def journals(self) -> list[Path]:
        return sorted(self.dst.glob(JOURNAL_PREFIX + "*.jsonl"))

    # ------------------------------------------------------------------ deciding
    def owner(self, path: Path) -> Record | None:
        """The record of the file at output ``path``, if this destination's records describe it."""
        out = self.key(path)
        for r in reversed(self.records.get(out, ())):  # the latest first
            if r.output.matches(path):
                return r
        if out in self._legacy and self._legacy_owned is not None and self._legacy_owned(path):
            return Record(None, None, {})
        return None

    def decide(self, item: Item, settings: dict, resume: bool = True) -> Decision:
        path = item.dst
        if not path.parent.resolve().is_relative_to(self.dst.resolve()):  # a link in the destination's tree
            return Decision("refuse", f"output '{shown(path)}' would be written through a link that leads out of "
                                      f"the destination (to '{shown(path.parent.resolve())}'); it is not written")
        try:
            st = path.lstat()
        except FileNotFoundError:
            return Decision("write")
        except OSError as e:
            return Decision("refuse", f"output '{shown(path)}' cannot be examined: {e.strerror}")
        if not stat.S_ISREG(st.st_mode):
            return Decision("refuse", f"output '{shown(path)}' exists and is not a file this job wrote "
                                      "(a link, a folder or a device); it is left as it is")
        owned = self.owner(path)
        if owned is None:
            return Decision("refuse", f"output '{shown(path)}' exists and is not an output of this job "
                                      f"(no record of it in {MANIFEST}); it is left as it is: move it away, "
                                      "or choose another destination")
        if owned.output is None or not owned.settings:
            return Decision("write", "made by an earlier visemz (no record of its source or settings)", owned)
        if not resume:
            return Decision("write", "--no-resume", owned)
        if owned.settings != settings:
            return Decision("write", f"other settings ({settings_change(owned.settings, settings)})", owned)
        if owned.source is None or not owned.source.matches(item.src):
            return Decision("write", "source changed", owned)
        return Decision("skip", "", owned)


class Journal:
    """A rank's append-only record of the outputs it places (thread-safe: writer threads share it)."""

    def __init__(self, dst: Path, rank: int):
        self.path = dst / f"{JOURNAL_PREFIX}{rank}.jsonl"
        self._lock = threading.Lock()
        self._file = None

    def record(self, out: str, record: Record) -> None:
        """Record the output whose key (path relative to the destination) is ``out``."""
        line = (json.dumps({"output": out, "record": record.to_dict()}, allow_nan=False) + "\n").encode()
        with self._lock:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, writers.FILE_MODE)
                self._file = os.fdopen(fd, "ab")  # never through a link: a journal is the job's own file
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def output_identity(f, data=None) -> Identity:
    """The identity of an output about to be renamed into place: ``f`` its open temporary file,
    ``data`` its bytes when the caller holds them (else the file is read back to hash it)."""
    if data is None:
        return identify(f)
    return Identity.of_bytes(data, os.fstat(f.fileno()))


def write(dst: Path, doc: dict, files: list[dict], carried: dict[str, Record]) -> None:
    """Write the manifest: ``doc`` (the run's fields), ``files`` (each a dict with "rel", "output"
    and "record", a Record or None) and ``carried``, the records (by output key) of outputs whose
    sources this run did not see, which stay this destination's."""
    table: list[dict] = []
    index: dict[str, int] = {}

    def entry(f: dict) -> dict:
        rec: Record | None = f.get("record")
        if rec is None:
            return dict(f, record=None)
        key = json.dumps(rec.settings, sort_keys=True)
        if key not in index:
            index[key] = len(table)
            table.append(rec.settings)
        return dict(f, record=dict(rec.to_dict(), settings=index[key]))

    listed = [entry(f) for f in files]
    listed += [entry({"output": out, "status": "kept", "reason": "its source was not part of this run", "record": rec})
               for out, rec in sorted(carried.items())]
    body = dict(doc, version=VERSION, settings_table=table, files=listed)
    writers.write_atomic(dst / MANIFEST, writers.to_json(body).encode())
