"""visemz's numcodecs codecs (visemz/zarr_codecs.py): round trips with their guarantees, configs through
JSON and the numcodecs registry (entry points: visemz must be installed, as CI does), a Zarr v2 array."""

import json
import re
import struct

import numcodecs
import numpy as np
import pytest
import zarr
from numcodecs.registry import get_codec
from skimage import data

from visemz import container
from visemz.errors import CorruptStreamError, InvalidArgumentError, UnsupportedFormatError
from visemz.framing import xxh64
from visemz.zarr_codecs import Visemz, VisemzErrorBounded, VisemzLossless

IDS = {"visemz": Visemz, "visemz_eb": VisemzErrorBounded, "visemz_lossless": VisemzLossless}
CONFIGS = [
    {"id": "visemz", "quality": 6, "max_error": 0},
    {"id": "visemz", "quality": 2.5, "max_error": 0.25, "model": "balle2016", "device": "cpu", "layout": "zhw"},
    {"id": "visemz", "quality": 3, "tile": 256},
    {"id": "visemz_eb", "eb": 1e-3},
    {"id": "visemz_lossless"},
]


def _planes(dtype: str) -> dict[str, np.ndarray]:
    """2-D, (H, W, 3) and (Z, H, W) chunks of real images in ``dtype``."""
    cam = data.camera()[96:224, 160:288]
    rgb = data.astronaut()[64:192, 128:256]
    stack = np.stack([data.camera()[:128, :96], data.moon()[200:328, 100:196], data.coins()[:128, :96],
                      data.camera()[300:428, 400:496]])  # 4 planes: the gray model, as a batch
    if dtype == "uint8":
        return {"2d": cam, "hwc": rgb, "zhw": stack}
    scale = {"uint16": 257, "int16": 257, "float32": 1 / 255, "float16": 1 / 255}[dtype]
    shift = -32768 if dtype == "int16" else 0  # the signed range, both ends
    return {k: (v.astype(np.float64) * scale + shift).astype(dtype)
            for k, v in {"2d": cam, "hwc": rgb, "zhw": stack}.items()}


def _psnr(a: np.ndarray, b: np.ndarray, peak: float) -> float:
    return 10 * np.log10(peak**2 / np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))


# ------------------------------------------------------------------------------- registry, configs
@pytest.mark.parametrize("codec_id", sorted(IDS))
def test_entry_point_finds_codec(codec_id):
    # fails (never skips) without the entry points: CI installs visemz with pip install -e .[test]
    assert codec_id in numcodecs.registry.entries, f"entry point {codec_id!r} missing: pip install -e .[test]"
    config = next(c for c in CONFIGS if c["id"] == codec_id)
    assert type(get_codec(config)) is IDS[codec_id]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c["id"])
def test_config_json_round_trip(config):
    codec = get_codec(config)
    again = numcodecs.get_codec(json.loads(json.dumps(codec.get_config())))
    assert type(again) is type(codec) and again.get_config() == codec.get_config() and again == codec
    assert all(codec.get_config()[k] == v for k, v in config.items())
    direct = type(codec).from_config({k: v for k, v in codec.get_config().items() if k != "id"})
    assert direct == codec


@pytest.mark.parametrize("config", [
    {"id": "visemz", "quality": 9}, {"id": "visemz", "quality": "high"}, {"id": "visemz", "max_error": -1},
    {"id": "visemz", "model": "jpeg"}, {"id": "visemz", "layout": "xyz"}, {"id": "visemz", "device": "tpu"},
    {"id": "visemz", "tile": 100},
    {"id": "visemz_eb", "eb": 0}, {"id": "visemz_eb", "eb": float("nan")},
])
def test_bad_config_names_the_value(config):
    key = next(k for k in config if k != "id")
    with pytest.raises(InvalidArgumentError, match=key):
        get_codec(config)


def test_numpy_numbers_make_a_json_config():
    """A config built from NumPy's numbers (read from an array's attributes, say) is accepted and stays JSON."""
    codec = get_codec({"id": "visemz", "max_error": np.int64(2), "tile": np.int64(512), "quality": np.float32(3)})
    config = json.loads(json.dumps(codec.get_config()))
    assert (config["max_error"], config["tile"], config["quality"]) == (2, 512, 3.0)
    for bad in ({"id": "visemz", "max_error": np.bool_(True)}, {"id": "visemz", "tile": np.float64(512)}):
        with pytest.raises(InvalidArgumentError, match=next(k for k in bad if k != "id")):
            get_codec(bad)


