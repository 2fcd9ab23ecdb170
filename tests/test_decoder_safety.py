"""Crafted files against the decoders: a header is checked field by field, every section's declared size is held
to what the header's shape allows before anything is allocated or any network runs, the float codecs' every
byte is under a checksum, and the public API refuses what it cannot honour.  Each test builds its own files.
"""

from __future__ import annotations

import json
import re
import struct
import tracemalloc

import numcodecs
import numpy as np
import pytest

import visemz
from visemz import config, container, defaults
from visemz.encoders import decode_ints, encode_ints, entropy, stream
from visemz.encoders import layout as L
from visemz.errors import CorruptStreamError, InvalidArgumentError, LimitExceededError, UnsupportedFormatError
from visemz.floats import ErrorBounded, Lossless
from visemz.floats.lossless import LL_HEAD
from visemz.framing import xxh64
from visemz.image import pages, residual_coder, tile_index
from visemz.models import registry
from visemz.models import weights as W
from visemz.zarr_codecs import VisemzErrorBounded, VisemzLossless

from .helpers import repack_header

HUGE = 1 << 29  # the block stream's own limit: what a bomb claims


# ------------------------------------------------------------------ crafting (and helpers.repack_header)
def sub(key: str, value: str):
    """A header edit: the first ``"key":value`` (a scalar or a flat list) replaced by ``value`` as raw JSON."""
    return lambda s: re.sub(r'"%s":(\[[^\]]*\]|[^,}]*)' % key, lambda m: f'"{key}":{value}', s, count=1)


def zero_stream(n: int, entropy_kind: str = "zstd") -> bytes:
    """An ints stream of ``n`` zeros built without the array: the per-block policy's all-zero block stream (a
    width byte per 32 values) behind zstd: a few KB that claim ``n`` values."""
    ntiles, meta = L.n_tiles(n), L.meta_size(L.POLICIES["block"], n)
    raw = L.Header(L.POLICIES["block"], True, 0, n, ntiles, 0).pack() + bytes(4 * ntiles + meta)
    kind = entropy.KINDS[entropy_kind]
    frames = [raw] if entropy_kind == "none" else entropy.compress_cpu(raw, kind)
    return stream.pack(len(raw), kind, defaults.get("entropy_chunk"), frames)


@pytest.fixture(scope="module")
def gray():
    return np.random.default_rng(0).integers(0, 256, (64, 64), dtype=np.uint8)


@pytest.fixture(scope="module")
def files(model_weights, gray):
    """Small files of every kind a bomb can hide in (format 5 unless named)."""
    codec = visemz.ImageCodec("cpu")
    f32 = gray.astype(np.float32) / 7
    return {
        "u8": codec.compress(gray, max_error=2),
        "f32": codec.compress(f32, max_error=0.5),
        "f32_bits": codec.compress(f32, max_error=0),
        "lossy": codec.compress(gray),
        "format2": codec.compress(gray, max_error=1, image_format=2),
        "format3": codec.compress(gray, max_error=1, image_format=3),
        "tiled": codec.compress(np.tile(gray, (2, 2)), max_error=1, tile=64),
        "mbt": codec.compress(gray, model="mbt2018-mean", max_error=1),
    }


def refused(buf, error=CorruptStreamError, match: str | None = None, budget_mb: float = 64.0):
    """``visemz.decompress(buf)`` raises ``error`` (matching ``match``) with at most ``budget_mb`` of traced
    (Python and NumPy) memory at its peak."""
    tracemalloc.start()
    try:
        with pytest.raises(error, match=match):
            visemz.decompress(buf, device="cpu")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < budget_mb * 2**20, f"{peak / 2**20:.0f} MB traced before the error"


# ------------------------------------------------------------------ header values
@pytest.mark.parametrize("key, value, field", [
    ("max_error", "1e400", "meta.max_error"),
    ("range", "[0.0,1e400]", "meta.range"),
    ("quality", "1" * 4400, "meta.quality"),
    ("shape", "[64,%s]" % ("9" * 30), r"meta.shape\[1\]"),
])
def test_non_finite_and_overlong_numbers_are_refused_naming_their_field(files, key, value, field):
    for name in ("u8", "f32"):
        refused(repack_header(files[name], sub(key, value)), match=field)


