"""GPU float codecs and the fused homomorphic add against the NumPy path: identical bytes (marker gpu)."""

import numpy as np
import pytest
import torch

from visemz.errors import CorruptStreamError, InvalidArgumentError, LimitExceededError
from visemz.floats import ErrorBounded, Lossless, add, gpu
from visemz.floats.dtypes import FLOATS
from visemz.floats.error_bounded import EB_FRONT
from visemz.floats.lossless import LL_HEAD

from .helpers import parity
from .test_float_codecs import extremes

pytestmark = pytest.mark.gpu
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SIZES = (1, 31, 32, 33, 8191, 8192, 8193, 100_003)


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
def test_error_bounded_gpu_bytes_equal_cpu(cp, dtype):
    with parity() as p:
        for eb in (1e-3, 1e-2, 0.5):
            for n in SIZES:
                for kind, x in _inputs(n, n, dtype):
                    codec = ErrorBounded(eb)
                    on_cpu = codec.encode(x)
                    p.same_bytes(f"CUDA tensor eb={eb} n={n} {kind}", codec.encode(x.cuda()), on_cpu)
                    if dtype != torch.bfloat16:  # cupy has no bf16
                        p.same_bytes(f"cupy array eb={eb} n={n} {kind}", codec.encode(cp.asarray(x.numpy())), on_cpu)


@pytest.mark.parametrize("dtype", DTYPES)
def test_error_bounded_device_roundtrip(cp, dtype):
    codec = ErrorBounded(1e-3)
    x = next(_inputs(100_003, 7, dtype))[1]
    s, name = codec.encode_device(x.cuda())
    np.testing.assert_array_equal(codec.decode_device(s).get(), codec.decode(codec.encode(x), exact=True))


def test_error_bounded_gpu_refuses_bad_values(cp):
    with pytest.raises(InvalidArgumentError, match="NaN or Inf"):
        ErrorBounded(1e-3).encode(torch.tensor([1.0, float("nan")], device="cuda"))
    with pytest.raises(LimitExceededError):
        ErrorBounded(1e-9).encode(torch.tensor([1e6], device="cuda"))


