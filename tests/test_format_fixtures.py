"""Committed format fixtures: files already written keep decoding, and today's writers write the same bytes.

``tests/fixtures/`` holds small encoded files with their inputs, one or more per stream kind and
format version (written by ``tools/make_format_fixtures.py``, which adds fixtures for a new
version and never rewrites old ones), as numcodecs' ``check_backwards_compatibility`` does.
Each is decoded and held to the arrays stored with it; where its version is the one the code
writes today, the inputs are encoded again and must give the same bytes, on the CPU and (``xp``
cupy) on the GPU.  zstd frames are compared by content on the GPU (nvCOMP's frames are other
bytes than libzstd's, decoding to the same block stream; docs/FORMAT.md, section 2).

Image and page files are decoded to pixels, with the weights each file names (the installed ones or
the archive's: a weights update keeps every file readable), and held to the file's promise: within
``max_error`` of the stored image, or for a lossy file close to its stored reconstruction (fixtures
written before those were stored: a loose PSNR against the image).  Format 1 (visemz 0.1's fixed-rate
models) is refused by name.  Their container is also parsed and re-packed, and each integer section
decoded to the stored symbols and encoded again to the same section bytes.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import zstandard

import visemz
from visemz import container, defaults, zarr_codecs
from visemz.device import as_numpy
from visemz.encoders import decode_ints, encode_ints, entropy, gpu, reference, stream
from visemz.encoders import layout as L
from visemz.encoders import rans_layout as RL
from visemz.errors import UnsupportedFormatError
from visemz.floats import ErrorBounded, Lossless
from visemz.floats.error_bounded import EB_VERSION
from visemz.floats.lossless import LL_VERSION
from visemz.image import codec as image_codec
from visemz.image import differences, image_header, latents, pages, residual, residual_coder, tile_index
from visemz.image.pixels import ImageMeta
from visemz.measure import psnr

from .helpers import optional

FIXTURES = Path(__file__).parent / "fixtures"
MANIFEST = json.loads((FIXTURES / "fixtures.json").read_text())
WRITTEN_WITH = MANIFEST["written_with"]
CURRENT = {"block": L.VERSION, "ints": stream.VERSION, "image": image_codec.FORMAT, "pages": pages.FORMAT,
           "residual": image_codec.FORMAT, "eb": EB_VERSION, "ll": LL_VERSION,
           "nchunk": zarr_codecs.SHAPE_VERSION}


def of(kind: str) -> list:
    return [pytest.param(f, id=f["name"]) for f in MANIFEST["fixtures"] if f["kind"] == kind]


def load(f: dict) -> tuple[bytes, dict]:
    with np.load(FIXTURES / f["inputs"], allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    return (FIXTURES / f["file"]).read_bytes(), arrays


# versions still written beside the current one (none today: every stream kind writes one version)
ALSO_WRITTEN: dict[str, set[int]] = {}


def writes_today(f: dict) -> bool:
    """Whether the code still writes this fixture's version (older versions are only read)."""
    return f["version"] == CURRENT[f["kind"]] or f["version"] in ALSO_WRITTEN.get(f["kind"], ())


def skip_unless_written_alike() -> None:
    """zstd frames and the frame size depend on VISEMZ_ZSTD_LEVEL and VISEMZ_ENTROPY_CHUNK."""
    level, chunk = defaults.get("zstd_level"), defaults.get("entropy_chunk")
    if (level, chunk) != (WRITTEN_WITH["zstd_level"], WRITTEN_WITH["entropy_chunk"]):
        pytest.skip(f"zstd level {level} / frame size {chunk} set in the environment "
                    f"differ from the fixtures' {WRITTEN_WITH['zstd_level']} / {WRITTEN_WITH['entropy_chunk']}")


def block_stream_of(buf) -> bytes:
    """The block stream inside an ints stream (its zstd frames decompressed)."""
    parsed = stream.parse(buf)
    if parsed.entropy == entropy.KINDS["none"]:
        return bytes(parsed.frames[0])
    return entropy.decompress_cpu(parsed.frames, parsed.entropy, parsed.sizes)