def test_info_reports_a_crafted_header_as_an_error_not_a_traceback(files, cli, tmp_path):
    for key, value in (("quality", "1" * 4400), ("max_error", "1e400"), ("quality", "-1e999")):
        path = tmp_path / "crafted.vsz"
        path.write_bytes(repack_header(files["u8"], sub(key, value)))
        result = cli("info", path)
        assert result.exit_code == 2 and "Traceback" not in result.output and key in result.output


@pytest.mark.parametrize("name, key, value, field", [
    ("u8", "format", "[5]", "format"),
    ("u8", "format", "true", "format"),
    ("u8", "entropy", '"lz4"', "entropy"),
    ("u8", "entropy", "1", "entropy"),
    ("u8", "range", "[0,0]", "range"),  # uint8's range is [0, 255]: another one would shift every pixel
    ("u8", "range", "[0,254.5]", "range"),
    ("u8", "max_error", "1e300", "max_error"),
    ("u8", "max_error", "256", "max_error"),
    ("u8", "max_error", "2.5", "max_error"),
    ("u8", "max_error", '"2"', "max_error"),
    ("u8", "model_id", '"../../../x"', "model_id"),
    ("u8", "shape", "[64,true]", "shape"),
    ("u8", "quality", "true", "quality"),
    ("f32", "max_error", "1e300", "max_error"),  # beyond float32: no float32 image has such a bound
    ("f32", "range", "[0,1e300]", "range"),
    ("f32", "range", "[0.1,36.4]", "range"),  # not float32 values: not what an encoder wrote
    ("f32", "residual", '"int"', "residual"),
])
def test_header_fields_are_checked_by_type_range_and_known_value(files, name, key, value, field):
    refused(repack_header(files[name], sub(key, value)), match=field)


def test_a_uint16_range_must_be_levels(model_weights):
    buf = visemz.compress(np.arange(64 * 64, dtype=np.uint16).reshape(64, 64), max_error=3, device="cpu")
    for value in ("[-1,4095]", "[0,70000]", "[0.5,4095]"):
        refused(repack_header(buf, sub("range", value)), match="range")


def test_the_model_variant_must_code_the_channel_count(files, gray):
    """A gray file relabelled RGB is refused, whatever codes its symbols (format 2: all block-coded)."""
    for name in ("format2", "u8"):
        refused(repack_header(files[name], sub("model", '"balle2016-rgb"')), match="model")
        # relabelled with an RGB shape too: the file names gray weights, which no RGB model loads
        refused(repack_header(files[name], lambda s: sub("shape", "[64,64,3]")(sub("model", '"balle2016-rgb"')(s))),
                UnsupportedFormatError)


def test_tile_fields_are_checked(files):
    for edit, field in ((sub("halo", "[32,true]"), "halo"), (sub("grid", "[true,2]"), "grid"),
                        (sub("size", "64.0"), "size")):
        refused(repack_header(files["tiled"], edit), match=field)


# ------------------------------------------------------------------ sizes before work
def test_a_small_ints_stream_claiming_many_values_is_refused_before_decompressing():
    bomb = zero_stream(HUGE)
    assert len(bomb) < 64 << 10
    for bounds in ({"count": 4096}, {"max_count": 4096}):
        with pytest.raises(CorruptStreamError, match="4096"):
            decode_ints(bomb, **bounds)
    small = encode_ints(np.zeros(5000, np.int32), policy="global", entropy="zstd")
    with pytest.raises(CorruptStreamError, match="5000 values where 4096"):
        decode_ints(small, count=4096)
    assert decode_ints(small, count=5000).size == decode_ints(small, max_count=5000).size == 5000


def test_a_raw_size_its_frames_cannot_hold_is_refused_before_anything_is_listed():
    """A raw size of about 3 GB with one frame of chunk 4096: refused from the numbers, not from a list of the
    800,000 frame bounds it would need."""
    small = encode_ints(np.zeros(100, np.int32), policy="block", entropy="zstd")
    parsed = stream.parse(small)
    crafted = stream.pack(stream.MAX_RAW, entropy.KINDS["zstd"], 4096, [bytes(f) for f in parsed.frames])
    tracemalloc.start()
    try:
        with pytest.raises(CorruptStreamError, match="frames for"):
            decode_ints(crafted)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_a_zstd_frame_declaring_more_than_its_chunk_is_refused_before_decompressing():
    frame = b"\x28\xb5\x2f\xfd\xe0" + (1 << 40).to_bytes(8, "little") + b"\x01\x00\x00"
    with pytest.raises(CorruptStreamError, match="declares 1099511627776 bytes"):
        decode_ints(stream.pack(4096, entropy.KINDS["zstd"], 4096, [frame]))


