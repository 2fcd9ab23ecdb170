"""visemz.compress / decompress on the CPU: dtypes, layouts, odd sizes, the error bound, bad input."""

import pickle
import struct

import numpy as np
import pytest
import torch
import xxhash
from skimage import data

import visemz
from visemz import container
from visemz.encoders import entropy, layout, stream
from visemz.errors import CorruptStreamError, InvalidArgumentError, UnsupportedFormatError, VisemzError
from visemz.framing import write_varints
from visemz.models import all_specs
from visemz.models import weights as W

from .helpers import check_switch_setting, max_abs_error, symbols_of, with_meta

pytestmark = pytest.mark.usefixtures("model_weights")

MODELS = ("balle2016", "mbt2018-mean")


def _image(dtype: str, shape: tuple, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "uint8":
        return rng.integers(0, 256, shape, dtype=np.uint8)
    if dtype == "uint16":
        return rng.integers(0, 4096, shape, dtype=np.uint16)  # 12-bit detector data in 16-bit words
    if dtype == "int16":
        return rng.integers(-1024, 3072, shape, dtype=np.int16)  # a CT slice's Hounsfield units
    return (rng.standard_normal(shape) * 40 + 1000).astype(np.float32)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("dtype", ["uint8", "uint16", "int16", "float32"])
@pytest.mark.parametrize("shape", [(24, 40), (24, 40, 1), (24, 40, 3), (24, 40, 4)])
def test_roundtrip_keeps_dtype_and_shape(model, dtype, shape):
    img = _image(dtype, shape)
    out = visemz.decompress(visemz.compress(img, model=model, quality=2))
    assert out.dtype == img.dtype and out.shape == img.shape


@pytest.mark.parametrize("shape", [(1, 1), (63, 65), (3000, 17)])
def test_odd_sizes(shape):
    img = _image("uint8", shape, seed=3)
    for model in MODELS:
        buf = visemz.compress(img, model=model, quality=1, max_error=0)
        np.testing.assert_array_equal(visemz.decompress(buf), img)


def _adversarial(dtype: str) -> list[np.ndarray]:
    if dtype == "int16":  # the uint16 images shifted to -32768..32767: both ends of the signed range
        return [(a.astype(np.int32) - 32768).astype(np.int16) for a in _adversarial("uint16")]
    top = {"uint8": 255, "uint16": 65535}.get(dtype)
    h, w = 40, 57  # both padded (to 64 x 64)
    yy, xx = np.mgrid[:h, :w]
    if top is None:
        base = [np.where((yy + xx) % 2, 1e6, -1e6), (yy * 1e-7 + 3.0), np.full((h, w), 7.25),
                np.random.default_rng(1).standard_normal((h, w)) * 1e5]
        return [b.astype(np.float32) for b in base]
    return [
        np.where((yy + xx) % 2, top, 0).astype(dtype),  # checkerboard of the extremes
        (xx * top // (w - 1)).astype(dtype),  # ramp through every level
        np.full((h, w), top // 2, dtype),  # constant
        np.random.default_rng(2).integers(0, top + 1, (h, w)).astype(dtype),  # noise
        np.stack([np.full((h, w), top, dtype), np.zeros((h, w), dtype), (xx % 2 * top).astype(dtype)], 2),
    ]


@pytest.mark.parametrize(
    "dtype,bounds", [("uint8", (0, 1, 3, 10)), ("uint16", (0, 7, 300)), ("int16", (0, 7)),
                     ("float32", (0, 1e-3, 0.25, 1000.0))]
)
def test_error_bound_holds(dtype, bounds):
    for img in _adversarial(dtype) + [_image(dtype, (50, 61, 3), seed=9)]:
        for e in bounds:
            for model in MODELS:
                out = visemz.decompress(visemz.compress(img, model=model, quality=1, max_error=e))
                assert out.dtype == img.dtype
                assert max_abs_error(out, img) <= e, f"{dtype} {img.shape} {model} E={e}"


def test_error_bound_on_a_camera_image():
    img = data.camera()
    for e in (0, 2):
        buf = visemz.compress(img, model="balle2016", quality=3, max_error=e)
        assert max_abs_error(visemz.decompress(buf), img) <= e


def test_int16_images_are_coded_as_their_uint16_twins_and_come_back_int16():
    """CT slices in Hounsfield units: the header names int16 and its range in int16 levels; a region, a torch
    tensor and every bound come back int16, within the bound, the ends of the signed range included."""
    img = _image("int16", (40, 57), seed=4)
    img[0, :2] = (-32768, 32767)
    for e in (None, 0, 3):
        buf = visemz.compress(torch.from_numpy(img), quality=2, max_error=e)
        meta = container.unpack(buf).meta
        assert meta["dtype"] == "int16" and meta["range"] == [-32768.0, 32767.0]
        out, part = visemz.decompress(buf), visemz.decompress(buf, region=(3, 30, 10, 50))
        assert out.dtype == part.dtype == np.int16 and out.shape == img.shape
        if e is not None:
            assert max_abs_error(out, img) <= e and max_abs_error(part, img[3:30, 10:50]) <= e
    buf = visemz.compress(img[1:], max_error=0)
    assert container.unpack(buf).meta["range"] == [float(img[1:].min()), float(img[1:].max())]  # the image's levels
    for bad in ([-32769, 0], [0, 32768], [0.5, 3]):
        with pytest.raises(CorruptStreamError, match="int16"):
            visemz.decompress(with_meta(buf, range=bad))


def test_the_int16_view_is_x_plus_32768_and_comes_back_for_every_value():
    from visemz.image.pixels import coded_view, signed_view

    x = np.arange(-32768, 32768, dtype=np.int16)
    coded, signed = coded_view(torch.from_numpy(x))
    assert signed == "int16" and coded.dtype == torch.uint16
    np.testing.assert_array_equal(coded.view(torch.int16).numpy().view(np.uint16), x.astype(np.int32) + 32768)
    for px in (coded, coded.view(torch.int16).numpy().view(np.uint16)):  # a tensor and a NumPy decode
        back = signed_view(px, "int16")
        assert str(back.dtype).replace("torch.", "") == "int16"
        np.testing.assert_array_equal(np.asarray(back), x)


def test_torch_input():
    img = torch.from_numpy(_image("uint8", (33, 47, 3)))
    out = visemz.decompress(visemz.compress(img, max_error=0))
    np.testing.assert_array_equal(out, img.numpy())


@pytest.mark.parametrize(
    "bad,exc,word",
    [
        (np.zeros((8, 8), np.int64), UnsupportedFormatError, "int64"),
        (np.zeros((2, 8, 8, 3), np.uint8), UnsupportedFormatError, "(2, 8, 8, 3)"),
        (np.zeros((0, 8), np.uint8), InvalidArgumentError, "empty"),
        (np.array([[np.nan, 1.0]], np.float32), InvalidArgumentError, "NaN"),
        ([[1, 2], [3, 4]], UnsupportedFormatError, "list"),
        (np.zeros((8, 8), object), UnsupportedFormatError, "dtype object"),  # refused before torch sees them
        (np.zeros((8, 8), [("a", "u1")]), UnsupportedFormatError, "not numbers"),
        (torch.zeros(8, 8, device="meta"), UnsupportedFormatError, "meta device"),
    ],
)
def test_bad_images_are_named(bad, exc, word):
    with pytest.raises(exc, match=__import__("re").escape(word)):
        visemz.compress(bad)


def test_bad_arguments_are_named():
    img = _image("uint8", (16, 16))
    for bad in (9, 0.99, float("nan"), "4", None, True):
        with pytest.raises(InvalidArgumentError, match="quality="):
            visemz.compress(img, quality=bad)
    with pytest.raises(InvalidArgumentError, match="'jpeg'"):
        visemz.compress(img, model="jpeg")
    with pytest.raises(InvalidArgumentError, match="-1"):
        visemz.compress(img, max_error=-1)
    with pytest.raises(InvalidArgumentError, match="1.5"):
        visemz.compress(img, max_error=1.5)
    for bad in ("2", True, [2]):  # as quality: numbers only
        with pytest.raises(InvalidArgumentError, match="max_error="):
            visemz.compress(img, max_error=bad)
    buf = visemz.compress(img, max_error=np.int64(2))  # NumPy's numbers are numbers
    assert np.abs(visemz.decompress(buf, region=(np.int64(0), np.int64(8), 0, 8)).astype(int) - img[:8, :8]).max() <= 2
    with pytest.raises(UnsupportedFormatError, match="'lz4'"):
        visemz.ImageCodec(entropy="lz4")


def test_corrupt_files_raise_visemz_errors():
    buf = bytearray(visemz.compress(_image("uint8", (20, 30, 3)), max_error=1))
    rng = np.random.default_rng(0)
    for i in rng.choice(len(buf) * 8, 400, replace=False):
        buf[i // 8] ^= 1 << (i % 8)
        with pytest.raises(VisemzError):
            visemz.decompress(bytes(buf))
        buf[i // 8] ^= 1 << (i % 8)
    for cut in (0, 10, 40, len(buf) // 2, len(buf) - 1):
        with pytest.raises(VisemzError):
            visemz.decompress(bytes(buf[:cut]))
    visemz.decompress(bytes(buf))  # the undamaged file still decodes


def test_damaged_container_headers_are_corrupt():
    """Every bit of a file's container framing and compressed header (version 2), flipped: the checksum
    names it; and the header's zstd frame damaged behind a recomputed checksum is CorruptStreamError too."""
    img = _image("uint8", (20, 30, 3))
    buf = visemz.compress(img)
    c = container.unpack(buf)
    assert c.version == container.VERSION == 2 and buf[11] == 1
    head = len(buf) - sum(len(v) for v in c.sections.values())
    data = bytearray(buf)
    for i in range(head * 8):
        data[i // 8] ^= 1 << (i % 8)
        with pytest.raises((CorruptStreamError, UnsupportedFormatError)):
            visemz.decompress(bytes(data))
        data[i // 8] ^= 1 << (i % 8)
    lengths = write_varints([c.header_bytes, *(len(v) for v in c.sections.values())])
    stored = buf[20 + len(lengths):head]
    for k in range(len(stored)):
        bad = bytearray(stored)
        bad[k] ^= 0x21
        body = bytes(lengths) + bytes(bad) + b"".join(bytes(v) for v in c.sections.values())
        rebuilt = buf[:12] + struct.pack("<Q", xxhash.xxh64(buf[:12] + body).intdigest()) + body
        try:
            out = visemz.decompress(rebuilt)  # a changed literal may still make a valid header
        except VisemzError:
            continue
        assert out.shape == img.shape
    v1 = container.pack(c.kind, c.meta, {k: bytes(v) for k, v in c.sections.items()}, version=1)
    np.testing.assert_array_equal(visemz.decompress(v1), visemz.decompress(buf))  # version 1 files still decode


def test_hostile_headers_with_valid_checksums():
    buf = visemz.compress(_image("uint8", (20, 30)), max_error=0)
    tiles = container.unpack(buf).meta["tiles"]
    cases = [
        (dict(shape=[100000, 100000]), VisemzError),
        (dict(shape=[20, 31]), CorruptStreamError),
        (dict(dtype="float64"), UnsupportedFormatError),
        (dict(model_id="0000000000000000"), UnsupportedFormatError),
        (dict(format=11), UnsupportedFormatError),
        (dict(format=9), CorruptStreamError),  # the integer prior's format: a part this file has not (res_inputs)
        (dict(format=8), CorruptStreamError),  # parts format 8 has not: the differences
        (dict(format=7), CorruptStreamError),  # the channel-context models' format, not this model's
        (dict(format=6), CorruptStreamError),  # a part format 6 has not: the scale calibration
        (dict(residual="int"), CorruptStreamError),  # a learned residual read as a block-coded one
        (dict(residual_id="0000000000000000"), UnsupportedFormatError),
        (dict(format=2), VisemzError),  # rANS sections read as ints streams: damage, not garbage
        (dict(quality=8.5), CorruptStreamError),
        (dict(quality="high"), CorruptStreamError),
        (dict(residual="bits"), CorruptStreamError),
        (dict(colour=1), UnsupportedFormatError),
        (dict(symbols={"y": [1, 192, 2, 2]}), UnsupportedFormatError),  # formats 4 and 5 have tiles instead
        (dict(tiles=dict(tiles, grid=[2, 1])), CorruptStreamError),
        (dict(range=[5, 1]), CorruptStreamError),
    ]
    for change, exc in cases:
        with pytest.raises(exc):
            visemz.decompress(with_meta(buf, **change))
    c = container.unpack(buf)
    with pytest.raises(UnsupportedFormatError, match="tensor"):
        visemz.decompress(container.pack("tensor", dict(c.meta), {}))


def test_symbol_shapes_that_do_not_fit_the_image_are_corrupt():
    """Formats 2 and 3 name their symbol shapes; shapes of another image size are refused before decoding."""
    buf = visemz.ImageCodec("cpu").compress(_image("uint8", (20, 30)), image_format=3)
    symbols = container.unpack(buf).meta["symbols"]
    with pytest.raises(CorruptStreamError, match="do not fit"):
        visemz.decompress(with_meta(buf, symbols=dict(symbols, y=[1, 192, 2, 2])))


def test_weights_load_without_unpickling(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("weights must not be unpickled")

    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    W.load.cache_clear()
    try:
        for s in all_specs():
            net, model_id = W.load(s)
            assert len(model_id) == 16 and not net.training
    finally:
        W.load.cache_clear()


@pytest.mark.parametrize("model", MODELS)
def test_symbols_are_coded_with_per_block_widths(model):
    """Format 2's symbol sections use the per-block policy (smaller on trained latents than the
    global width); the block stream header records it."""
    buf = visemz.ImageCodec("cpu").compress(_image("uint8", (70, 90, 3)), model=model, quality=2, image_format=2)
    sections = container.unpack(buf).sections
    for name in ("y", "z") if model == "mbt2018-mean" else ("y",):
        parsed = stream.parse(sections[name])
        raw = entropy.decompress_cpu(parsed.frames, parsed.entropy, parsed.sizes)
        header = layout.parse_header(memoryview(raw))
        assert header.policy == layout.POLICIES["block"], name


def test_format_1_files_are_refused_by_name():
    """Files of the fixed-rate models (format 1) fail with an error that names the format version."""
    buf = visemz.compress(_image("uint8", (20, 30)))
    c = container.unpack(buf)
    meta = {k: v for k, v in c.meta.items() if k != "quality"}
    old = container.pack(c.kind, dict(meta, format=1, model="balle2016-gray-q3"),
                         {k: bytes(v) for k, v in c.sections.items()})
    with pytest.raises(UnsupportedFormatError, match="image format 1"):
        visemz.decompress(old)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("dtype,shape", [("uint8", (40, 52, 3)), ("uint8", (40, 52)), ("uint16", (40, 52)),
                                         ("uint16", (40, 52, 3))])
def test_fractional_qualities(model, dtype, shape):
    """Any float quality in [1, 8] compresses and decodes, is recorded in the file, and fractions
    between two integers give distinct latents (the gains are interpolated, not rounded)."""
    img = _image(dtype, shape, seed=5)
    files = {q: visemz.compress(img, model=model, quality=q) for q in (1, 2.5, 2.75, 8)}
    for q, buf in files.items():
        assert container.unpack(buf).meta["quality"] == q
        out = visemz.decompress(buf)
        assert out.dtype == img.dtype and out.shape == img.shape
    # the gain grows with quality (tenfold from 1 to 8 at initialisation), so do the latent symbols
    magnitude = {q: int(symbols_of(files[q])["y"].abs().sum()) for q in (1, 8)}
    assert magnitude[8] > magnitude[1]
    e = 2 if dtype == "uint8" else 300
    bounded = visemz.decompress(visemz.compress(img, model=model, quality=3.3, max_error=e))
    assert max_abs_error(bounded, img) <= e


@pytest.mark.parametrize("tf32", [0, 1])
def test_network_math_sets_tf32_from_the_setting_and_restores_the_callers(tf32):
    """VISEMZ_TF32 decides cuDNN's TF32 switch while any codec call runs (nested calls share it); the
    caller's own switch comes back when the last one leaves, and torch's matmul switch is never touched."""
    from visemz import defaults
    from visemz.image import codec

    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    with defaults.set(tf32=tf32):
        try:
            for matmul in (False, True):
                torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = not tf32, matmul
                with codec.network_math():
                    assert torch.backends.cudnn.allow_tf32 == bool(tf32)
                    with codec.network_math():
                        assert torch.backends.cudnn.allow_tf32 == bool(tf32)
                    assert torch.backends.cudnn.allow_tf32 == bool(tf32) and torch.is_inference_mode_enabled()
                    assert torch.backends.cuda.matmul.allow_tf32 == matmul
                assert torch.backends.cudnn.allow_tf32 == (not tf32) and torch.backends.cuda.matmul.allow_tf32 == matmul
        finally:
            torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def test_tf32_environment_setting(monkeypatch):
    check_switch_setting(monkeypatch, "VISEMZ_TF32", "tf32")
