"""Float codecs (CPU): error bound, exactness, homomorphic add, bad input."""

import struct

import numpy as np
import pytest
import torch
from skimage import data as skdata

from visemz.encoders import encode_ints, stream
from visemz.errors import (
    CorruptStreamError,
    InvalidArgumentError,
    LimitExceededError,
    UnsupportedFormatError,
    VisemzError,
)
from visemz.floats import ErrorBounded, Lossless, add, gpu
from visemz.floats.lossless import LL_HEAD
from visemz.framing import xxh64

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
    if dtype == torch.bfloat16:
        back = torch.from_numpy(out.view(np.int16)).view(torch.bfloat16)
    else:
        back = torch.from_numpy(out)
    half_ulp = torch.finfo(dtype).eps * (torch.abs(x.to(torch.float64)) + eb) / 2
    assert back.dtype == dtype and within((torch.abs(back.to(torch.float64) - x.to(torch.float64)) - half_ulp).numpy(),
                                          eb, _f64(x))


def extremes(dtype) -> torch.Tensor:
    """The format's largest finite values and some smaller ones: with eb near the largest, 2 eb q lies beyond it."""
    top = torch.finfo(dtype).max
    return torch.tensor([top, -top, 0.0, top / 2, -top / 3, 1.0], dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_error_bound_holds_at_the_format_s_largest_values(dtype):
    x = extremes(dtype)
    for eb in (0.9 * torch.finfo(dtype).max, 0.3 * torch.finfo(dtype).max):
        codec = ErrorBounded(eb)
        out = codec.decode(codec.encode(x))
        bf16 = dtype == torch.bfloat16
        back = torch.from_numpy(out.view(np.int16)).view(torch.bfloat16) if bf16 else torch.from_numpy(out)
        assert torch.isfinite(back).all(), (eb, back)  # rounding 2 eb q gave inf before the clamp
        assert within(np.abs(_f64(back) - _f64(x)), eb, _f64(x))


def test_the_collectives_name_the_float_codecs():
    """``visemz.collectives`` is where users meet the float codecs: the same objects as ``visemz.floats``'s."""
    import visemz.collectives as vc
    import visemz.floats as vf

    names = ("ErrorBounded", "Lossless", "add")
    assert all(getattr(vc, n) is getattr(vf, n) for n in names)
    assert set(names) <= set(vc.__all__) and set(vf.__all__) == set(names)


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
        head = want[:4] + b"\x01" + want[5 : LL_HEAD.size]  # the wire keeps version 1's header, without a checksum
        body = want[LL_HEAD.size + 8 :]  # version 2: the table and the parts after the checksum
        sizes = struct.unpack_from("<4Q", body, 0)
        at = 32 + sizes[0] + sizes[1]
        raw = stream.parse(body[at : at + sizes[2]]).frames[0]
        table = struct.pack("<4Q", sizes[0], sizes[1], len(raw), sizes[3])
        wire = head + table + body[32:at] + bytes(raw) + body[at + sizes[2] :]
        assert Lossless._seal(gpu.ll_bytes(wire, LL_HEAD.size + 32)) == want
    assert int(gpu._table_word(bytes([1, 2, 3, 4, 5, 6, 255]))) == 0xFF060504030201


# ------------------------------------------------------------------ Lorenzo prediction
PREDICTED = ("lorenzo", "lorenzo2d")


def _image(seed: int) -> np.ndarray:
    """A real photograph (scikit-image's camera) as float32 in [0, 1], shifted per seed."""
    img = skdata.camera().astype(np.float32) / 255
    return np.roll(img, 17 * seed, axis=1)[:300, :400].copy()


@pytest.mark.parametrize("predictor", PREDICTED)
@pytest.mark.parametrize("dtype", DTYPES)
def test_predicted_round_trip_within_eb(predictor, dtype):
    x = _field(100_000, 3, dtype).reshape(250, 400)
    for eb in (1e-2, 1e-4):
        codec = ErrorBounded(eb, predictor)
        buf = codec.encode(x)
        assert buf[:6] == b"VZEB\x03" + bytes([{"float32": 0, "float16": 1, "bfloat16": 2}[str(dtype)[6:]]])
        assert within(np.abs(codec.decode(buf, exact=True) - _f64(x).reshape(-1)), eb, _f64(x).reshape(-1))
        # the steps are NumPy's rint(x / 2 eb), whatever the prediction
        np.testing.assert_array_equal(codec.symbols(buf)[0],
                                      ErrorBounded(eb, "none").symbols(ErrorBounded(eb, "none").encode(x))[0])


def test_prediction_raises_the_ratio_on_an_image():
    img = _image(0)
    sizes = {p: len(ErrorBounded(1e-4, p).encode(img)) for p in ("none", "lorenzo", "lorenzo2d")}
    assert sizes["lorenzo"] < sizes["none"] and sizes["lorenzo2d"] < sizes["none"], sizes


@pytest.mark.parametrize("predictor", PREDICTED)
def test_homomorphic_sum_of_predicted_streams_is_the_stream_of_the_sum(predictor):
    codec = ErrorBounded(1e-3, predictor)
    a, b, c = _image(0), _image(1), _image(2) * 0.3
    sa, sb, sc = (codec.encode(v) for v in (a, b, c))
    total = add(add(sa, sb, codec), sc, codec)
    pred = codec.prediction(a.shape)
    exact = lambda s: codec.decode(s, exact=True)  # noqa: E731
    assert total == codec.encode_values(exact(sa) + exact(sb) + exact(sc), "float32", pred)
    want = a.astype(np.float64) + b + c.astype(np.float32)
    assert within(np.abs(exact(total) - want.reshape(-1)), 3 * 1e-3, want.reshape(-1))


def test_prediction_mismatch_and_ranges():
    a = np.zeros((10, 10), np.float32)
    with pytest.raises(InvalidArgumentError, match="cannot add"):
        add(ErrorBounded(1e-3, "lorenzo").encode(a), ErrorBounded(1e-3, "none").encode(a), ErrorBounded(1e-3))
    with pytest.raises(InvalidArgumentError, match="2-D input"):
        ErrorBounded(1e-3, "lorenzo2d").encode(np.zeros(10, np.float32))
    with pytest.raises(InvalidArgumentError, match="whole rows"):
        ErrorBounded(1e-3, "lorenzo2d").encode(np.zeros(10, np.float32), row=3)
    for row in (0, -2):  # a given row length is used as given: never bent to rows of 1
        with pytest.raises(InvalidArgumentError, match=f"row length {row} "):
            ErrorBounded(1e-3, "lorenzo2d").encode(np.zeros(10, np.float32), row=row)
    assert ErrorBounded(1e-3, "lorenzo2d").prediction((4, 0)).row == 1  # an empty 2-D input: no values to split in rows
    with pytest.raises(InvalidArgumentError, match="predictor="):
        ErrorBounded(1e-3, "delta")
    # steps near the int32 limit: fine without prediction, residuals up to 2x / 4x of them are refused
    x = np.array([[3.0e6, -3.0e6], [-3.0e6, 3.0e6]], np.float32)  # steps of +-1.5e9 at eb 1e-3
    ErrorBounded(1e-3, "none").encode(x)
    for predictor in PREDICTED:
        with pytest.raises(LimitExceededError, match="residuals"):
            ErrorBounded(1e-3, predictor).encode(x)
    # residuals that add within int32 but whose prefix sums leave it: the decoder refuses the sum
    codec = ErrorBounded(1e-3, "lorenzo")
    big = codec.encode(np.array([2.0e6, 4.0e6], np.float32))  # steps 1e9, 2e9: residuals 1e9, 1e9
    with pytest.raises(LimitExceededError, match="leave int32"):
        codec.decode(add(big, big, codec))


def test_version_1_streams_still_decode_and_none_writes_version_3():
    x = _field(5000, 4)
    q = np.rint(_f64(x) / 2e-3).astype(np.int32)
    ints = encode_ints(q, policy="block", bitshuffle=True, entropy="none")
    # version 1, FORMAT.md 8.1: the 16-byte header, then the ints stream of the steps q themselves
    v1 = struct.pack("<4sBBHd", b"VZEB", 1, 0, 0, 1e-3) + ints
    for reader in (ErrorBounded(1e-3), ErrorBounded(1e-3, "lorenzo2d"), ErrorBounded(1e-3, "none")):
        np.testing.assert_array_equal(reader.symbols(v1)[0], q)
    # version 3 without a predictor: version 2's header (predictor 0, row 0), the checksum, the same ints stream
    v3 = ErrorBounded(1e-3, "none").encode(x)
    head = struct.pack("<4sBBBBQd", b"VZEB", 3, 0, 0, 0, 0, 1e-3)
    assert v3 == head + struct.pack("<Q", xxh64(head, ints)) + ints


@pytest.mark.parametrize("predictor", PREDICTED)
def test_corrupt_predicted_stream_raises(predictor):
    codec = ErrorBounded(1e-3, predictor)
    buf = bytearray(codec.encode(_image(0)))
    for at in (6, 7, 8, 30, 60, len(buf) // 2, len(buf) - 1):  # predictor code, reserved, row, stream header, payload
        bad = bytearray(buf)
        bad[at] ^= 0x5A
        with pytest.raises(CorruptStreamError):
            codec.decode(bytes(bad))
    with pytest.raises(CorruptStreamError):
        codec.decode(bytes(buf[:-3]))
    with pytest.raises(CorruptStreamError):
        codec.decode(bytes(buf[:20]))


def test_predicted_configs_roundtrip():
    for predictor in ("none", *PREDICTED):
        codec = ErrorBounded(1e-4, predictor)
        assert ErrorBounded.from_config(codec.get_config()) == codec
    # a config from before predictors takes the constructor's default; the streams record their own predictor
    assert ErrorBounded.from_config({"eb": 1e-4}).predictor == ErrorBounded(1e-4).predictor == "lorenzo"
    x = np.linspace(-1, 1, 300, dtype=np.float32)
    old = ErrorBounded(1e-4, "none").encode(x)
    assert np.array_equal(ErrorBounded.from_config({"eb": 1e-4}).decode(old), ErrorBounded(1e-4, "none").decode(old))