def assert_same_ints_stream(got: bytes, want: bytes, exact: bool) -> None:
    """Same header fields and frame count, the same block stream; with ``exact`` the same bytes."""
    a, b = stream.parse(got), stream.parse(want)
    assert (a.entropy, a.raw_size, a.chunk, len(a.frames)) == (b.entropy, b.raw_size, b.chunk, len(b.frames))
    assert block_stream_of(got) == block_stream_of(want)
    if exact or a.entropy == entropy.KINDS["none"]:
        assert got == want


def check_section(name: str, body, values: np.ndarray) -> None:
    """An ints-stream section decodes to the stored integers, which encode again to the same bytes."""
    np.testing.assert_array_equal(decode_ints(body), values, err_msg=name)
    raw = block_stream_of(body)
    hdr = L.parse_header(memoryview(raw))
    again = encode_ints(values, policy=L.POLICY_NAMES[hdr.policy], bitshuffle=hdr.bitshuffle,
                        entropy=entropy.NAMES[stream.parse(body).entropy])
    assert_same_ints_stream(again, bytes(body), exact=zstandard.__version__ == WRITTEN_WITH["zstandard"])


def check_rans_section(name: str, body, symbols: np.ndarray) -> None:
    """A conditional rANS section: its layout, checksum and symbol count (decoding it needs the tables of
    the weights it was written with, which change; tests/fixtures/rans/ holds the coder's own fixtures)."""
    tables_id = (RL.PREFIX if bytes(body[4:5]) == b"\x01" else RL.PREFIX2).unpack_from(bytes(body))[-1]
    parsed = RL.parse(bytes(body), symbols.size, tables_id)
    assert (parsed.skip.total if parsed.skip.freq else parsed.plan.n) == symbols.size, name  # version 3: all symbols


# ------------------------------------------------------------------ the collection itself
def test_every_format_version_written_today_has_a_fixture():
    have = {(f["kind"], f["version"]) for f in MANIFEST["fixtures"]}
    missing = sorted((k, v) for k, v in CURRENT.items() if (k, v) not in have)
    assert not missing, \
        f"no fixture for {missing}: run python tools/make_format_fixtures.py (it adds, never rewrites)"


def test_the_integer_prior_format_has_fixtures():
    """Format 9 (the integer residual prior) is written on request beside the current format."""
    assert {f["version"] for f in MANIFEST["fixtures"] if f["kind"] == "image"} >= {image_codec.image_header.INTEGER}


def test_the_channel_context_format_has_fixtures():
    """Format 7 is written beside the current format, for the channel-context models alone."""
    assert {f["version"] for f in MANIFEST["fixtures"] if f["kind"] == "image"} >= {image_codec.CONTEXT}


def test_the_container_version_written_today_has_fixtures():
    """Image and page files are fixtures of their container version too (``settings.container``)."""
    for kind in ("image", "pages"):
        have = {f["settings"]["container"] for f in MANIFEST["fixtures"] if f["kind"] == kind}
        assert container.VERSION in have, f"no {kind} fixture in container version {container.VERSION}: " \
                                          f"run python tools/make_format_fixtures.py"


def test_fixture_containers_are_of_their_stated_version():
    for f in MANIFEST["fixtures"]:
        if f["kind"] in ("image", "pages"):
            buf = (FIXTURES / f["file"]).read_bytes()
            assert container.unpack(buf).version == f["settings"]["container"], f["name"]


def test_the_manifest_names_every_fixture_file():
    named = {f[key] for f in MANIFEST["fixtures"] for key in ("file", "inputs")}
    # sub-folders hold fixtures with tests of their own (rans/: tests/test_rans.py)
    assert named == {p.name for p in FIXTURES.iterdir() if p.is_file()} - {"fixtures.json"}


# ------------------------------------------------------------------ block and ints streams
@pytest.mark.parametrize("f", of("block"))
def test_block_streams(f, xp):
    raw, arrays = load(f)
    v = arrays["values"]
    hdr = L.parse_header(memoryview(raw))
    assert (L.POLICY_NAMES[hdr.policy], hdr.bitshuffle, hdr.n) == \
        (f["settings"]["policy"], f["settings"]["bitshuffle"], v.size)
    if xp is np:
        decoded, again = reference.decode(raw), (lambda: reference.encode(v, hdr.policy, hdr.bitshuffle))
    else:
        decoded = gpu.decode_block_stream(xp.asarray(np.frombuffer(raw, np.uint8)))
        again = lambda: gpu.encode_raw(xp.asarray(v), hdr.policy, hdr.bitshuffle).get().tobytes()
    np.testing.assert_array_equal(as_numpy(decoded), v)
    if writes_today(f):
        assert again() == raw


