"""GPU kernels read nothing past their input: run one case over inputs that end where mapped memory ends.

``python -m tests.edge_reads CASE`` (a subprocess of ``test_reads_in_bounds_gpu.py``: a read past the
end stops the whole CUDA context with an illegal address, which would fail every later test of the
same process).  Each input is placed so its last byte is the last byte of a mapping made with the
driver's virtual memory calls (cuMemAddressReserve / cuMemCreate / cuMemMap) and the address range
after it is reserved but unmapped: one byte read beyond the input faults, where an allocation from
a memory pool would usually have readable neighbours and hide it.  Prints "ok" when every size of
the case encodes to the bytes of a pool-allocated copy of the same input.
"""

from __future__ import annotations

import ctypes
import sys

import numpy as np
import torch

SIZES = (1, 31, 33, 1000, 1025, 8191, 8193, 20000)  # in one warp, warps past the end, tiles past the end
ROWS_OF_40 = (40, 1000, 8160, 8200, 20000)  # 2-D Lorenzo: whole rows of 40 values


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocationProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


PINNED, ON_DEVICE, READ_WRITE = 1, 1, 3


class EdgeBuffer:
    """``nbytes`` of device memory whose last byte is the last mapped one (the next granule is unmapped).

    Never unmapped: the case's process is short and ends soon after."""

    def __init__(self, nbytes: int, device: int = 0):
        self.cu = ctypes.CDLL("libcuda.so.1")
        prop = _AllocationProp(type=PINNED, location=_Location(ON_DEVICE, device))
        gran = ctypes.c_size_t()
        self._check(self.cu.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop), 0))
        self.size = -(-nbytes // gran.value) * gran.value
        self.base = ctypes.c_uint64()
        self._check(self.cu.cuMemAddressReserve(ctypes.byref(self.base), ctypes.c_size_t(2 * self.size),
                                                ctypes.c_size_t(0), ctypes.c_uint64(0), ctypes.c_uint64(0)))
        self.handle = ctypes.c_uint64()
        self._check(self.cu.cuMemCreate(ctypes.byref(self.handle), ctypes.c_size_t(self.size), ctypes.byref(prop),
                                        ctypes.c_uint64(0)))
        self._check(self.cu.cuMemMap(self.base, ctypes.c_size_t(self.size), ctypes.c_size_t(0), self.handle,
                                     ctypes.c_uint64(0)))
        access = _AccessDesc(_Location(ON_DEVICE, device), READ_WRITE)
        self._check(self.cu.cuMemSetAccess(self.base, ctypes.c_size_t(self.size), ctypes.byref(access),
                                           ctypes.c_size_t(1)))
        self.ptr = self.base.value + self.size - nbytes  # the input's first byte

    @staticmethod
    def _check(code: int) -> None:
        if code != 0:
            raise RuntimeError(f"CUDA driver call failed with error {code}")


def at_edge(cp, host: np.ndarray):
    """A cupy copy of ``host`` that ends where its mapping ends (the buffer kept alive by the array)."""
    buf = EdgeBuffer(host.nbytes, cp.cuda.Device().id)
    mem = cp.cuda.UnownedMemory(buf.ptr, host.nbytes, buf)
    a = cp.ndarray(host.shape, host.dtype, cp.cuda.MemoryPointer(mem, 0))
    a.set(host)
    return a


def _floats(n: int, dtype: str) -> np.ndarray:
    """A smooth signal with noise, as bit patterns (bfloat16 from float32's upper halves)."""
    rng = np.random.default_rng(n)
    x = (np.sin(np.arange(n) / 17.0) * 40 + rng.normal(0, 0.5, n)).astype(np.float32)
    if dtype == "bfloat16":
        return (x.view(np.uint32) >> 16).astype(np.uint16)
    return x.astype(dtype)


def _tensor(cp, a, dtype: str) -> torch.Tensor:
    t = torch.as_tensor(a, device="cuda")
    return t.view(torch.bfloat16) if dtype == "bfloat16" else t


def error_bounded(cp, dtype: str, predictor: str) -> None:
    from visemz.floats import ErrorBounded

    codec = ErrorBounded(1e-3, predictor)
    row = 40 if predictor == "lorenzo2d" else None
    for n in ROWS_OF_40 if row else SIZES:
        host = _floats(n, dtype)
        edge = codec.encode(_tensor(cp, at_edge(cp, host), dtype), row=row)
        assert edge == codec.encode(_tensor(cp, cp.asarray(host), dtype), row=row), (dtype, predictor, n)


def lossless(cp, dtype: str) -> None:
    from visemz.floats import Lossless

    for n in SIZES:
        host = _floats(n, dtype)
        assert Lossless().encode(_tensor(cp, at_edge(cp, host), dtype)) == Lossless().encode(
            _tensor(cp, cp.asarray(host), dtype)), (dtype, n)


def ints(cp, policy: str) -> None:
    from visemz.encoders import encode_ints

    for n in SIZES:
        host = np.random.default_rng(n).integers(-300, 300, n).astype(np.int32)
        edge = encode_ints(at_edge(cp, host), policy=policy, entropy="none")  # the entropy stage reads our own buffers
        assert edge == encode_ints(cp.asarray(host), policy=policy, entropy="none"), (policy, n)


IMAGE_SHAPES = {"gray8": ((1, 37), (13, 300), (67, 45)), "gray16": ((1, 37), (13, 300), (67, 45)),
                "rgb8": ((1, 37, 3), (9, 70, 3), (67, 45, 3))}


def image(cp, kind: str) -> None:
    """``visemz.compress`` of a CUDA image (weights from ``VISEMZ_WEIGHTS_DIR``, as the test's): lossy,
    lossless and near-lossless."""
    import visemz

    dtype = np.uint16 if kind == "gray16" else np.uint8
    for shape in IMAGE_SHAPES[kind]:
        rng = np.random.default_rng(shape[1])
        ramp = np.add.outer(np.arange(shape[0]), np.arange(shape[1])) * (3 if dtype == np.uint8 else 700)
        host = ((ramp.reshape(shape[:2] + (1,) * (len(shape) - 2)) + rng.integers(0, 9, shape))
                % np.iinfo(dtype).max).astype(dtype)
        for max_error in (None, 0, 2):
            edge = visemz.compress(torch.as_tensor(at_edge(cp, host), device="cuda"), max_error=max_error,
                                   device="cuda")
            pooled = visemz.compress(torch.as_tensor(cp.asarray(host), device="cuda"), max_error=max_error,
                                     device="cuda")
            assert edge == pooled, (kind, shape, max_error)


CASES = {
    **{f"eb-{d}-{p}": (error_bounded, d, p) for d in ("float32", "float16", "bfloat16")
       for p in ("none", "lorenzo", "lorenzo2d")},
    **{f"lossless-{d}": (lossless, d) for d in ("float32", "float16", "bfloat16")},
    **{f"ints-{p}": (ints, p) for p in ("global", "block")},
    **{f"image-{k}": (image, k) for k in IMAGE_SHAPES},
}


def main(case: str) -> None:
    import cupy as cp

    fn, *args = CASES[case]
    fn(cp, *args)
    cp.cuda.Device().synchronize()  # a fault in the last kernel surfaces here at the latest
    print("ok")


if __name__ == "__main__":
    main(sys.argv[1])
