"""What a folder job reports: one result per item, and the summary of a run."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..io.files import shown
from ..measure import bpp


@dataclass
class ItemResult:
    rel: str
    status: str  # "done", "skipped" or "failed"
    bytes_in: int = 0
    bytes_out: int = 0
    pixels: int = 0
    error: str = ""
    loader: str = ""  # which loader read the input: "dali", "kvikio" or "cpu"
    note: str = ""  # why a GPU loader handed the item to the CPU loader, when it did
    reason: str = ""  # a done item made again: why (its source changed, other settings, ...)
    record: Any = None  # the manifest's record (manifest.Record) of the file now at the output path, if ours
    output: str = ""  # the output's path relative to the destination


@dataclass
class Summary:
    results: list[ItemResult] = field(default_factory=list)
    seconds: float = 0.0
    vsz_in: bool = False  # whether each item's input is the .vsz file (a decompression) rather than its output
    notes: list[str] = field(default_factory=list)  # what the job did besides its items (temporary files removed)
    warnings: list[str] = field(default_factory=list)  # what the user should know of the outputs

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    @property
    def failed(self) -> list[ItemResult]:
        return [r for r in self.results if r.status == "failed"]

    def to_dict(self) -> dict:
        """The run's figures.  ``ratio`` and ``bpp`` describe the .vsz files whichever way the job ran
        (image file bytes over .vsz bytes, .vsz bits per pixel); ``MB_per_s`` counts the image files'
        bytes (read by a compression, written by a decompression).  ``redone`` counts the done items
        that replaced an earlier output of the job, by reason."""
        done = [r for r in self.results if r.status == "done"]
        bytes_in = sum(r.bytes_in for r in done)
        bytes_out = sum(r.bytes_out for r in done)
        pixels = sum(r.pixels for r in done)
        vsz, image = (bytes_in, bytes_out) if self.vsz_in else (bytes_out, bytes_in)
        return {
            "items": len(self.results), "done": len(done), "skipped": self.count("skipped"),
            "failed": len(self.failed), "seconds": round(self.seconds, 3),
            "images_per_s": round(len(done) / self.seconds, 3) if self.seconds else None,
            "MB_per_s": round(image / 1e6 / self.seconds, 3) if self.seconds else None,
            "bytes_in": bytes_in, "bytes_out": bytes_out,
            "ratio": round(image / vsz, 3) if vsz else None,
            "bpp": round(bpp(vsz, pixels), 4) if pixels else None,
            "redone": dict(sorted(Counter(_kind(r.reason) for r in done if r.reason).items())),
            "loaders": dict(sorted(Counter(r.loader for r in done if r.loader).items())),
            "fallbacks": [{"file": shown(r.rel), "reason": r.note} for r in self.results if r.note],
            "errors": [{"file": shown(r.rel), "error": r.error} for r in self.failed],
            "redone_files": [{"file": shown(r.rel), "reason": r.reason} for r in done if r.reason],
            "notes": list(self.notes), "warnings": list(self.warnings),
        }


def _kind(reason: str) -> str:
    """A redo reason without its details: 'other settings (quality 4.0 -> 8.0)' -> 'other settings'."""
    return reason.split(" (", 1)[0]