@pytest.mark.parametrize("name, section", [
    ("format3", "residual"), ("format3", "mask"), ("format2", "y"), ("u8", "tiles"), ("f32", "tiles"),
])
def test_a_section_claiming_too_many_values_is_refused_before_any_work(files, name, section):
    """The issue's bomb (a few KB of residual claiming 2^29 values took 7-9 GB): refused from the section's
    header, before the network runs, in a few MB."""
    buf = files[name]
    if section == "tiles":  # format 5: every part of the one tile in turn
        c = container.unpack(buf)
        t = c.meta["tiles"]
        index = tile_index.TileIndex(c.sections, 1, t["parts"], t["symbols"], c.meta["format"])
        for part in t["parts"]:
            if index.coding(0).get(part) == "rans":
                continue
            parts = {**index.sections(0), part: zero_stream(HUGE)}
            secs = tile_index.pack(t["parts"], t["symbols"], [(parts, index.coding(0))], c.meta["format"])
            refused(repack_header(buf, sections=secs), match=part)
        return
    refused(repack_header(buf, sections={section: zero_stream(HUGE)}), match=section)


def test_a_tiled_files_every_tile_is_checked_before_any_is_decoded(files):
    buf = files["tiled"]
    c = container.unpack(buf)
    t = c.meta["tiles"]
    n = t["grid"][0] * t["grid"][1]
    index = tile_index.TileIndex(c.sections, n, t["parts"], t["symbols"], c.meta["format"])
    tiles = [(index.sections(i), index.coding(i)) for i in range(n)]
    part = residual_coder.FIXES if residual_coder.FIXES in t["parts"] else "residual"  # an ints part of the residual
    tiles[-1] = ({**tiles[-1][0], part: zero_stream(HUGE)}, tiles[-1][1])
    refused(repack_header(buf, sections=tile_index.pack(t["parts"], t["symbols"], tiles, c.meta["format"])),
            match=f"tile {n - 1}")


def test_the_pixel_limit_is_checked_from_the_header(files):
    big = repack_header(files["lossy"], sub("shape", "[16384,16384]"))
    refused(big, CorruptStreamError, match="grid|symbol")  # within the default limit: the sections do not fit
    with defaults.set(max_pixels=1 << 20):
        refused(big, LimitExceededError, match="VISEMZ_MAX_PIXELS")
        with pytest.raises(LimitExceededError, match="VISEMZ_MAX_PIXELS"):
            visemz.compress(np.zeros((1025, 1024), np.uint8), device="cpu")


def test_the_pixel_limit_is_a_setting(monkeypatch):
    monkeypatch.setenv("VISEMZ_MAX_PIXELS", "4096")
    assert config.from_env().max_pixels == 4096
    for bad in ("0", str((1 << 30) + 1), "lots"):
        monkeypatch.setenv("VISEMZ_MAX_PIXELS", bad)
        with pytest.raises(InvalidArgumentError, match="VISEMZ_MAX_PIXELS"):
            config.from_env()


def test_a_float_chunk_is_sized_from_its_header():
    codec = VisemzErrorBounded(1e-3)
    x = _field(600).reshape(6, 100)
    buf = codec.encode(x)
    head = buf[:6] + struct.pack("<2Q", 1 << 15, 1 << 15)  # 2^30 values declared, checksum recomputed
    with pytest.raises(LimitExceededError, match="VISEMZ_MAX_PIXELS"):
        codec.decode(head + struct.pack("<Q", xxh64(head, buf[30:])) + buf[30:])
    with defaults.set(max_pixels=599), pytest.raises(LimitExceededError, match="VISEMZ_MAX_PIXELS"):
        codec.encode(x)


