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
"""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch
import torch.distributed as dist

from ..errors import InvalidArgumentError, UnsupportedFormatError
from . import transport as T
from .codecs import FLOATS, ErrorBounded, Lossless, _to_float64
from .homomorphic import add

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


def _write(out: torch.Tensor, values: np.ndarray) -> None:
    """float64 values -> ``out`` (its dtype's rounding)."""
    out.copy_(torch.from_numpy(np.ascontiguousarray(values)).to(out.dtype))


def _decode_exact(codec: ErrorBounded, buf: bytes) -> np.ndarray:
    return codec.decode(buf, exact=True)


def _lossless_values(codec: Lossless, buf: bytes, name: str) -> np.ndarray:
    return _to_float64(codec.decode(buf), name)


def _bounds(n: int, parts: int) -> list[tuple[int, int]]:
    edges = [round(i * n / parts) for i in range(parts + 1)]
    return list(zip(edges[:-1], edges[1:]))


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
    """alpha-beta model of a group, calibrated once (slowest rank's timings, so all ranks agree)."""

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

        small, big = torch.zeros(256), torch.zeros(1 << 20)
        t_small = median_time(lambda: dist.all_reduce(small, group=group))
        t_big = median_time(lambda: dist.all_reduce(big, group=group))
        probe = torch.randn(1 << 18)
        eb = ErrorBounded(1e-3)
        t_codec = median_time(lambda: eb.decode(add(eb.encode(probe), eb.encode(probe), eb)))
        w = max(T.world(group), 2)
        vals = torch.tensor([t_small / (2 * (w - 1)), max(t_big - t_small, 1e-9) / (2 * (w - 1) / w * big.nbytes),
                             t_codec / (3 * probe.nbytes)], dtype=torch.float64)
        dist.all_reduce(vals, op=dist.ReduceOp.MAX, group=group)
        return cls(*vals.tolist())

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
        elif isinstance(codec, Lossless):
            total = sum(_lossless_values(codec, b, name) for b in T.all_gather_bytes(codec.encode(flat), group))
            _write(flat, total / w if op == "avg" else total)
        elif algorithm == "recursive_doubling":
            total = _decode_exact(codec, _recursive_doubling(codec.encode(flat), codec, group))
            _write(flat, total / w if op == "avg" else total)
        else:
            _ring_all_reduce(flat, codec, group, op)
        return tensor

    return _run(work, async_op)


def _ring_reduce_scatter(chunks: list[bytes], codec: ErrorBounded, group) -> bytes:
    """Homomorphic ring: rank r ends with the compressed sum of chunk r."""
    r, w = T.rank(group), T.world(group)
    for s in range(w - 1):
        send_i, recv_i = (r - s - 1) % w, (r - s - 2) % w
        got = T.sendrecv(chunks[send_i], (r + 1) % w, (r - 1) % w, group)
        chunks[recv_i] = add(got, chunks[recv_i], codec)
    return chunks[r]


def _ring_all_reduce(flat: torch.Tensor, codec: ErrorBounded, group, op: str) -> None:
    r, w = T.rank(group), T.world(group)
    bounds = _bounds(flat.numel(), w)
    chunks = [codec.encode(flat[a:b]) for a, b in bounds]
    chunks[r] = _ring_reduce_scatter(chunks, codec, group)
    for s in range(w - 1):  # compressed all-gather of the reduced chunks
        send_i, recv_i = (r - s) % w, (r - s - 1) % w
        chunks[recv_i] = T.sendrecv(chunks[send_i], (r + 1) % w, (r - 1) % w, group)
    for (a, b), c in zip(bounds, chunks):
        v = _decode_exact(codec, c)
        _write(flat[a:b], v / w if op == "avg" else v)


def _recursive_doubling(buf: bytes, codec: ErrorBounded, group) -> bytes:
    r, w = T.rank(group), T.world(group)
    p = 1 << (w.bit_length() - 1)  # largest power of two <= w
    if r >= p:  # extra ranks hand their data to a partner and wait for the result
        T.send(buf, r - p, group)
        return T.recv(r - p, group)
    if r < w - p:
        buf = add(buf, T.recv(r + p, group), codec)
    k = 1
    while k < p:
        buf = add(buf, T.sendrecv(buf, r ^ k, r ^ k, group), codec)
        k <<= 1
    if r < w - p:
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
        elif isinstance(codec, Lossless):
            mine = [codec.encode(t.reshape(-1)) for t in input_list]
            got = [mine[r]] + [T.sendrecv(mine[(r + k) % w], (r + k) % w, (r - k) % w, group) for k in range(1, w)]
            total = sum(_lossless_values(codec, b, name) for b in got)
            _write(out, total / w if op == "avg" else total)
        else:
            v = _decode_exact(codec, _ring_reduce_scatter([codec.encode(t.reshape(-1)) for t in input_list], codec, group))
            _write(out, v / w if op == "avg" else v)
        return output

    return _run(work, async_op)


# --------------------------------------------------- data-movement collectives
def _decode_into(codec, buf: bytes, out: torch.Tensor, name: str) -> None:
    if isinstance(codec, ErrorBounded):
        _write(out, _decode_exact(codec, buf))
    else:
        _write(out, _lossless_values(codec, buf, name))


def all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor, group=None, codec=ErrorBounded(1e-4),
               async_op: bool = False):
    name = _check([tensor, *tensor_list], "sum", codec, "auto", group, "all_gather")

    def work():
        if codec is None:
            dist.all_gather(tensor_list, tensor, group)
        else:
            for out, buf in zip(tensor_list, T.all_gather_bytes(codec.encode(_flat(tensor)), group)):
                _decode_into(codec, buf, _flat(out), name)
        return tensor_list

    return _run(work, async_op)


