"""How many images a folder job works on at once on the CPU: as many as the memory there is holds.

An image's CPU compress or decompress needs host memory far beyond the image itself (the networks'
activations, the error-bound path's float64 synthesis, in stripes).  ``estimate`` gives that need from
measured figures, a fixed part and a part per pixel; a job's lanes share a budget, the memory
available when the job starts (``available``: /proc/meminfo's MemAvailable, or the cgroup's
limit when lower) less a margin, split between the processes of a host.  ``MemoryGate`` lets
a lane start an image only while the estimates of the images in flight fit the budget, and
always lets one image run alone, so a large image is slow rather than killed for memory and
small ones still run side by side.  An explicit ``--streams`` (or ``VISEMZ_STREAMS``) wins: the
lanes then run without the gate.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from pathlib import Path

#: Peak host memory of one image's compress or decompress on the CPU, above the loaded models: a fixed
#: part (bytes) and a part per pixel (H x W, each page of a stack), for lossy coding (no max_error) and
#: error-bounded coding (max_error given, lossless included).  Measured (ru_maxrss, mbt2018-mean,
#: quality 4, 12-bit X-ray-like uint16 images of 600x475, 1200x950 and 2400x1900 pixels, this
#: version's codec) and rounded up: see ``estimate``.
FIXED_BYTES = {"lossy": 128 << 20, "bounded": 512 << 20}
BYTES_PER_PIXEL = {"lossy": 700, "bounded": 550}
#: The share of the available memory a job's images may take: the rest is for the models, the
#: loaders' and writers' queues, and the system.
SHARE = 0.75
MEMINFO = Path("/proc/meminfo")
CGROUP = Path("/sys/fs/cgroup")


def estimate(pixels: int, bounded: bool) -> int:
    """Host bytes one image of ``pixels`` (H x W) needs while it is compressed or decompressed."""
    mode = "bounded" if bounded else "lossy"
    return FIXED_BYTES[mode] + int(pixels) * BYTES_PER_PIXEL[mode]


def available() -> int:
    """Bytes of memory this process may still use: MemAvailable, or the cgroup's room when smaller."""
    room = [_meminfo_available(), _cgroup_room()]
    known = [r for r in room if r is not None]
    if known:
        return min(known)
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _meminfo_available() -> int | None:
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_room() -> int | None:
    """limit - usage of this process's cgroup (v2, else v1); None without a limit."""
    for limit, usage in (("memory.max", "memory.current"),
                         ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        try:
            text = (CGROUP / limit).read_text().strip()
            if text == "max":
                return None
            cap = int(text)
            if cap >= 1 << 60:  # v1's "no limit"
                return None
            return max(0, cap - int((CGROUP / usage).read_text().strip()))
        except (OSError, ValueError):
            continue
    return None


def budget(processes: int = 1) -> int:
    """Bytes the images of one of ``processes`` processes on this host may take at once."""
    return int(available() * SHARE / max(1, processes))


class MemoryGate:
    """Admits images while the estimates of those in flight fit ``budget`` bytes; one always runs."""

    def __init__(self, budget_bytes: int):
        self.budget = budget_bytes
        self.used = 0
        self.peak_images = 0
        self._running = 0
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def hold(self, need: int):
        need = min(int(need), self.budget)
        with self._cond:
            while self._running and self.used + need > self.budget:
                self._cond.wait()
            self.used += need
            self._running += 1
            self.peak_images = max(self.peak_images, self._running)
        try:
            yield
        finally:
            with self._cond:
                self.used -= need
                self._running -= 1
                self._cond.notify_all()


class NoGate:
    """No limit: the user chose the number of lanes."""

    budget = math.inf
    peak_images = 0

    @contextlib.contextmanager
    def hold(self, need: int):
        yield