@pytest.mark.parametrize("f", of("ints"))
def test_ints_streams(f, xp):
    buf, arrays = load(f)
    v, s = arrays["values"], f["settings"]
    on_gpu = xp is not np
    if on_gpu and s["entropy"] != "none":
        optional("nvidia.nvcomp")  # the GPU's zstd
    np.testing.assert_array_equal(as_numpy(decode_ints(buf, device="cuda" if on_gpu else "cpu")), v)
    if writes_today(f):
        skip_unless_written_alike()
        again = encode_ints(xp.asarray(v), policy=s["policy"], bitshuffle=s["bitshuffle"], entropy=s["entropy"])
        assert_same_ints_stream(again, buf, exact=not on_gpu and zstandard.__version__ == WRITTEN_WITH["zstandard"])


# ------------------------------------------------------------------ .vsz files
def assert_repacks(c: container.Container, buf: bytes) -> None:
    """The container written again from what it holds, in its own version, is the same bytes (version 2's
    header is a zstd frame: with another zstandard than the fixtures', the same header and sections)."""
    again = container.pack(c.kind, c.meta, {k: bytes(v) for k, v in c.sections.items()}, c.version)
    if c.version == 1 or zstandard.__version__ == WRITTEN_WITH["zstandard"]:
        assert again == buf
    else:
        other = container.unpack(again)
        assert (other.kind, other.meta, {k: bytes(v) for k, v in other.sections.items()}) == \
            (c.kind, c.meta, {k: bytes(v) for k, v in c.sections.items()})


def check_image_container(buf: bytes, arrays: dict, prefix: str = "") -> container.Container:
    """Container parse and re-pack, and every section against its stored integers (no pixels)."""
    c = container.unpack(buf)
    assert c.kind == "image"
    if c.meta["format"] in image_codec.TILED_FORMATS:
        check_tiles(c, arrays, prefix)
        assert_repacks(c, buf)
        return c
    stored = {k.removeprefix(f"{prefix}section_"): a for k, a in arrays.items() if k.startswith(f"{prefix}section_")}
    assert sorted(c.sections) == sorted(stored)
    for name, shape in c.meta["symbols"].items():
        assert stored[name].size == int(np.prod(shape)), name
    skip_unless_written_alike()
    rans = latents.rans_sections(c.meta)
    for name, body in c.sections.items():
        if name in rans:
            check_rans_section(name, body, stored[name])
        elif len(body) or stored[name].size:
            check_section(name, body, stored[name])
    assert_repacks(c, buf)
    return c


def check_tiles(c: container.Container, arrays: dict, prefix: str) -> None:
    """A tiled image (format 4 or 5): the tile index splits the tiles section, and every tile's parts hold
    the stored integers, as a format-3 section does."""
    t = c.meta["tiles"]
    n = t["grid"][0] * t["grid"][1]
    index = tile_index.TileIndex(c.sections, n, t["parts"], t["symbols"], c.meta["format"])
    stored = {k.removeprefix(prefix): a for k, a in arrays.items() if k.startswith(f"{prefix}tile")}
    assert sorted(stored) == sorted(f"tile{i}_section_{p}" for i in range(n) for p in t["parts"])
    skip_unless_written_alike()
    for i in range(n):
        coding = index.coding(i)
        for name in t["parts"]:
            body, want = index.part(i, name), stored[f"tile{i}_section_{name}"]
            if coding.get(name) == "rans":
                check_rans_section(f"tile {i} {name}", body, want)
            elif name in residual_coder.STEP_SECTIONS or name == differences.DIFFS:  # layout, checksum, count
                count = [RL.parse(bytes(body), None, None).plan.n] if len(body) else []
                assert count == list(want), name
            elif name == residual_coder.SCALES:  # the scale calibration's shifts, a zstd frame of bytes
                np.testing.assert_array_equal(residual_coder.unpack_scales(body), want, err_msg=name)
                if zstandard.__version__ == WRITTEN_WITH["zstandard"]:
                    assert residual_coder.pack_scales(want) == bytes(body), name
            elif len(body) or want.size:
                check_section(f"tile {i} {name}", body, want)