def test_a_page_stack_is_sized_from_its_header(files):
    """65,536 pages of 1024^2 (64 GiB) refused from the header; a page whose header disagrees with the stack
    refused before any page decodes."""
    huge = container.pack(pages.KIND, {"format": 1, "shape": [65536, 1024, 1024], "dtype": "uint8"},
                          {"index": struct.pack("<Q", len(files["lossy"])), "pages": files["lossy"]})
    refused(huge, LimitExceededError, match="VISEMZ_MAX_PIXELS")
    other = repack_header(files["lossy"], sub("shape", "[64,65]"))
    stack = pages.encode(np.stack([np.ones((64, 64), np.uint8), np.zeros((64, 64), np.uint8)]),
                         lambda page: files["lossy"] if page.any() else other)
    refused(stack, match="page 1")


def test_non_finite_float_pixels_are_refused(files):
    """A residual that turns a float32 image's pixel into inf is damage (inputs are always finite): here an
    exception listing pixel 7 with the bits of inf, every checksum recomputed."""
    c = container.unpack(files["f32"])
    t = c.meta["tiles"]
    index = tile_index.TileIndex(c.sections, 1, t["parts"], t["symbols"], c.meta["format"])
    parts = {**index.sections(0), "exceptions": encode_ints(np.array([7], np.int32)),
             "exception_bits": encode_ints(np.array([0x7F800000], np.int32))}
    secs = tile_index.pack(t["parts"], t["symbols"], [(parts, index.coding(0))], c.meta["format"])
    refused(repack_header(files["f32"], sections=secs), match="finite")


# ------------------------------------------------------------------ float codecs
def _field(n: int = 3000) -> np.ndarray:
    return np.cumsum(np.random.default_rng(1).standard_normal(n)).astype(np.float32)


def test_the_float_codec_reproducers_raise():
    x = _field()
    s = bytearray(Lossless().encode(x))
    s[LL_HEAD.size + 8 + 32 + 1125 + 10] ^= 0x10  # a sign or mantissa bit of a value
    with pytest.raises(CorruptStreamError):
        Lossless().decode(bytes(s))
    for at, value in ((6, 0), (5, 1)):  # predictor 1 -> 0, dtype float32 -> float16
        e = bytearray(ErrorBounded(1e-3).encode(x))
        e[at] = value
        with pytest.raises(CorruptStreamError):
            ErrorBounded(1e-3).decode(bytes(e))
    codec = VisemzErrorBounded(1e-3)
    z = bytearray(codec.encode(x.reshape(30, 100)))
    z[6:14], z[14:22] = z[14:22], z[6:14]  # the chunk's dimensions swapped
    with pytest.raises(CorruptStreamError):
        codec.decode(bytes(z))


@pytest.mark.parametrize("make", [
    lambda x: (ErrorBounded(1e-3, "none").encode(x), ErrorBounded(1e-3).decode),
    lambda x: (ErrorBounded(1e-3, "lorenzo2d").encode(x.reshape(5, 40)), ErrorBounded(1e-3).decode),
    lambda x: (Lossless().encode(x), Lossless().decode),
    lambda x: (VisemzErrorBounded(1e-3).encode(x.reshape(4, 50)), VisemzErrorBounded(1e-3).decode),
    lambda x: (VisemzLossless().encode(x.reshape(4, 50)), VisemzLossless().decode),
], ids=["eb", "eb-2d", "lossless", "zarr-eb", "zarr-lossless"])
def test_every_byte_of_a_float_stream_is_under_its_checksum(make):
    x = _field(200)
    buf, decode = make(x)
    for at in range(len(buf)):
        for flip in (0x01, 0x80):
            bad = bytearray(buf)
            bad[at] ^= flip
            with pytest.raises((CorruptStreamError, UnsupportedFormatError)):  # a version byte: an unknown version
                decode(bytes(bad))


def test_float_streams_are_held_to_their_callers_count_before_allocating():
    x = _field(1000)
    with pytest.raises(CorruptStreamError, match="999"):
        ErrorBounded(1e-3).decode(ErrorBounded(1e-3).encode(x), count=999)
    with pytest.raises(CorruptStreamError, match="999"):
        Lossless().decode(Lossless().encode(x), count=999)
    # an error-bounded stream's ints stream has no entropy stage: a zstd one (a bomb's vehicle) is refused
    codec = ErrorBounded(1e-3)
    with pytest.raises(CorruptStreamError, match="entropy"):
        codec.decode(codec.frame(zero_stream(HUGE), "float32"))
    # and its block stream is the per-block policy, bitshuffled, as every writer makes it
    r = np.arange(-50, 50, dtype=np.int32)
    for policy, shuffle in (("block", False), ("global", True)):
        with pytest.raises(CorruptStreamError, match="bitshuffled"):
            codec.decode(codec.frame(encode_ints(r, policy=policy, bitshuffle=shuffle, entropy="none"), "float32"))