def broadcast(tensor: torch.Tensor, src: int, group=None, codec=ErrorBounded(1e-4), async_op: bool = False):
    name = _check([tensor], "sum", codec, "auto", group, "broadcast", [src])

    def work():
        if codec is None:
            dist.broadcast(tensor, src, group)
        else:
            mine = codec.encode(_flat(tensor)) if T.rank(group) == src else None
            _decode_into(codec, T.broadcast_bytes(mine, src, group), _flat(tensor), name)
        return tensor

    return _run(work, async_op)


def scatter(tensor: torch.Tensor, scatter_list: list[torch.Tensor] | None, src: int, group=None,
            codec=ErrorBounded(1e-4), async_op: bool = False):
    """The root compresses each part once and sends part i to rank i."""
    r, w = T.rank(group), T.world(group)
    if r == src and (scatter_list is None or len(scatter_list) != w):
        raise InvalidArgumentError(f"scatter's root needs a list of {w} tensors")
    name = _check([tensor], "sum", codec, "auto", group, "scatter", [src])

    def work():
        if codec is None:
            dist.scatter(tensor, scatter_list if r == src else None, src, group)
            return tensor
        if r == src:
            for i, t in enumerate(scatter_list):
                buf = codec.encode(_flat(t.contiguous()))
                if i == src:
                    _decode_into(codec, buf, _flat(tensor), name)
                else:
                    T.send(buf, i, group)
        else:
            _decode_into(codec, T.recv(src, group), _flat(tensor), name)
        return tensor

    return _run(work, async_op)


def all_to_all(output_list: list[torch.Tensor], input_list: list[torch.Tensor], group=None,
               codec=ErrorBounded(1e-4), async_op: bool = False):
    """Rank r sends input_list[j] to rank j; each part is compressed once, sizes travel first."""
    w = T.world(group)
    if len(output_list) != w or len(input_list) != w:
        raise InvalidArgumentError(f"all_to_all needs {w} inputs and {w} outputs")
    name = _check([*input_list, *output_list], "sum", codec, "auto", group, "all_to_all")

    def work():
        r = T.rank(group)
        c = codec if codec is not None else Lossless()  # uncompressed path: exact coding, same exchange
        parts = [c.encode(_flat(t.contiguous())) for t in input_list]
        _decode_into(c, parts[r], _flat(output_list[r]), name)
        for k in range(1, w):
            to, frm = (r + k) % w, (r - k) % w
            _decode_into(c, T.sendrecv(parts[to], to, frm, group), _flat(output_list[frm]), name)
        return output_list

    return _run(work, async_op)