@pytest.mark.parametrize("f", of("image"))
def test_image_files(f):
    buf, arrays = load(f)
    c = check_image_container(buf, arrays)
    img = arrays["image"]
    assert c.meta["format"] == f["version"] and c.meta["dtype"] == img.dtype.name and c.meta["shape"] == list(img.shape)
    assert c.meta["max_error"] == f["settings"]["max_error"]


# A lossy fixture's pixels against its stored image when no reconstruction was stored with it: the files are
# quality-1 codings of small noisy images (27.7-29.1 dB when written), so this only tells pixels from garbage.
LOSSY_PSNR = 22.0
# ... and against the stored reconstruction: the same weights, another CPU or torch build (float32 networks)
RECONSTRUCTION_PSNR = 40.0


def assert_keeps_its_promise(out: np.ndarray, arrays: dict, original: np.ndarray, max_error, name: str) -> None:
    assert out.dtype == original.dtype and out.shape == original.shape, name
    if max_error == 0:
        assert out.tobytes() == original.tobytes(), name  # bit-exact, float32 included
    elif max_error is not None:
        assert np.abs(out.astype(np.float64) - original.astype(np.float64)).max() <= max_error, name
    elif "decoded" in arrays:
        assert psnr(arrays["decoded"], out) >= RECONSTRUCTION_PSNR, name
    else:
        assert psnr(original, out) >= LOSSY_PSNR, name


@pytest.mark.parametrize("f", of("image"))
@pytest.mark.usefixtures("model_weights")
def test_image_files_decode_to_their_pixels(f):
    """Every image fixture of a format this build reads decodes, with the weights it names, to pixels that keep
    the file's promise; format 1 is refused by name.  (Format 7's fixtures name the seeded weights the tests give
    a channel-context model that ships no weights of its own.)"""
    buf, arrays = load(f)
    if f["version"] in image_header.FORMATS_NOT_READ:
        with pytest.raises(UnsupportedFormatError, match=f"format {f['version']}"):
            visemz.decompress(buf, device="cpu")
        return
    out = visemz.decompress(buf, device="cpu")
    assert_keeps_its_promise(out, arrays, arrays["image"], f["settings"]["max_error"], f["name"])


SKIPPED = [p for p in of("image") if "rans_skip_freq" in p.values[0]["settings"]]


def test_some_image_fixtures_were_written_with_skipped_symbols():
    assert SKIPPED, "no image fixture with skipped symbols: run python tools/make_format_fixtures.py"


@pytest.mark.parametrize("f", SKIPPED)
def test_images_written_with_skipped_symbols_hold_version_3_sections(f):
    """Every conditional rANS part of such a file is a version-3 stream with the threshold it was written with."""
    buf, arrays = load(f)
    c = container.unpack(buf)
    t = c.meta["tiles"]
    n = t["grid"][0] * t["grid"][1]
    index = tile_index.TileIndex(c.sections, n, t["parts"], t["symbols"], c.meta["format"])
    parts = [(index.part(i, name), arrays[f"tile{i}_section_{name}"]) for i in range(n) for name in t["parts"]
             if index.coding(i).get(name) == "rans"]
    assert parts
    for body, symbols in parts:
        assert bytes(body[4:5]) == bytes([RL.VERSION_SKIP])
        parsed = RL.parse(bytes(body), symbols.size, RL.PREFIX2.unpack_from(bytes(body))[-1])
        assert parsed.skip.freq == f["settings"]["rans_skip_freq"] and parsed.skip.total == symbols.size


@pytest.mark.parametrize("f", of("pages"))
def test_page_files(f):
    buf, arrays = load(f)
    c = container.unpack(buf)
    stack = arrays["stack"]
    assert c.kind == pages.KIND and c.meta == {"format": f["version"], "shape": list(stack.shape),
                                               "dtype": stack.dtype.name}
    page_bufs = pages.page_buffers(c)
    assert len(page_bufs) == stack.shape[0]
    for k, page in enumerate(page_bufs):
        check_image_container(bytes(page), arrays, prefix=f"page{k}_")
    assert_repacks(c, buf)