# ----------------------------------------------------------------------------------- float codecs
def _special_floats(dtype: str) -> np.ndarray:
    info = np.finfo(dtype)
    return np.array([0.0, -0.0, np.inf, -np.inf, np.nan, info.tiny / 4, info.max, -info.max, 1.0], dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("layout", ["2d", "hwc", "zhw"])
def test_lossless_bit_exact(dtype, layout):
    x = _planes(dtype)[layout].copy()
    x.reshape(-1)[: 9] = _special_floats(dtype)  # NaN, infinities, a subnormal, -0 keep their bits
    codec = VisemzLossless()
    y = codec.decode(codec.encode(x))
    assert y.shape == x.shape and y.dtype == x.dtype
    bits = np.uint32 if dtype == "float32" else np.uint16
    assert np.array_equal(y.view(bits), x.view(bits))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("layout", ["2d", "hwc", "zhw"])
@pytest.mark.parametrize("eb", [1e-3, 0.02])
def test_error_bounded_within_eb(dtype, layout, eb):
    rng = np.random.default_rng(7)
    x = (_planes("float32")[layout] + rng.normal(0, 0.01, _planes("float32")[layout].shape)).astype(dtype)
    codec = VisemzErrorBounded(eb)
    y = codec.decode(codec.encode(x))
    assert y.shape == x.shape and y.dtype == x.dtype
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    # the documented bound: eb on the float64 reconstruction, plus the dtype's rounding (half an ulp)
    # and the float64 tie slack of the collectives codec
    bound = eb + np.spacing(np.abs(y)).astype(np.float64) / 2 + 4 * np.finfo(np.float64).eps * np.abs(x64)
    assert np.all(np.abs(y64 - x64) <= bound)
    if dtype == "float32":  # float32's rounding at these magnitudes (<= 1) is far below eb
        assert np.abs(y64 - x64).max() <= eb * (1 + 1e-4)


def test_float_codec_honours_out_and_checks_its_header():
    x = np.arange(60, dtype=np.float32).reshape(3, 4, 5) / 7
    codec = VisemzLossless()
    enc = codec.encode(x)
    out = np.empty_like(x)
    assert codec.decode(enc, out=out) is out and np.array_equal(out, x)
    flat = np.empty(60, np.float32)
    codec.decode(enc, out=flat)
    assert np.array_equal(flat, x.reshape(-1))
    with pytest.raises(CorruptStreamError):
        codec.decode(enc[:8])  # header cut inside the sizes
    head = enc[:6] + np.array([4, 3, 5], "<u8").tobytes()  # dimensions swapped, the same count
    with pytest.raises(CorruptStreamError, match="checksum"):
        codec.decode(head + enc[30:])
    # checksum recomputed: the stream's count is held to the shape's
    head = enc[:6] + np.array([3, 4, 6], "<u8").tobytes()
    with pytest.raises(CorruptStreamError, match="72"):
        codec.decode(head + struct.pack("<Q", xxh64(head, enc[38:])) + enc[38:])
    with pytest.raises(InvalidArgumentError, match="eb"):  # the stream records its eb
        VisemzErrorBounded(2e-3).decode(VisemzErrorBounded(1e-3).encode(x))


@pytest.mark.parametrize("codec", [VisemzErrorBounded(1e-3), VisemzLossless()], ids=["eb", "lossless"])
@pytest.mark.parametrize("dtype", ["uint8", "int32", "float64"])
def test_float_codecs_refuse_other_dtypes(codec, dtype):
    with pytest.raises(UnsupportedFormatError, match=dtype):
        codec.encode(np.zeros((4, 4), dtype))


# ----------------------------------------------------------------------------------- image codec
@pytest.mark.parametrize(("dtype", "max_error"), [("uint8", 0), ("uint8", 3), ("uint16", 0), ("uint16", 200),
                                                  ("int16", 0), ("int16", 200), ("float32", 0.004)])
@pytest.mark.parametrize("layout", ["2d", "hwc", "zhw"])
def test_image_codec_max_error(dtype, max_error, layout):
    x = _planes(dtype)[layout]
    codec = Visemz(quality=3, max_error=max_error, layout="zhw" if layout == "zhw" else "hwc")
    y = codec.decode(codec.encode(x))
    assert y.shape == x.shape and y.dtype == x.dtype
    err = np.abs(y.astype(np.float64) - x.astype(np.float64)).max()
    assert err <= max_error, err
    out = np.empty_like(x)
    assert codec.decode(codec.encode(x), out=out) is out and np.array_equal(out, y)


def test_image_codec_lossy_psnr_floor():
    cam = data.camera()
    codec = Visemz(quality=6)
    y = codec.decode(codec.encode(cam))
    assert y.shape == cam.shape and y.dtype == cam.dtype
    assert _psnr(y, cam, 255) >= 34  # measured 35.05 dB with mbt2018-mean (CPU)


@pytest.mark.parametrize(("shape", "dtype"), [((8, 8), "int32"), ((8, 8), "float64"), ((8, 8), "bool"),
                                              ((64,), "uint8"), ((2, 2, 8, 8), "uint16")])
def test_image_codec_refuses_chunk(shape, dtype):
    with pytest.raises(UnsupportedFormatError,
                       match=re.escape(dtype if dtype not in ("uint8", "uint16") else str(shape))):
        Visemz().encode(np.zeros(shape, dtype))


def test_image_codec_refuses_too_many_planes():
    with pytest.raises(UnsupportedFormatError, match="65 planes"):
        Visemz(layout="zhw").encode(np.zeros((65, 8, 8), np.uint8))


# ------------------------------------------------------------------------------------------- Zarr
def _mosaic() -> np.ndarray:
    """512x768 uint16 from three scikit-image images, with a gradient so it uses more than 8 bits."""
    m = np.hstack([data.camera(), data.moon()[:, 128:384]]).astype(np.uint16) * 200
    return m + np.arange(768, dtype=np.uint16)[None, :] * 8


@pytest.mark.slow
@pytest.mark.parametrize("max_error", [0, None], ids=["exact", "lossy"])
def test_zarr_array_with_visemz_codec(tmp_path, max_error):
    m = _mosaic()[:256, 384:768]  # both images of the mosaic, six chunks
    path = str(tmp_path / "mosaic.zarr")
    z = zarr.open(path, mode="w", shape=m.shape, chunks=(128, 128), dtype="uint16",
                  compressor=Visemz(quality=6, max_error=max_error))
    z[:] = m
    assert sum(len(v) for k, v in z.store.items() if not k.startswith(".")) < m.nbytes
    r = zarr.open(path, mode="r")  # the codec comes back from .zarray's JSON through the registry
    assert isinstance(r.compressor, Visemz) and r.compressor.max_error == max_error
    region = r[50:200, 100:350]
    assert region.shape == (150, 250) and region.dtype == np.uint16
    if max_error == 0:
        assert np.array_equal(region, m[50:200, 100:350]) and np.array_equal(r[:], m)
    else:
        assert _psnr(region, m[50:200, 100:350], 65535) >= 36  # measured 45.7 dB (CPU)


def test_chunks_larger_than_a_tile_go_tile_by_tile(tmp_path):
    """A Zarr array whose (Z, H, W) chunks span several tiles: written tiled, read back through the
    registry, a region within the error bound (and a chunk's bytes decode as a tiled image)."""
    m = _mosaic()[None, 100:300, 200:480]  # four chunks, each 2 x 2 tiles
    codec = get_codec({"id": "visemz", "quality": 4, "max_error": 40, "layout": "zhw", "tile": 128, "device": "cpu"})
    assert container.unpack(codec.encode(m[:, :150, :140])).meta["tiles"]["grid"] == [2, 2]
    path = str(tmp_path / "stack.zarr")
    z = zarr.open(path, mode="w", shape=m.shape, chunks=(1, 150, 140), dtype="uint16", compressor=codec)
    z[:] = m
    r = zarr.open(path, mode="r")
    assert r.compressor == codec and r.nchunks == 4
    region = r[:, 20:190, 100:270]
    assert np.abs(region.astype(np.int64) - m[:, 20:190, 100:270]).max() <= 40


@pytest.mark.gpu
def test_image_codec_chunks_cross_devices(model_weights):
    """A chunk written on the GPU decodes on the CPU and back, within its bound (exact at max_error 0)."""
    x = _planes("uint16")["zhw"]
    for max_error in (0, 300):
        gpu, cpu = (Visemz(quality=5, max_error=max_error, layout="zhw", device=d) for d in ("cuda", "cpu"))
        for enc, dec in ((gpu, cpu), (cpu, gpu)):
            y = dec.decode(enc.encode(x))
            assert y.shape == x.shape and np.abs(y.astype(np.int64) - x.astype(np.int64)).max() <= max_error