def test_numcodecs_configs():
    with pytest.raises(InvalidArgumentError, match="eb"):
        numcodecs.get_codec({"id": "visemz_eb"})
    assert numcodecs.get_codec({"id": "visemz_eb", "eb": 1e-3}).get_config() == VisemzErrorBounded(1e-3).get_config()
    c = numcodecs.get_codec({"id": "visemz_eb", "eb": np.float32(1e-3)})
    assert c.eb == float(np.float32(1e-3)) and type(c.get_config()["eb"]) is float
    json.dumps(c.get_config())  # what Zarr writes to .zarray
    for bad in (True, "1e-3", 0.0, -1.0, float("nan")):
        with pytest.raises(InvalidArgumentError):
            VisemzErrorBounded(bad)


# ------------------------------------------------------------------ the public API
def test_max_error_beyond_the_dtype_is_an_argument_error(gray):
    for image, bad in ((gray, 1e30), (gray, 256), (gray.astype(np.uint16), 65536),
                       (gray.astype(np.float32), 1e39)):
        with pytest.raises(InvalidArgumentError, match="max_error"):
            visemz.compress(image, max_error=bad, device="cpu")


def test_big_endian_arrays_are_taken(model_weights, gray):
    for dtype, e in ((">u2", 0), (">f4", 0), (">f4", 0.5)):
        x = gray.astype(dtype)
        out = visemz.decompress(visemz.compress(x, max_error=e, device="cpu"), device="cpu")
        assert out.dtype == x.dtype.newbyteorder("=") and \
            np.abs(out.astype(np.float64) - x.astype(np.float64)).max() <= e
    x = _field(300).astype(">f4")
    assert np.array_equal(Lossless().decode(Lossless().encode(x)), x.astype("<f4"))
    assert np.abs(ErrorBounded(1e-3).decode(ErrorBounded(1e-3).encode(x)) - x).max() <= 1.001e-3
    assert np.array_equal(VisemzLossless().decode(VisemzLossless().encode(x.reshape(3, 100))), x.reshape(3, 100))


# ------------------------------------------------------------------ weights by id
def test_weights_load_by_the_id_a_file_names(model_weights):
    spec = registry.parse("balle2016-gray")
    _, installed = W.load(spec)
    assert W.load(spec, "cpu", installed)[1] == installed
    with pytest.raises(UnsupportedFormatError, match="0123456789abcdef"):
        W.load(spec, "cpu", "0123456789abcdef")
    archived = sorted((W.weights_dir() / W.ARCHIVE).glob("*.safetensors.zst"))
    if not archived:
        pytest.skip("no archived weights in this weights folder")
    for path in archived:
        model_id = path.name.split(".")[0]
        meta = W.tensors_of(W.read_archived(model_id, "a test"))[1]
        if "spec" not in meta:  # an archived residual prior (tests/test_weights_archive.py)
            continue
        stored = json.loads(meta["spec"])
        own = registry.spec(stored["arch"], stored["variant"])
        assert W.load(own, "cpu", model_id)[1] == model_id
        other = registry.spec(stored["arch"], "rgb" if stored["variant"] == "gray" else "gray")
        with pytest.raises(UnsupportedFormatError, match=own.name):  # another model's weights are never loaded
            W.load(other, "cpu", model_id)


def test_the_weights_stay_within_their_budget():
    """Installed and archived weights together: the package's budget is 64 MB (the package's own folder: the
    tests' weights folder may hold random weights of a model that ships none)."""
    folder = W.package_dir()
    total = sum(p.stat().st_size for p in folder.rglob("*") if p.name.endswith((".safetensors", ".safetensors.zst")))
    assert total <= 64 * 10**6, f"{total / 1e6:.1f} MB of weights"