@pytest.mark.parametrize("dtype", DTYPES)
def test_lossless_gpu_bytes_equal_cpu(cp, dtype):
    finfo = torch.finfo(dtype)
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), finfo.max, finfo.min, finfo.tiny],
                           dtype=dtype)
    with parity() as p:
        for n in SIZES:
            g = torch.Generator().manual_seed(n)
            x = torch.cat([special, (torch.randn(n, generator=g) * 100).to(dtype),
                           (torch.rand(n // 7 + 1, generator=g) * 1e-30).to(dtype)])
            p.same_bytes(f"encode n={n}", Lossless().encode(x.cuda()), Lossless().encode(x))
            buf, name = Lossless().encode_device(x.cuda())
            got = Lossless().decode_device(buf, x.numel(), name).get()
            want = x.to(torch.float64).numpy()
            p.same_array(f"decode n={n}: values (NaN where NaN)", got, want)
            p.same_array(f"decode n={n}: signs", np.signbit(got), np.signbit(want))


def _dstreams(codec, a, b):
    return codec.encode_device(a.cuda())[0], codec.encode_device(b.cuda())[0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_equals_numpy_add(cp, dtype):
    codec = ErrorBounded(1e-3)
    name = _NAME[dtype]
    with parity() as p:
        for n in SIZES:
            (_, a), (_, b) = list(_inputs(n, 1, dtype))[:2]
            want = add(codec.encode(a), codec.encode(b), codec)
            sa, sb = _dstreams(codec, a, b)
            p.same_bytes(f"fused add n={n}", codec.frame(gpu.stream_bytes(gpu.add(sa, sb)), name), want)
            # and equal to compress(decompress(a) + decompress(b))
            p.same_bytes(f"NumPy add n={n} against re-encoding the decoded sum", want, codec.encode_values(
                codec.decode(codec.encode(a), exact=True) + codec.decode(codec.encode(b), exact=True), name))


def test_fused_add_in_place(cp):
    codec = ErrorBounded(1e-4)
    small = torch.zeros(300_001)  # compresses to almost nothing: the sum is much larger than input a
    big = next(_inputs(300_001, 3, torch.float32))[1]
    want = add(codec.encode(small), codec.encode(big), codec)
    sa, sb = _dstreams(codec, small, big)
    before = sa.nbytes()
    out = gpu.add(sa, sb, inplace=True)
    assert out.data is sa.data and out.nbytes() > 10 * before
    assert gpu.stream_bytes(out) == want[EB_FRONT:]
    for _ in range(3):  # repeated in-place accumulation, like a reduction
        out = gpu.add(out, sb, inplace=True)
        want = add(want, codec.encode(big), codec)
    assert gpu.stream_bytes(out) == want[EB_FRONT:]


def test_fused_add_refuses_overflow_and_mismatch(cp):
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


def test_fused_add_takes_unread_lengths_from_device_memory(cp):
    """An unread sum, or a sum received with its words, goes to block_add as its whole buffer and its
    device words: the same bytes as with the length known, no host read, the words' reports carried on."""
    codec = ErrorBounded(1e-3)
    head = EB_FRONT
    for n in (1, 8193, 100_003):
        (_, a), (_, b) = list(_inputs(n, 2, torch.float32))[:2]
        sa, sb = _dstreams(codec, a, b)
        want = add(add(codec.encode(a), codec.encode(b), codec), codec.encode(b), codec)[head:]
        lazy = gpu.add(sa, sb, lazy=True)
        twice = gpu.add(lazy, sb, lazy=True)
        assert lazy.known is None, "the add read its unread input's size on the host"
        assert gpu.stream_bytes(twice) == want
        received = gpu.add_input(lazy.data, cp.asarray([lazy.nbytes(), 0], cp.uint64), n)
        assert codec.frame(gpu.stream_bytes(gpu.add(sb, received)), "float32") == \
            add(codec.encode(b), add(codec.encode(a), codec.encode(b), codec), codec)
    words = lambda *w: cp.asarray(list(w), cp.uint64)  # noqa: E731
    n = sa.n
    with pytest.raises(LimitExceededError, match="int32"):  # a report of the input's maker (bit 64) reaches the sum
        gpu.add(gpu.add_input(sa.data, words(sa.nbytes(), 64), n), sb)
    for bad in (2**64 - 1, sa.nbytes() - 1, sa.data.size + 1):  # a failed maker's ~0; not the stream's length
        with pytest.raises(CorruptStreamError, match="header"):
            gpu.add(gpu.add_input(sa.data, words(bad, 0), n), sb)


# ------------------------------------------------ fused quantise-encode / decode-dequantise kernels
FUSED_SIZES = (0, 1, 2, 31, 32, 33, 1023, 8191, 8192, 8193, 3 * 8192 + 5, 262_147)
_NAME = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def _bits(x: torch.Tensor) -> np.ndarray:
    """A tensor's bit patterns as unsigned NumPy integers (bf16, fp16 -> uint16, fp32 -> uint32)."""
    wide = x.element_size() == 4
    ints = x.contiguous().view(torch.int32 if wide else torch.int16).cpu().numpy()
    return ints.view(np.uint32 if wide else np.uint16)


def _tie_inputs(n: int, dtype):
    """Exact quantiser ties for eb = 0.5 (2 eb = 1): k + 1/2, both signs, round-half-even decides."""
    k = torch.arange(n, dtype=torch.float64) % 1000 - 500
    return (k + 0.5).to(dtype)


@pytest.mark.parametrize("predictor", ["none", "lorenzo"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_encode_and_decode_equal_cpu(cp, dtype, predictor):
    name = _NAME[dtype]
    wide = np.uint32 if dtype == torch.float32 else np.uint16
    with parity() as p:
        for n in FUSED_SIZES:
            cases = [(eb, kind, x) for eb in (1e-3, 0.5) for kind, x in _inputs(n, n + 1, dtype)]
            cases.append((0.5, "exact ties", _tie_inputs(n, dtype)))
            for eb, kind, x in cases:
                case = f"n={n} eb={eb} {kind} {predictor}"
                codec = ErrorBounded(eb, predictor)
                want = codec.encode(x)
                s, got_name = codec.encode_device(x.cuda())
                p.same(f"{case}: dtype name", got_name == name, got_name)
                p.same_bytes(f"{case}: encode", codec.frame(gpu.stream_bytes(s), name), want)
                cpu_values = codec.decode(want)  # the tensor's dtype (bf16 as uint16 bits)
                dec = codec.decode_device(s, name).get()
                if p.same(f"{case}: decoded itemsize", dec.dtype.itemsize == cpu_values.dtype.itemsize):
                    p.same_array(f"{case}: decode to {name} (bit patterns)", dec.view(wide), cpu_values.view(wide))
                p.same_array(f"{case}: decode to float64", codec.decode_device(s), codec.decode(want, exact=True))


@pytest.mark.parametrize("predictor", ["none", "lorenzo"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_decode_clamps_to_the_format_s_finite_range_as_the_cpu(cp, dtype, predictor):
    """eb near the format's largest value: 2 eb q lies beyond it, and both decoders give the largest finite value."""
    name, wide = _NAME[dtype], np.uint32 if dtype == torch.float32 else np.uint16
    x = extremes(dtype)
    codec = ErrorBounded(0.9 * torch.finfo(dtype).max, predictor)
    want = codec.encode(x)
    s, _ = codec.encode_device(x.cuda())
    assert codec.frame(gpu.stream_bytes(s), name) == want
    np.testing.assert_array_equal(codec.decode_device(s, name).get().view(wide), codec.decode(want).view(wide))
    np.testing.assert_array_equal(codec.decode(want).view(wide)[:2], _bits(x)[:2])  # +-max: the nearest finite values


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_encode_reports_bad_values_at_the_size_read(cp, dtype):
    codec = ErrorBounded(1e-3)
    for bad in (float("nan"), float("inf"), -float("inf")):
        x = torch.zeros(20_000, dtype=dtype)
        x[12_345] = bad
        s, _ = codec.encode_device(x.cuda())  # launches without stopping the GPU
        with pytest.raises(InvalidArgumentError, match="NaN or Inf"):
            s.nbytes()
        with pytest.raises(InvalidArgumentError, match="NaN or Inf"):
            codec.encode(x.cuda())
    big = torch.zeros(9000, dtype=dtype)
    big[8999], big[3] = 2048.0, -2000.0  # 2048 / 2e-6 = 1.0e9 steps: fits; the 1e-7 bound does not
    ErrorBounded(1e-6).encode_device(big.cuda())[0].nbytes()
    with pytest.raises(LimitExceededError, match="values up to 2.05e\\+03"):
        ErrorBounded(1e-7).encode_device(big.cuda())[0].nbytes()
    big[5] = float("nan")  # NaN wins, as on the CPU
    with pytest.raises(InvalidArgumentError):
        ErrorBounded(1e-7).encode(big.cuda())


def test_sizes_read_together_equal_sizes_read_one_by_one_and_raise_the_same(cp):
    """``gpu.read_sizes`` (one host read for many streams, as encode_many uses it) gives each stream the
    size its own read gives, streams of no values included, and raises what a bad stream's read raises."""
    codec = ErrorBounded(1e-3)
    xs = [next(_inputs(n, n, torch.float32))[1].cuda() for n in (0, 1, 8193, 100_003)]
    q = cp.arange(-5000, 5000, dtype=cp.int32)

    def streams():  # fused-encoder streams (three result cells each) with a plain block stream (one size word) between
        fused = [codec.encode_device(x)[0] for x in xs]
        return fused[:2] + [gpu.encode_symbols(q)] + fused[2:]

    together = streams()
    gpu.read_sizes(together)
    assert [s.known for s in together] == [s.nbytes() for s in streams()]
    bad = xs[2].clone()
    bad[77] = float("inf")
    with_bad = [codec.encode_device(x)[0] for x in (xs[3], bad)]
    with pytest.raises(InvalidArgumentError, match="NaN or Inf"):
        gpu.read_sizes(with_bad)
    with pytest.raises(LimitExceededError):
        gpu.read_sizes([ErrorBounded(1e-7).encode_device(torch.full((9000,), 2048.0, device="cuda"))[0]])


def test_fused_decode_refuses_a_damaged_stream(cp):
    codec = ErrorBounded(1e-3)
    s, _ = codec.encode_device(next(_inputs(20_000, 5, torch.float32))[1].cuda())
    bad = gpu.DeviceStream(s.data.copy(), s.size, s.n)
    bad.data[5] = 0  # policy byte
    with pytest.raises(CorruptStreamError, match="header"):
        codec.decode_device(bad, "float32")
    short = gpu.DeviceStream(s.data, s.size, s.n + 1)  # n disagrees with the header
    with pytest.raises(CorruptStreamError):
        codec.decode_device(short)


# ------------------------------------------------------------------ lossless kernels
LL_SIZES = (0, 1, 7, 8, 9, 2047, 2048, 2049, 3 * 2048 + 3, 100_003)


def _ll_inputs(n: int, dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    yield "normal", torch.randn(n, generator=g).to(dtype)
    wide = dtype == torch.float32
    raw = torch.randint(-(2**31) if wide else -(2**15), 2**31 - 1 if wide else 2**15 - 1, (n,), generator=g,
                        dtype=torch.int32 if wide else torch.int16)
    yield "random bits (many escapes, NaN payloads)", raw.view(dtype)
    yield "one exponent", torch.ones(n, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_lossless_kernels_equal_cpu_and_decode_bit_exact(cp, dtype):
    name = _NAME[dtype]
    with parity() as p:
        for n in LL_SIZES:
            for kind, x in _ll_inputs(n, dtype, n):
                p.same_bytes(f"n={n} {kind}: encode", Lossless().encode(x.cuda()), Lossless().encode(x))
                buf, got_name = Lossless().encode_device(x.cuda())
                p.same(f"n={n} {kind}: dtype name", got_name == name, got_name)
                p.same_array(f"n={n} {kind}: decoded bit patterns", gpu.ll_decode_wire(buf, n, name, FLOATS, LL_HEAD),
                             _bits(x))


def test_lossless_decode_refuses_damaged_escapes(cp):
    x = torch.cat([torch.ones(5000), 2.0 ** torch.arange(-14.0, 15.0)]).to(torch.float16)  # 29 exponents: escapes
    buf, name = Lossless().encode_device(x.cuda())
    sizes = np.frombuffer(buf[LL_HEAD.size : LL_HEAD.size + 32].get().tobytes(), "<u8")
    assert sizes[3] > 0
    bad = buf.copy()
    bad[-1] = 200  # an escaped exponent wider than fp16's 5 bits
    with pytest.raises(CorruptStreamError, match="exceeds 5 bits"):
        gpu.ll_decode_wire(bad, x.numel(), name, FLOATS, LL_HEAD)
    bad = buf.copy()
    bad[LL_HEAD.size + 32] ^= 7  # value 0's code becomes 7 (or stops being 7): the list disagrees
    with pytest.raises(CorruptStreamError, match="escape list"):
        gpu.ll_decode_wire(bad, x.numel(), name, FLOATS, LL_HEAD)


# ------------------------------------------------------------------ 2-D Lorenzo prediction
SHAPES = ((1, 1), (1, 77), (77, 1), (33, 257), (8192, 3), (311, 1000))


@pytest.mark.parametrize("dtype", DTYPES)
def test_lorenzo2d_kernels_equal_cpu(cp, dtype):
    """Encode bytes, decode values (the prefix sums on the GPU) and the fused add of 2-D predicted streams."""
    name = _NAME[dtype]
    wide = np.uint32 if dtype == torch.float32 else np.uint16
    with parity() as p:
        for shape in SHAPES:
            n = shape[0] * shape[1]
            for eb in (1e-3, 0.5):
                for kind, x in _inputs(n, n + 2, dtype):
                    case = f"{shape} eb={eb} {kind}"
                    codec = ErrorBounded(eb, "lorenzo2d")
                    x = x.reshape(shape)
                    want = codec.encode(x)
                    s, _ = codec.encode_device(x.cuda())
                    p.same_bytes(f"{case}: encode", codec.frame(gpu.stream_bytes(s), name, codec.prediction(shape)),
                                 want)
                    p.same_bytes(f"{case}: encode of bytes form", codec.encode(x.cuda()), want)
                    dec = codec.decode_device(s, name, row=shape[1]).get()
                    p.same_array(f"{case}: decode to {name}", dec.view(wide), codec.decode(want).view(wide))
                    p.same_array(f"{case}: decode to float64", codec.decode_device(s, row=shape[1]),
                                 codec.decode(want, exact=True))
            (_, a), (_, b) = list(_inputs(n, 3, dtype))[:2]
            codec = ErrorBounded(1e-3, "lorenzo2d")
            a, b = a.reshape(shape), b.reshape(shape)
            want = add(codec.encode(a), codec.encode(b), codec)
            sa, sb = codec.encode_device(a.cuda())[0], codec.encode_device(b.cuda())[0]
            p.same_bytes(f"{shape}: fused add", codec.frame(gpu.stream_bytes(gpu.add(sa, sb)), name,
                                                            codec.prediction(shape)), want)


def test_predicted_device_streams_refuse_ranges_and_damage(cp):
    x = torch.tensor([[3.0e6, -3.0e6], [-3.0e6, 3.0e6]], device="cuda")  # steps of +-1.5e9: residuals leave int32
    for predictor in ("lorenzo", "lorenzo2d"):
        with pytest.raises(LimitExceededError, match="residuals"):
            ErrorBounded(1e-3, predictor).encode_device(x)[0].nbytes()
    codec = ErrorBounded(1e-3, "lorenzo")
    big, _ = codec.encode_device(torch.tensor([2.0e6, 4.0e6], device="cuda"))  # residuals 1e9, 1e9
    with pytest.raises(LimitExceededError, match="leave int32"):  # their sum's prefix sums do not fit
        codec.decode_device(gpu.add(big, big))
    s, _ = codec.encode_device(next(_inputs(20_000, 5, torch.float32))[1].cuda())
    bad = gpu.DeviceStream(s.data.copy(), s.size, s.n)
    bad.data[5] = 0  # policy byte
    with pytest.raises(CorruptStreamError, match="header"):
        codec.decode_device(bad, "float32")


# ------------------------------------------ 1-D Lorenzo decoding by look-back across many tiles
@pytest.mark.parametrize("dtype", DTYPES)
def test_lorenzo_decode_across_tiles_equals_cpu(cp, dtype):
    """Steps that climb to ~1e9 and back below zero over 41 tiles (the one-pass decoder's running
    sum crosses tiles by look-back), sizes off the 32-value block and the 8192-value tile."""
    name = _NAME[dtype]
    wide = np.uint32 if dtype == torch.float32 else np.uint16
    with parity() as p:
        for n in (8192 * 41 + 17, 8192 * 2 - 1, 5):
            t = torch.linspace(0, 9, n, dtype=torch.float64)
            x = (torch.sin(t) * 1000).to(dtype)
            for eb in (1e-6, 3e-4, 0.5):
                codec = ErrorBounded(eb, "lorenzo")
                want = codec.encode(x)
                s, _ = codec.encode_device(x.cuda())
                case = f"n={n} eb={eb}"
                p.same_bytes(f"{case}: encode", codec.frame(gpu.stream_bytes(s), name), want)
                p.same_array(f"{case}: decode to float64", codec.decode_device(s).get(), codec.decode(want, exact=True))
                p.same_array(f"{case}: decode to {name}", codec.decode_device(s, name).get().view(wide),
                             codec.decode(want).view(wide))


def test_lorenzo_decode_finds_overflow_in_a_later_tile(cp):
    codec = ErrorBounded(1e-3, "lorenzo")
    x = torch.zeros(8192 * 5 + 3)  # a ramp over tile 3 to 1.5e6 (7.5e8 steps): small residuals, whose
    x[8192 * 3 : 8192 * 4] = torch.linspace(0, 1.5e6, 8192)  # sums add, but whose steps leave int32 at 4x
    x[8192 * 4 :] = 1.5e6
    s, _ = codec.encode_device(x.cuda())
    twice = gpu.add(s, s)
    np.testing.assert_array_equal(codec.decode_device(twice).get(), 2 * codec.decode(codec.encode(x), exact=True))
    with pytest.raises(LimitExceededError, match="leave int32"):
        codec.decode_device(gpu.add(twice, twice))
