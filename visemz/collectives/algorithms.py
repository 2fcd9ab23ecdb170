"""The compressed all_reduce algorithms, over payloads, and their phase timing.

Each algorithm takes an engine (``engines.py``: where codec work runs), the flat tensor and
the group, and returns the float64 sum plus the bytes of the final compressed payloads.
Those final payloads are the same bytes on every rank (the compressed all-gather of the ring
hands every rank every reduced chunk; recursive doubling ends with the same integer sum, and
so the same stream, everywhere), so the ratio they give is the same on every rank: ``auto``
uses it to re-estimate without communicating (``autotune.py``).
"""

from __future__ import annotations

import contextlib
import itertools
import time

import torch

from . import transport as T

_PHASES: dict | None = None  # seconds per phase while phase_times() is active


@contextlib.contextmanager
def phase_times():
    """Collect seconds per phase (compress, communicate, reduce, decompress) of the calls inside.

    Each phase is bracketed by a device synchronisation, which costs overlap: use it for a
    breakdown, and time the same call outside it for the total."""
    global _PHASES
    _PHASES = {"compress": 0.0, "communicate": 0.0, "reduce": 0.0, "decompress": 0.0}
    try:
        yield _PHASES
    finally:
        _PHASES = None


@contextlib.contextmanager
def phase_times_paused():
    """Leave work inside (auto's calibration) out of an active ``phase_times``."""
    global _PHASES
    saved, _PHASES = _PHASES, None
    try:
        yield
    finally:
        _PHASES = saved


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


@contextlib.contextmanager
def phase(name: str):
    if _PHASES is None:
        yield
        return
    _sync()
    t0 = time.perf_counter()
    yield
    _sync()
    _PHASES[name] += time.perf_counter() - t0


def write_values(out: torch.Tensor, values: torch.Tensor) -> None:
    """float64 values -> ``out`` (its dtype's rounding), on out's device."""
    out.copy_(values.to(out.device).to(out.dtype))


def bounds(n: int, parts: int) -> list[tuple[int, int]]:
    edges = [round(i * n / parts) for i in range(parts + 1)]
    return list(itertools.pairwise(edges))


def ring_reduce_scatter(eng, chunks: list, sizes: list[int], group):
    """Homomorphic ring: rank r ends with the compressed sum of chunk r (lazy on a GPU: its size
    still in device memory).  Each step's sum is the next step's send, so on an NCCL group each step reads
    the host once: the sum's size word and error bits with the incoming size; with in-band lengths
    (``eng.inband``: small chunks on a GPU) none, and the sum's words carry every upstream report."""
    r, w, largest = T.rank(group), T.world(group), max(sizes)
    for s in range(w - 1):
        send_i, recv_i = (r - s - 1) % w, (r - s - 2) % w
        with phase("communicate"):
            got = T.sendrecv(chunks[send_i], (r + 1) % w, (r - 1) % w, group,
                             inband=eng.inband(sizes[send_i], sizes[recv_i], largest), settle=eng.settle_carried)
        with phase("reduce"):
            chunks[recv_i] = eng.add(got, chunks[recv_i], sizes[recv_i])
    return chunks[r]


def ring(eng, flat: torch.Tensor, group, name: str, edges=None) -> tuple[torch.Tensor, int]:
    """Homomorphic reduce-scatter, then a compressed all-gather of the reduced chunks (``edges``:
    the W chunks' bounds, e.g. a plan's whole rows; by default ``bounds(n, W)``)."""
    r, w = T.rank(group), T.world(group)
    edges = edges or bounds(flat.numel(), w)
    sizes = [b - a for a, b in edges]
    with phase("compress"):
        chunks = eng.encode_many([flat[a:b] for a, b in edges])
    mine = ring_reduce_scatter(eng, chunks, sizes, group)
    # chunk i's reduced payload is rank i's: their sizes (and any rank's add errors) in one all_gather,
    # so the exchanges below send no size words
    with phase("communicate"):
        reduced = T.all_sizes(mine, group)
    chunks[r] = T.exact(mine)
    for s in range(w - 1):
        send_i, recv_i = (r - s) % w, (r - s - 1) % w
        with phase("communicate"):
            chunks[recv_i] = T.sendrecv(chunks[send_i], (r + 1) % w, (r - 1) % w, group, reduced[recv_i])
    with phase("decompress"):
        total = torch.cat(eng.values_many(chunks, sizes, name))
    return total, sum(reduced)


def recursive_doubling(eng, flat: torch.Tensor, group, name: str, edges=None) -> tuple[torch.Tensor, int]:
    """Pairwise exchange-and-add over log2 p rounds; with W not a power of two the extra ranks
    fold their data into a partner first and get the result back at the end."""
    n = flat.numel()
    with phase("compress"):
        buf = eng.encode_many([flat])[0]
    buf = T.exact(_doubling(eng, buf, n, group))
    with phase("decompress"):
        return eng.values(buf, n, name), buf.numel()


def _doubling(eng, buf, n: int, group):
    """The doubling rounds; the result may be lazy (a GPU sum not read yet).  Each round's sum is the
    next round's send, so on an NCCL group each round reads the host once; with in-band lengths
    (``eng.inband``) none until the caller reads the result, whose words carry every round's reports."""
    r, w = T.rank(group), T.world(group)
    p = 1 << (w.bit_length() - 1)  # largest power of two <= w
    ib = eng.inband(n, n, n)
    if r >= p:  # extra ranks hand their data to a partner and wait for the result
        with phase("communicate"):
            T.send(buf, r - p, group, ib)
            return T.recv(r - p, group, ib, eng.settle_carried)
    if r < w - p:
        with phase("communicate"):
            got = T.recv(r + p, group, ib, eng.settle_carried)
        with phase("reduce"):
            buf = eng.add(buf, got, n)
    k = 1
    while k < p:
        with phase("communicate"):
            got = T.sendrecv(buf, r ^ k, r ^ k, group, inband=ib, settle=eng.settle_carried)
        with phase("reduce"):
            buf = eng.add(buf, got, n)
        k <<= 1
    if r < w - p:
        with phase("communicate"):
            T.send(buf, r + p, group, ib)
    return buf


COMPRESSED = {"ring": ring, "recursive_doubling": recursive_doubling}
