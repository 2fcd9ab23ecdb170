"""Compressed collectives shaped like torch.distributed's, in place like torch's.

    visemz.collectives.all_reduce(tensor, op="sum", group=None, codec=ErrorBounded(1e-4),
                                  algorithm="auto", async_op=False)

Error-bounded all_reduce: ring (homomorphic reduce-scatter, then compressed all-gather) or
recursive doubling (non-power-of-two world sizes fold the extra ranks in first); every rank
ends with identical values, within W * eb of the exact sum for W ranks.  Lossless: the
compressed tensors are gathered and summed in float64 in rank order, the same on every rank.
``codec=None`` or ``algorithm="plain"`` is torch.distributed's own, uncompressed.
Each call first checks that all ranks agree on its settings; a mismatch raises on every rank.
Data-movement collectives (all_gather, broadcast, scatter, all_to_all) leave every copy of a
tensor, the sender's included, equal to the decoded data, so ranks agree exactly.

CUDA tensors are compressed, added and decoded on their GPU (``engines.DeviceEngine``) and on
an NCCL group the compressed bytes move GPU to GPU; CPU tensors use the NumPy codecs.  Both
give the same bytes, so the results are the same wherever the work runs.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch
import torch.distributed as dist

from ..errors import InvalidArgumentError, UnsupportedFormatError
from . import transport as T
from .codecs import FLOATS, ErrorBounded, Lossless
from .engines import engine_for

OPS = ("sum", "avg")
ALGORITHMS = ("auto", "ring", "recursive_doubling", "plain")
_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


# ------------------------------------------------------------------ helpers
def _dtype_name(t: torch.Tensor) -> str:
    if t.dtype not in _DTYPES:
        raise UnsupportedFormatError(f"tensor dtype {t.dtype} is not one of {list(FLOATS)}")
    return _DTYPES[t.dtype]


def _codec_key(codec) -> list[float]:
    if codec is None:
        return [0.0, 0.0]
    if isinstance(codec, ErrorBounded):
        return [1.0, float(codec.eb)]
    if isinstance(codec, Lossless):
        return [2.0, 0.0]
    raise InvalidArgumentError(f"codec={codec!r}: expected ErrorBounded(eb), Lossless() or None")


def _check(tensors, op: str, codec, algorithm: str, group, what: str, extra=()) -> str:
    if op not in OPS:
        raise InvalidArgumentError(f"op={op!r}: expected one of {list(OPS)}")
    if algorithm not in ALGORITHMS:
        raise InvalidArgumentError(f"algorithm={algorithm!r}: expected one of {list(ALGORITHMS)}")
    names = {_dtype_name(t) for t in tensors}
    if len(names) != 1:
        raise InvalidArgumentError(f"{what}: tensors mix dtypes {sorted(names)}")
    name = names.pop()
    key = [float(OPS.index(op)), float(list(FLOATS).index(name)), *_codec_key(codec),
           *(float(t.numel()) for t in tensors), *map(float, extra)]
    T.agree(key, group, f"{what} settings (op, dtype, codec, eb, sizes...)")
    return name


def _flat(t: torch.Tensor) -> torch.Tensor:
    if not t.is_contiguous():
        raise InvalidArgumentError("collectives work in place on contiguous tensors")
    return t.view(-1)


def _write(out: torch.Tensor, values: torch.Tensor) -> None:
    """float64 values -> ``out`` (its dtype's rounding), on out's device."""
    out.copy_(values.to(out.device).to(out.dtype))


def _bounds(n: int, parts: int) -> list[tuple[int, int]]:
    edges = [round(i * n / parts) for i in range(parts + 1)]
    return list(zip(edges[:-1], edges[1:]))


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


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


@contextlib.contextmanager
def _phase(name: str):
    if _PHASES is None:
        yield
        return
    _sync()
    t0 = time.perf_counter()
    yield
    _sync()
    _PHASES[name] += time.perf_counter() - t0


class Handle:
    """What ``async_op=True`` returns: ``wait()`` blocks until done and re-raises any error."""

    def __init__(self, future: Future):
        self._future = future

    def wait(self, timeout: float | None = None):
        return self._future.result(timeout)

    def is_completed(self) -> bool:
        return self._future.done()


_EXECUTOR: ThreadPoolExecutor | None = None
_LOCK = threading.Lock()


def _run(fn, async_op: bool):
    """Run now, or on this process's one background thread (async calls keep their order)."""
    global _EXECUTOR
    if not async_op:
        return fn()
    with _LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = ThreadPoolExecutor(1, thread_name_prefix="visemz-collectives")
    return Handle(_EXECUTOR.submit(fn))


# --------------------------------------------------------------- cost model
class CostModel:
    """alpha-beta model of a group, calibrated once on its own backend and device (slowest rank's
    timings and smallest observed ratio, so all ranks agree).  The ratio is measured on a smooth
    field at eb 1e-3; data that compresses worse makes the model optimistic about compression."""

    def __init__(self, alpha: float, beta: float, codec_s_per_byte: float, ratio: float = 2.0):
        self.alpha, self.beta, self.codec = alpha, beta, codec_s_per_byte
        self.ratio = ratio

    @classmethod
    def calibrate(cls, group) -> "CostModel":
        def median_time(fn, reps=3):
            ts = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
            return sorted(ts)[reps // 2]

        dev = T.device(group)
        sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

        def timed(fn):
            def run():
                fn()
                sync()
            run()  # warm-up (NCCL communicators, kernel compilation)
            return median_time(run)

        small, big = torch.zeros(256, device=dev), torch.zeros(1 << 22, device=dev)
        t_small = timed(lambda: dist.all_reduce(small, group=group))
        t_big = timed(lambda: dist.all_reduce(big, group=group))
        probe = torch.sin(torch.linspace(0, 50, 1 << 20, device=dev)) * 10  # smooth, like the data these serve
        eng, n = engine_for(probe, ErrorBounded(1e-3)), probe.numel()
        payload = eng.encode_many([probe])[0]
        t_codec = timed(lambda: eng.values(eng.add(eng.encode_many([probe])[0], payload, n), n, "float32"))
        ratio = probe.nbytes / payload.numel()
        w = max(T.world(group), 2)
        vals = torch.tensor([t_small / (2 * (w - 1)), max(t_big - t_small, 1e-9) / (2 * (w - 1) / w * big.nbytes),
                             t_codec / (3 * probe.nbytes), -ratio], dtype=torch.float64, device=dev)
        dist.all_reduce(vals, op=dist.ReduceOp.MAX, group=group)  # slowest rank's timings, smallest ratio
        a, b, c, r = vals.tolist()
        return cls(a, b, c, -r)

    def estimates(self, nbytes: int, world: int) -> dict[str, float]:
        w, c = world, nbytes / self.ratio
        logw = math.ceil(math.log2(w))
        return {
            "plain": 2 * (w - 1) * self.alpha + 2 * (w - 1) / w * nbytes * self.beta,
            "ring": 2 * (w - 1) * (self.alpha + c / w * self.beta) + self.codec * nbytes * (2 + (w - 1) / w),
            "recursive_doubling": (logw + 2) * (self.alpha + c * self.beta) + self.codec * nbytes * (2 + logw),
        }

    def choose(self, nbytes: int, world: int) -> str:
        est = self.estimates(nbytes, world)
        return min(est, key=est.get)


_MODELS: dict = {}


def cost_model(group) -> CostModel:
    key = id(group) if group is not None else None
    if key not in _MODELS:
        _MODELS[key] = CostModel.calibrate(group)
    return _MODELS[key]


# ---------------------------------------------------------------- all_reduce
def all_reduce(tensor: torch.Tensor, op: str = "sum", group=None, codec=ErrorBounded(1e-4),
               algorithm: str = "auto", async_op: bool = False):
    """Reduce ``tensor`` across ranks in place (compressed unless codec is None or algorithm 'plain')."""
    flat = _flat(tensor)
    name = _check([tensor], op, codec, algorithm, group, "all_reduce", [ALGORITHMS.index(algorithm)])
    w = T.world(group)
    if codec is None or algorithm == "plain" or w == 1:
        algorithm = "plain"
    elif algorithm == "auto" and isinstance(codec, ErrorBounded):
        algorithm = cost_model(group).choose(flat.numel() * flat.element_size(), w)

    def work():
        if algorithm == "plain":
            dist.all_reduce(tensor, group=group)
            if op == "avg":
                tensor.div_(w)
            return tensor
        eng, n = engine_for(flat, codec), flat.numel()
        if isinstance(codec, Lossless):  # gathered and summed in float64 in rank order, the same on every rank
            with _phase("compress"):
                mine = eng.encode_many([flat])[0]
            with _phase("communicate"):
                got = T.all_gather(mine, group)
            with _phase("decompress"):
                total = sum(eng.values(p, n, name) for p in got)
        elif algorithm == "recursive_doubling":
            with _phase("compress"):
                mine = eng.encode_many([flat])[0]
            reduced = _recursive_doubling(eng, mine, n, group)
            with _phase("decompress"):
                total = eng.values(reduced, n, name)
        else:
            total = _ring_all_reduce(eng, flat, group, name)
        _write(flat, total / w if op == "avg" else total)
        return tensor

    return _run(work, async_op)


def _ring_reduce_scatter(eng, chunks: list[torch.Tensor], sizes: list[int], group) -> torch.Tensor:
    """Homomorphic ring: rank r ends with the compressed sum of chunk r."""
    r, w = T.rank(group), T.world(group)
    for s in range(w - 1):
        send_i, recv_i = (r - s - 1) % w, (r - s - 2) % w
        with _phase("communicate"):
            got = T.sendrecv(chunks[send_i], (r + 1) % w, (r - 1) % w, group)
        with _phase("reduce"):
            chunks[recv_i] = eng.add(got, chunks[recv_i], sizes[recv_i])
    return chunks[r]


def _ring_all_reduce(eng, flat: torch.Tensor, group, name: str) -> torch.Tensor:
    r, w = T.rank(group), T.world(group)
    bounds = _bounds(flat.numel(), w)
    sizes = [b - a for a, b in bounds]
    with _phase("compress"):
        chunks = eng.encode_many([flat[a:b] for a, b in bounds])
    chunks[r] = _ring_reduce_scatter(eng, chunks, sizes, group)
    for s in range(w - 1):  # compressed all-gather of the reduced chunks
        send_i, recv_i = (r - s) % w, (r - s - 1) % w
        with _phase("communicate"):
            chunks[recv_i] = T.sendrecv(chunks[send_i], (r + 1) % w, (r - 1) % w, group)
    with _phase("decompress"):
        return torch.cat([eng.values(c, k, name) for c, k in zip(chunks, sizes)])


def _recursive_doubling(eng, buf: torch.Tensor, n: int, group) -> torch.Tensor:
    r, w = T.rank(group), T.world(group)
    p = 1 << (w.bit_length() - 1)  # largest power of two <= w
    if r >= p:  # extra ranks hand their data to a partner and wait for the result
        with _phase("communicate"):
            T.send(buf, r - p, group)
            return T.recv(r - p, group)
    if r < w - p:
        with _phase("communicate"):
            got = T.recv(r + p, group)
        with _phase("reduce"):
            buf = eng.add(buf, got, n)
    k = 1
    while k < p:
        with _phase("communicate"):
            got = T.sendrecv(buf, r ^ k, r ^ k, group)
        with _phase("reduce"):
            buf = eng.add(buf, got, n)
        k <<= 1
    if r < w - p:
        with _phase("communicate"):
            T.send(buf, r + p, group)
    return buf


# ------------------------------------------------------------ reduce_scatter
def reduce_scatter(output: torch.Tensor, input_list: list[torch.Tensor], op: str = "sum", group=None,
                   codec=ErrorBounded(1e-4), async_op: bool = False):
    """output on rank r = reduction over ranks of input_list[r]."""
    w = T.world(group)
    if len(input_list) != w:
        raise InvalidArgumentError(f"reduce_scatter needs {w} inputs (one per rank), got {len(input_list)}")
    name = _check([output, *input_list], op, codec, "auto", group, "reduce_scatter")
    out = _flat(output)

    def work():
        r = T.rank(group)
        if codec is None:
            stacked = torch.cat([t.reshape(-1) for t in input_list])
            dist.all_reduce(stacked, group=group)
            a = r * out.numel()
            out.copy_(stacked[a : a + out.numel()] / (w if op == "avg" else 1))
            return output
        eng, n = engine_for(out, codec), out.numel()
        mine = eng.encode_many([t.reshape(-1) for t in input_list])
        if isinstance(codec, Lossless):
            got = [mine[r]] + [T.sendrecv(mine[(r + k) % w], (r + k) % w, (r - k) % w, group) for k in range(1, w)]
            total = sum(eng.values(b, n, name) for b in got)
        else:
            total = eng.values(_ring_reduce_scatter(eng, mine, [n] * w, group), n, name)
        _write(out, total / w if op == "avg" else total)
        return output

    return _run(work, async_op)


# --------------------------------------------------- data-movement collectives
def _decode_into(eng, payload: torch.Tensor, out: torch.Tensor, name: str) -> None:
    _write(out, eng.values(payload, out.numel(), name))


def all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor, group=None, codec=ErrorBounded(1e-4),
               async_op: bool = False):
    name = _check([tensor, *tensor_list], "sum", codec, "auto", group, "all_gather")

    def work():
        if codec is None:
            dist.all_gather(tensor_list, tensor, group)
        else:
            eng = engine_for(tensor, codec)
            for out, p in zip(tensor_list, T.all_gather(eng.encode_many([_flat(tensor)])[0], group)):
                _decode_into(eng, p, _flat(out), name)
        return tensor_list

    return _run(work, async_op)


def broadcast(tensor: torch.Tensor, src: int, group=None, codec=ErrorBounded(1e-4), async_op: bool = False):
    name = _check([tensor], "sum", codec, "auto", group, "broadcast", [src])

    def work():
        if codec is None:
            dist.broadcast(tensor, src, group)
        else:
            eng = engine_for(tensor, codec)
            mine = eng.encode_many([_flat(tensor)])[0] if T.rank(group) == src else None
            _decode_into(eng, T.broadcast(mine, src, group), _flat(tensor), name)
        return tensor

    return _run(work, async_op)


def scatter(tensor: torch.Tensor, scatter_list: list[torch.Tensor] | None, src: int, group=None,
            codec=ErrorBounded(1e-4), async_op: bool = False):
    """The root compresses each part once (GPU: each on its own stream) and sends part i to rank i."""
    r, w = T.rank(group), T.world(group)
    if r == src and (scatter_list is None or len(scatter_list) != w):
        raise InvalidArgumentError(f"scatter's root needs a list of {w} tensors")
    name = _check([tensor], "sum", codec, "auto", group, "scatter", [src])

    def work():
        if codec is None:
            dist.scatter(tensor, scatter_list if r == src else None, src, group)
            return tensor
        eng = engine_for(tensor, codec)
        if r == src:
            parts = eng.encode_many([_flat(t.contiguous()) for t in scatter_list])
            for i, p in enumerate(parts):
                if i == src:
                    _decode_into(eng, p, _flat(tensor), name)
                else:
                    T.send(p, i, group)
        else:
            _decode_into(eng, T.recv(src, group), _flat(tensor), name)
        return tensor

    return _run(work, async_op)


def all_to_all(output_list: list[torch.Tensor], input_list: list[torch.Tensor], group=None,
               codec=ErrorBounded(1e-4), async_op: bool = False):
    """Rank r sends input_list[j] to rank j; each part is compressed once (GPU: on its own stream),
    sizes travel first."""
    w = T.world(group)
    if len(output_list) != w or len(input_list) != w:
        raise InvalidArgumentError(f"all_to_all needs {w} inputs and {w} outputs")
    name = _check([*input_list, *output_list], "sum", codec, "auto", group, "all_to_all")

    def work():
        r = T.rank(group)
        if codec is None and T.device(group).type == "cuda":
            dist.all_to_all(output_list, [t.contiguous() for t in input_list], group)
            return output_list
        # Gloo has no all_to_all: the uncompressed path there is the exact (lossless) exchange
        eng = engine_for(input_list[0], codec if codec is not None else Lossless())
        parts = eng.encode_many([_flat(t.contiguous()) for t in input_list])
        _decode_into(eng, parts[r], _flat(output_list[r]), name)
        for k in range(1, w):
            to, frm = (r + k) % w, (r - k) % w
            _decode_into(eng, T.sendrecv(parts[to], to, frm, group), _flat(output_list[frm]), name)
        return output_list

    return _run(work, async_op)
