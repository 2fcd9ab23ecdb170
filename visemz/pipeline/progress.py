"""How a folder job shows its progress: a bar on a terminal, plain lines anywhere else.

Both show the items finished out of the total, images/s, MB/s of the image files, and the time
left (ETA).  On a terminal (standard error, where progress goes) a rich bar redraws in place;
piped or redirected, a line is printed at every tenth of the job and at least every
``LINE_SECONDS``, so a log shows the job moving without one line per file.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

LINE_SECONDS = 30.0


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "-:--"
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class Progress:
    """``start(total)`` once, then call with each finished item's result (its ``bytes_in`` or
    ``bytes_out``, the image side, counts toward MB/s)."""

    def __init__(self, label: str, image_side: str, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.label, self.side = label, image_side
        self.stream = stream or sys.stderr
        self.clock = clock
        self.total = 0
        self.done = 0
        self.bytes = 0
        self.t0 = clock()
        self._bar = None
        self._next_line = (0.0, 0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.stop()
        return False

    def start(self, total: int) -> None:
        self.total, self.t0 = total, self.clock()
        if self.stream.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
            from rich.progress import Progress as Bar

            self._bar = Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TextColumn("ETA"),
                            TimeRemainingColumn(), console=Console(file=self.stream), transient=True)
            self._task = self._bar.add_task(self.label, total=total, rate="")
            self._bar.start()
        else:
            self._next_line = (self.t0 + LINE_SECONDS, max(1, total // 10))

    def __call__(self, result) -> None:
        self.done += 1
        self.bytes += getattr(result, self.side, 0) if result.status == "done" else 0
        if self._bar is not None:
            self._bar.update(self._task, advance=1, rate=self._rate())
            return
        when, count = self._next_line
        if self.done >= count or self.clock() >= when or self.done == self.total:
            self._line()

    def _rate(self) -> str:
        dt = max(self.clock() - self.t0, 1e-9)
        return f"{self.done / dt:.1f} img/s {self.bytes / 1e6 / dt:.1f} MB/s"

    def _line(self) -> None:
        dt = self.clock() - self.t0
        left = dt / self.done * (self.total - self.done) if self.done else None
        pct = 100 * self.done // max(1, self.total)
        print(f"{self.label}: {self.done}/{self.total} ({pct}%), {self._rate()}, elapsed {_clock(dt)}, "
              f"ETA {_clock(left)}", file=self.stream, flush=True)
        step = max(1, self.total // 10)
        self._next_line = (self.clock() + LINE_SECONDS, (self.done // step + 1) * step)
