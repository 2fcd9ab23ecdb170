"""Float codecs for collectives (CPU): error bound, exactness, homomorphic add, bad input."""

import struct

import numpy as np
import pytest
import torch

from visemz.collectives import ErrorBounded, Lossless, add, gpu
from visemz.collectives.codecs import LL_HEAD
from visemz.encoders import stream
from visemz.errors import InvalidArgumentError, LimitExceededError, UnsupportedFormatError, VisemzError

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def within(err: np.ndarray, bound: float, x: np.ndarray) -> bool:
    """err <= bound up to the float64 rounding of evaluating it (a few ulps of |x|)."""
    return bool((err <= bound + 8 * np.spacing(np.abs(x) + bound)).all())


def _field(n: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    """A smooth float field plus noise, like an image stack or a simulation slice."""
    g = torch.Generator().manual_seed(seed)
    t = torch.linspace(0, 20, n, dtype=torch.float64)
    return (torch.sin(t) * 3 + 0.05 * torch.randn(n, generator=g, dtype=torch.float64)).to(dtype)


def _f64(t: torch.Tensor) -> np.ndarray:
    return t.to(torch.float64).numpy()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("eb", [1e-2, 1e-3, 1e-4, 1e-5])
def test_error_bound(dtype, eb):
    x = _field(100_003, seed=int(eb * 1e6), dtype=dtype)
    codec = ErrorBounded(eb)
    buf = codec.encode(x)
    assert within(np.abs(codec.decode(buf, exact=True) - _f64(x)), eb, _f64(x))
    out = codec.decode(buf)
    back = torch.from_numpy(out.view(np.int16)).view(torch.bfloat16) if dtype == torch.bfloat16 else torch.from_numpy(out)
    half_ulp = torch.finfo(dtype).eps * (torch.abs(x.to(torch.float64)) + eb) / 2
    assert back.dtype == dtype and within((torch.abs(back.to(torch.float64) - x.to(torch.float64)) - half_ulp).numpy(), eb, _f64(x))


def test_error_bound_rejects_bad_input():
    with pytest.raises(InvalidArgumentError, match="eb=0"):
        ErrorBounded(0)
    with pytest.raises(InvalidArgumentError, match="NaN"):
        ErrorBounded(1e-3).encode(np.array([1.0, np.nan], np.float32))
    with pytest.raises(InvalidArgumentError, match="NaN or Inf"):
        ErrorBounded(1e-3).encode(np.array([np.inf], np.float32))
    with pytest.raises(LimitExceededError):
        ErrorBounded(1e-9).encode(np.array([1e6], np.float32))
    with pytest.raises(UnsupportedFormatError, match="int32"):
        ErrorBounded(1e-3).encode(np.zeros(4, np.int32))
    buf = ErrorBounded(1e-3).encode(np.zeros(4, np.float32))
    with pytest.raises(InvalidArgumentError, match="eb=0.001"):
        ErrorBounded(1e-2).decode(buf)


@pytest.mark.parametrize("dtype", DTYPES)
def test_lossless_is_exact_on_special_values(dtype):
    finfo = torch.finfo(dtype)
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), finfo.max, finfo.min,
                            finfo.tiny, finfo.tiny / 4, finfo.eps], dtype=dtype)
    x = torch.cat([special, torch.randn(50_001, dtype=dtype) * 100, torch.randn(777, dtype=dtype) * 1e-30])
    out = Lossless().decode(Lossless().encode(x))
    want = x.view(torch.int16).numpy().view(np.uint16) if dtype == torch.bfloat16 else x.numpy()
    np.testing.assert_array_equal(out.view(np.uint8), want.view(np.uint8))


def test_lossless_bf16_ratio_on_normal_data():
    x = torch.randn(1_000_000, generator=torch.Generator().manual_seed(0), dtype=torch.float32).to(torch.bfloat16)
    assert 2 * x.numel() / len(Lossless().encode(x)) >= 1.38


def test_lossless_rejects_damaged_streams():
    buf = bytearray(Lossless().encode(torch.randn(1000, dtype=torch.float16)))
    for cut in (0, 10, 30, len(buf) - 1):
        with pytest.raises(VisemzError):
            Lossless().decode(bytes(buf[:cut]))
    rng = np.random.default_rng(0)
    for i in rng.choice(len(buf) * 8, 300, replace=False):  # flips: an error or a same-size result, never a crash
        buf[i // 8] ^= 1 << (i % 8)
        try:
            assert Lossless().decode(bytes(buf)).size == 1000
        except VisemzError:
            pass
        buf[i // 8] ^= 1 << (i % 8)


@pytest.mark.parametrize("dtype", DTYPES)
def test_homomorphic_add_equals_decompress_add_compress(dtype):
    codec = ErrorBounded(1e-3)
    a, b = codec.encode(_field(50_001, 1, dtype)), codec.encode(_field(50_001, 2, dtype) * 0.5)
    name = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}[dtype]
    assert add(a, b, codec) == codec.encode_values(codec.decode(a, exact=True) + codec.decode(b, exact=True), name)
    total = codec.decode(add(add(a, b, codec), a, codec), exact=True)
    exact = 2 * _f64(_field(50_001, 1, dtype)) + _f64(_field(50_001, 2, dtype) * 0.5)
    assert within(np.abs(total - exact), 3 * 1e-3, exact)  # an N-way sum keeps N eb


def test_homomorphic_add_refuses_mismatches():
    c = ErrorBounded(1e-3)
    with pytest.raises(InvalidArgumentError, match="100-value"):
        add(c.encode(np.zeros(100, np.float32)), c.encode(np.zeros(101, np.float32)), c)
    with pytest.raises(InvalidArgumentError, match="float16"):
        add(c.encode(np.zeros(8, np.float32)), c.encode(np.zeros(8, np.float16)), c)
    with pytest.raises(InvalidArgumentError, match="eb="):
        add(ErrorBounded(1e-2).encode(np.zeros(8, np.float32)), c.encode(np.zeros(8, np.float32)), c)
    with pytest.raises(LimitExceededError):
        big = c.encode(np.full(4, 2.4e6, np.float32))
        add(big, big, c)


def test_codec_configs_roundtrip():
    for codec in (ErrorBounded(1e-4), Lossless()):
        assert type(codec).from_config(codec.get_config()) == codec


def test_lossless_wire_form_converts_to_the_bytes_form():
    """The GPU encoder's wire form (gaps as a raw block stream) -> ``encode``'s bytes, on the host."""
    g = torch.Generator().manual_seed(3)
    for x in (torch.randn(5000, generator=g) * 2.0 ** torch.randint(-40, 40, (5000,), generator=g), torch.ones(3)):
        want = Lossless().encode(x)
        front = LL_HEAD.size + 32
        sizes = struct.unpack_from("<4Q", want, LL_HEAD.size)
        at = front + sizes[0] + sizes[1]
        raw = stream.parse(want[at : at + sizes[2]]).frames[0]
        wire = (want[: LL_HEAD.size] + struct.pack("<4Q", sizes[0], sizes[1], len(raw), sizes[3]) + want[front:at]
                + bytes(raw) + want[at + sizes[2] :])
        assert gpu.ll_bytes(wire, front) == want
    assert int(gpu._table_word(bytes([1, 2, 3, 4, 5, 6, 255]))) == 0xFF060504030201