@pytest.mark.parametrize("f", of("pages"))
def test_page_files_decode_to_their_pixels(f):
    buf, arrays = load(f)
    fmt = container.unpack(bytes(pages.page_buffers(container.unpack(buf))[0])).meta["format"]
    if fmt in image_header.FORMATS_NOT_READ:
        with pytest.raises(UnsupportedFormatError, match=f"format {fmt}"):
            visemz.decompress(buf, device="cpu")
        return
    out = visemz.decompress(buf, device="cpu")
    assert_keeps_its_promise(out, arrays, arrays["stack"], f["settings"]["max_error"], f["name"])


# ------------------------------------------------------------------ the error-bound residual
@pytest.mark.parametrize("f", of("residual"))
def test_residual_sections(f):
    """The residual against a stored float64 synthesis: decodes to the stored image within E, encodes to the same
    sections."""
    encoded, arrays = load(f)
    s = f["settings"]
    with np.load(io.BytesIO(encoded), allow_pickle=False) as npz:
        sections = {k: npz[k].tobytes() for k in npz.files}
    meta = ImageMeta(s["dtype"], tuple(s["shape"]), *s["range"])
    x01 = torch.from_numpy(arrays["x01_hat"])
    out = as_numpy(residual.decode(sections, x01, meta, s["max_error"], s["mode"]))
    assert out.dtype == arrays["decoded"].dtype and out.tobytes() == arrays["decoded"].tobytes()
    assert np.abs(out.astype(np.float64) - arrays["image"].astype(np.float64)).max() <= s["max_error"]
    if writes_today(f):
        again, mode = residual.encode(torch.from_numpy(arrays["image"]), x01, meta, s["max_error"],
                                      entropy=s["entropy"], bitshuffle=s["bitshuffle"])
        assert mode == s["mode"] and again == sections


# ------------------------------------------------------------------ the collectives' float codecs
def _tensor(bits: np.ndarray, dtype: str) -> torch.Tensor:
    wide = bits.dtype == np.uint32
    return torch.from_numpy(bits.view(np.int32 if wide else np.int16)).view(getattr(torch, dtype))


def _on(xp, t: torch.Tensor) -> torch.Tensor:
    return t if xp is np else t.cuda()


@pytest.mark.parametrize("f", of("eb"))
def test_error_bounded_streams(f, xp):
    buf, arrays = load(f)
    s = f["settings"]
    codec = ErrorBounded(s["eb"], s.get("predictor", "none"))  # version-1 fixtures predate predictors
    assert codec.decode(buf).tobytes() == arrays["decoded"].tobytes()
    x = _tensor(arrays["bits"], s["dtype"])
    assert np.abs(codec.decode(buf, exact=True) - x.to(torch.float64).numpy()).max() <= s["eb"] * (1 + 1e-12)
    if writes_today(f):
        assert codec.encode(_on(xp, x).reshape(s.get("shape", [-1])), row=s.get("row") or None) == buf


@pytest.mark.parametrize("f", of("ll"))
def test_lossless_streams(f, xp):
    buf, arrays = load(f)
    bits = arrays["bits"]
    assert Lossless().decode(buf).view(bits.dtype).tobytes() == bits.tobytes()  # NaN payloads and -0 included
    if writes_today(f):
        assert Lossless().encode(_on(xp, _tensor(bits, f["settings"]["dtype"]))) == buf


# ------------------------------------------------------------------ numcodecs float chunks
CHUNK_CODECS = {"visemz_eb": zarr_codecs.VisemzErrorBounded, "visemz_lossless": zarr_codecs.VisemzLossless}


@pytest.mark.parametrize("f", of("nchunk"))
def test_numcodecs_float_chunks(f):
    buf, arrays = load(f)
    config = dict(f["settings"]["config"])
    codec = CHUNK_CODECS[config.pop("id")].from_config(config)
    out = codec.decode(buf)
    assert out.shape == arrays["decoded"].shape and out.dtype == arrays["decoded"].dtype
    assert out.tobytes() == arrays["decoded"].tobytes()
    if writes_today(f):
        assert codec.encode(arrays["array"]) == buf
