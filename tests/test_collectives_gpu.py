"""GPU float codecs and the fused homomorphic add against the NumPy path: identical bytes (marker gpu)."""

import numpy as np
import pytest
import torch

from visemz.collectives import ErrorBounded, Lossless, add
from visemz.errors import CorruptStreamError, InvalidArgumentError, LimitExceededError

pytestmark = pytest.mark.gpu
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SIZES = (1, 31, 32, 33, 8191, 8192, 8193, 100_003)


@pytest.fixture(scope="module")
def gpu():
    from visemz.collectives import gpu

    return gpu


def _inputs(n: int, seed: int, dtype):
    """Smooth field + noise, exact ties of the quantiser, large magnitudes, zeros."""
    g = torch.Generator().manual_seed(seed)
    t = torch.linspace(0, 30, n, dtype=torch.float64)
    field = torch.sin(t) * 4 + 0.05 * torch.randn(n, generator=g, dtype=torch.float64)
    yield "field", field.to(dtype)
    ties = (torch.randint(-2000, 2000, (n,), generator=g).to(torch.float64) + 0.5) * 2e-3  # k + 1/2 steps of 2 eb
    yield "ties", ties.to(dtype)
    big = torch.randn(n, generator=g, dtype=torch.float64) * 1e4  # within fp16 range
    yield "large", big.to(dtype)
    yield "zeros", torch.zeros(n, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_error_bounded_gpu_bytes_equal_cpu(dtype):
    for eb in (1e-3, 1e-2, 0.5):
        for n in SIZES:
            for kind, x in _inputs(n, n, dtype):
                codec = ErrorBounded(eb)
                on_cpu = codec.encode(x)
                assert codec.encode(x.cuda()) == on_cpu, (eb, n, kind)
                if dtype != torch.bfloat16:  # cupy has no bf16
                    import cupy

                    assert codec.encode(cupy.asarray(x.numpy())) == on_cpu, (eb, n, kind)


@pytest.mark.parametrize("dtype", DTYPES)
def test_error_bounded_device_roundtrip(dtype):
    codec = ErrorBounded(1e-3)
    x = next(_inputs(100_003, 7, dtype))[1]
    s, name = codec.encode_device(x.cuda())
    np.testing.assert_array_equal(codec.decode_device(s).get(), codec.decode(codec.encode(x), exact=True))


def test_error_bounded_gpu_refuses_bad_values():
    with pytest.raises(InvalidArgumentError, match="NaN or Inf"):
        ErrorBounded(1e-3).encode(torch.tensor([1.0, float("nan")], device="cuda"))
    with pytest.raises(LimitExceededError):
        ErrorBounded(1e-9).encode(torch.tensor([1e6], device="cuda"))


@pytest.mark.parametrize("dtype", DTYPES)
def test_lossless_gpu_bytes_equal_cpu(dtype):
    finfo = torch.finfo(dtype)
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), finfo.max, finfo.min, finfo.tiny],
                           dtype=dtype)
    for n in SIZES:
        g = torch.Generator().manual_seed(n)
        x = torch.cat([special, (torch.randn(n, generator=g) * 100).to(dtype), (torch.rand(n // 7 + 1, generator=g) * 1e-30).to(dtype)])
        on_cpu = Lossless().encode(x)
        assert Lossless().encode(x.cuda()) == on_cpu, n
        buf, name = Lossless().encode_device(x.cuda())
        got = Lossless().decode_device(buf, x.numel(), name).get()
        want = x.to(torch.float64).numpy()
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        ok = ~np.isnan(want)
        np.testing.assert_array_equal(got[ok], want[ok])
        assert np.array_equal(np.signbit(got[ok]), np.signbit(want[ok]))


def _dstreams(codec, a, b):
    return codec.encode_device(a.cuda())[0], codec.encode_device(b.cuda())[0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_equals_numpy_add(gpu, dtype):
    codec = ErrorBounded(1e-3)
    for n in SIZES:
        (_, a), (_, b) = list(_inputs(n, 1, dtype))[:2]
        want = add(codec.encode(a), codec.encode(b), codec)
        sa, sb = _dstreams(codec, a, b)
        got = gpu.add(sa, sb)
        assert codec._head(str(dtype).replace("torch.", "")) + gpu.stream_bytes(got) == want, n
        # and equal to compress(decompress(a) + decompress(b))
        assert want == codec.encode_values(codec.decode(codec.encode(a), exact=True) + codec.decode(codec.encode(b), exact=True),
                                           str(dtype).replace("torch.", ""))


def test_fused_add_in_place(gpu):
    codec = ErrorBounded(1e-4)
    small = torch.zeros(300_001)  # compresses to almost nothing: the sum is much larger than input a
    big = next(_inputs(300_001, 3, torch.float32))[1]
    want = add(codec.encode(small), codec.encode(big), codec)
    sa, sb = _dstreams(codec, small, big)
    before = sa.nbytes()
    out = gpu.add(sa, sb, inplace=True)
    assert out.data is sa.data and out.nbytes() > 10 * before
    assert gpu.stream_bytes(out) == want[16:]
    for _ in range(3):  # repeated in-place accumulation, like a reduction
        out = gpu.add(out, sb, inplace=True)
        want = add(want, codec.encode(big), codec)
    assert gpu.stream_bytes(out) == want[16:]


def test_fused_add_refuses_overflow_and_mismatch(gpu):
    codec = ErrorBounded(1e-3)
    big = torch.full((4,), 2.4e6)
    sa, _ = codec.encode_device(big.cuda())
    with pytest.raises(LimitExceededError, match="int32"):
        gpu.add(sa, sa)
    s5, _ = codec.encode_device(torch.zeros(5, device="cuda"))
    with pytest.raises(InvalidArgumentError, match="5-value"):
        gpu.add(sa, s5)
    damaged = gpu.DeviceStream(sa.data.copy(), sa.size, sa.n)
    damaged.data[0] = 0  # magic
    with pytest.raises(CorruptStreamError, match="header"):
        gpu.add(damaged, sa)
