"""The channel-context model (minnen2020) and image format 7 on the CPU: round trips, the error bound, tiles and
regions, device-independent scale indexes, header checks and damaged sections.  Without shipped weights the model
runs with seeded random weights (``model_weights``): the codec's guarantees hold for any weights."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from visemz import container
from visemz.encoders import encode_ints
from visemz.encoders.scale_indexes import DEFAULT_REL_TOL, read_scale_exceptions
from visemz.errors import CorruptStreamError, InvalidArgumentError, UnsupportedFormatError, VisemzError
from visemz.image import codec as codec_module
from visemz.image import latents, tile_index
from visemz.models import architectures, channel_context, entropy_tables, registry
from visemz.models import weights as W

from .helpers import astronaut_image, with_meta, with_tile_part

pytestmark = pytest.mark.usefixtures("model_weights")

MODEL = "minnen2020"
SLICES = [f"y{k}" for k in range(5)]


def _encoded_symbols(monkeypatch) -> list[dict]:
    """Each tile's symbols as the encoder codes them (recorded from ``latents.encode``)."""
    seen, real = [], latents.encode

    def encode(fmt, net, net64, symbols, quality, enc):
        seen.append({k: v.clone() for k, v in symbols.items()})
        return real(fmt, net, net64, symbols, quality, enc)

    monkeypatch.setattr(latents, "encode", encode)
    return seen


@pytest.mark.parametrize("dtype,shape", [("uint8", (40, 52, 3)), ("uint16", (48, 40)), ("float32", (16, 20, 2))])
def test_round_trip_holds_the_encoders_symbols(cpu, monkeypatch, dtype, shape):
    img = astronaut_image(dtype, shape)
    seen = _encoded_symbols(monkeypatch)
    buf = cpu.compress(img, model=MODEL, quality=2.5)
    meta = container.unpack(buf).meta
    variant = "rgb" if len(shape) == 3 and shape[2] == 3 else "gray"
    assert (meta["format"], meta["model"], meta["residual_id"]) == (codec_module.CONTEXT, f"{MODEL}-{variant}", None)
    assert meta["tiles"]["symbols"] == SLICES + ["z"]
    assert meta["tiles"]["parts"] == sorted(SLICES + ["y_scales", "z"])
    out = cpu.decompress(buf)
    assert out.shape == img.shape and out.dtype == img.dtype
    _, tiles = cpu.decode_tile_symbols(buf)
    assert len(tiles) == len(seen) == 1
    for k in ("y", "z"):
        assert torch.equal(tiles[0][k], seen[0][k]), k


def test_the_error_bound_holds_with_the_block_coded_residual(cpu):
    """No residual prior fits the new model yet: its max_error residual is format 5's block-coded one."""
    for dtype, shape, e in (("uint16", (40, 36), 3), ("uint8", (16, 20), 0), ("float32", (20, 18), 0.01)):
        img = astronaut_image(dtype, shape, seed=1)
        buf = cpu.compress(img, model=MODEL, quality=1.5, max_error=e)
        meta = container.unpack(buf).meta
        assert meta["residual"] in ("int", "float", "bits") and meta["residual_id"] is None
        out = cpu.decompress(buf)
        assert np.abs(out.astype(np.float64) - img.astype(np.float64)).max() <= e


@pytest.fixture(scope="module")
def tiled(cpu):
    """A 60 x 100 gray image in 1 x 2 tiles of 64, its file and full decode."""
    img = astronaut_image("uint8", (60, 100), seed=2)
    buf = cpu.compress(img, model=MODEL, quality=3, tile=64)
    return img, buf, cpu.decompress(buf)


def test_tiles_and_regions(cpu, tiled):
    img, buf, out = tiled
    meta = container.unpack(buf).meta
    assert meta["tiles"]["grid"] == [1, 2] and out.shape == img.shape
    for region in ((10, 50, 30, 100), (0, 60, 64, 100), (59, 60, 99, 100)):  # across tiles, one tile, a corner
        y0, y1, x0, x1 = region
        np.testing.assert_array_equal(cpu.decompress(buf, region=region), out[y0:y1, x0:x1])


def test_every_tile_decodes_to_its_encoded_symbols(cpu, monkeypatch):
    seen = _encoded_symbols(monkeypatch)
    buf = cpu.compress(astronaut_image("uint16", (70, 60), seed=3), model=MODEL, quality=6, max_error=5, tile=64)
    _, tiles = cpu.decode_tile_symbols(buf)
    assert len(tiles) == len(seen) == 2
    for mine, theirs in zip(tiles, seen):
        assert all(torch.equal(mine[k], theirs[k]) for k in ("y", "z"))


def _snap_and_perturb(monkeypatch, net64, table: np.ndarray, perturb: bool) -> None:
    """Every third scale of every slice moved to within 3 rel_tol of a table boundary (the same on both sides);
    with ``perturb`` (the decoder) every transform output then moved as another device's float64 would move it,
    far more than that: scales by up to rel_tol / 2, everything else (means, LRP, h_s) by up to 1e-12."""
    real = architectures.transform
    params = {id(t) for t in net64.param_transforms}
    boundaries = torch.from_numpy(table[:-1])
    gen = torch.Generator().manual_seed(5)

    def transform(layers, x):
        out = real(layers, x)
        g = out.shape[1] // 2
        if id(layers) in params:
            sigma = out[:, :g].reshape(-1)
            j = torch.arange(sigma.numel(), dtype=torch.float64)
            near = boundaries[j.long() % boundaries.numel()] * (1 + 3 * DEFAULT_REL_TOL * torch.sin(j))
            sigma = torch.where(j.long() % 3 == 0, near, sigma).view_as(out[:, :g])
            out = torch.cat([sigma, out[:, g:]], 1)
        if perturb:
            u = torch.rand(out.shape, generator=gen, dtype=out.dtype) * 2 - 1
            scale = torch.full_like(out, 1e-12)
            if id(layers) in params:
                scale[:, :g] = DEFAULT_REL_TOL / 2
            out = out * (1 + u * scale)
        return out

    monkeypatch.setattr(architectures, "transform", transform)


def test_the_decoders_float64_last_bits_do_not_change_the_symbols(cpu, monkeypatch):
    """The decoder's scales differ from the encoder's (another device): the exception list puts every index
    back, so the rANS sections decode to the encoder's symbols; without it they would not."""
    spec = registry.spec(MODEL, "gray")
    net, _ = W.load(spec)
    net64 = codec_module._model64(spec, "cpu")
    x = torch.from_numpy(astronaut_image("uint8", (128, 128), seed=4).astype(np.float32) / 255)[None, None]
    q = 3.5
    with torch.no_grad():
        symbols = architectures.analyse(net, x, q)
        tables = net.visemz_tables
        with monkeypatch.context() as m:
            _snap_and_perturb(m, net64, tables.scale_table, perturb=False)
            sections, coding = latents.encode(latents.RANS, net, net64, symbols, q,
                                              {"entropy": "zstd", "bitshuffle": True})
        positions, _ = read_scale_exceptions(sections["y_scales"], symbols["y"].numel(), tables.scale_table.size)
        assert positions.size > 100  # a third of the positions sit near a boundary; those within rel_tol are listed
        shapes = {k: tuple(v.shape) for k, v in symbols.items()}
        with monkeypatch.context() as m:
            _snap_and_perturb(m, net64, tables.scale_table, perturb=True)
            decoded = latents.decode(net, net64, sections, shapes, q, "cpu", coding)
            assert all(torch.equal(decoded[k], symbols[k]) for k in ("y", "z"))
            try:
                unlisted = latents.decode(net, net64, dict(sections, y_scales=b""), shapes, q, "cpu", coding)
            except VisemzError:
                return
            assert not torch.equal(unlisted["y"], symbols["y"])


def test_uneven_slices_code_and_decode():
    """ELIC's uneven groups (here 4, 4, 8, 8, 16 of M = 40) are a ModelSpec; a small model codes its symbols."""
    spec = registry.ModelSpec(MODEL, "gray", 16, 40, (4, 4, 8, 8, 16))
    torch.manual_seed(0)
    net = architectures.build(spec).eval()
    net.visemz_tables = entropy_tables.compute(net)
    net64 = codec_module._float64_copy(net, "cpu")
    net64.visemz_tables = net.visemz_tables
    x = torch.rand(2, 1, 128, 64)
    with torch.no_grad():
        symbols = architectures.analyse(net, x, 4.2)
        sections, coding = latents.encode(latents.RANS, net, net64, symbols, 4.2,
                                          {"entropy": "zstd", "bitshuffle": True})
        assert set(sections) == {"y0", "y1", "y2", "y3", "y4", "y_scales", "z"} and list(coding) == SLICES + ["z"]
        shapes = {k: tuple(v.shape) for k, v in symbols.items()}
        decoded = latents.decode(net, net64, sections, shapes, 4.2, "cpu", coding)
        assert all(torch.equal(decoded[k], symbols[k]) for k in ("y", "z"))
        assert architectures.dequantise(net, symbols, 4.2).shape == (2, 40, 8, 4)
    with pytest.raises(InvalidArgumentError, match="slices"):
        registry.ModelSpec(MODEL, "gray", 16, 40, (8, 8))
    with pytest.raises(InvalidArgumentError, match="slices"):
        registry.ModelSpec("mbt2018-mean", "gray", 16, 40, (8,) * 5)


def test_weights_of_other_slices_are_refused(tmp_path, monkeypatch):
    small = registry.ModelSpec(MODEL, "gray", 16, 40, (8,) * 5)
    W.save(architectures.build(small), small, tmp_path / f"{small.name}.safetensors", {})
    monkeypatch.setenv("VISEMZ_WEIGHTS_DIR", str(tmp_path))
    W.load.cache_clear()
    try:
        assert W.load(small)[0].slices == (8,) * 5
        with pytest.raises(UnsupportedFormatError, match="slices"):
            W.load(registry.ModelSpec(MODEL, "gray", 16, 40, (4, 4, 8, 8, 16)))
    finally:
        W.load.cache_clear()


def test_without_its_weights_the_model_is_refused_by_name(cpu, tmp_path, monkeypatch):
    buf = cpu.compress(astronaut_image("uint8", (20, 20)), model=MODEL, quality=2)
    for f in W.weights_dir().iterdir():  # every other model's weights, not this one's
        if f.is_file() and not f.name.startswith(MODEL):
            (tmp_path / f.name).symlink_to(f.resolve())
    monkeypatch.setenv("VISEMZ_WEIGHTS_DIR", str(tmp_path))
    W.load.cache_clear()
    try:
        with pytest.raises(UnsupportedFormatError, match=f"no weights for model '{MODEL}-gray'"):
            cpu.compress(astronaut_image("uint8", (20, 20)), model=MODEL)
        with pytest.raises(UnsupportedFormatError, match=f"no weights for model '{MODEL}-gray'"):
            cpu.decompress(buf)
        assert container.unpack(cpu.compress(astronaut_image("uint8", (20, 20)))).meta["format"] == codec_module.FORMAT
    finally:
        W.load.cache_clear()


def test_format_arguments_are_checked(cpu):
    img = astronaut_image("uint8", (20, 20))
    with pytest.raises(InvalidArgumentError, match="writes format 7"):
        cpu.compress(img, model=MODEL, image_format=6)
    with pytest.raises(InvalidArgumentError, match="writes format 10"):
        cpu.compress(img, model="mbt2018-mean", image_format=7)
    with pytest.raises(InvalidArgumentError, match="refine"):
        cpu.compress(img, model=MODEL, refine=2)
    assert container.unpack(cpu.compress(img, model="mbt2018-mean", image_format=6)).meta["format"] == 6


def test_headers_that_do_not_fit_the_model_are_refused(cpu):
    buf = cpu.compress(astronaut_image("uint8", (20, 20)), model=MODEL, quality=2)
    meta = container.unpack(buf).meta
    with pytest.raises(CorruptStreamError, match="format 6 does not hold model 'minnen2020-gray'"):
        cpu.decompress(with_meta(buf, format=6))
    old = cpu.compress(astronaut_image("uint8", (20, 20)), model="mbt2018-mean")
    with pytest.raises(CorruptStreamError, match="format 7 does not hold model 'mbt2018-mean-gray'"):
        cpu.decompress(with_meta(old, format=7))
    for tiles in (dict(meta["tiles"], symbols=["y", "z"]), dict(meta["tiles"], symbols=SLICES[:4] + ["z"]),
                  dict(meta["tiles"], parts=sorted(SLICES[:4] + ["y_scales", "z"]))):
        with pytest.raises(CorruptStreamError, match="tile"):
            cpu.decompress(with_meta(buf, tiles=tiles))
    one_tile = {k: v for k, v in meta.items() if k not in ("tiles", "residual_id")}
    one_tile.update(format=3, symbols={"y": [1, 320, 2, 2], "z": [1, 192, 1, 1]}, coding={"y": "rans", "z": "rans"})
    with pytest.raises(CorruptStreamError, match="format 3 does not hold model 'minnen2020-gray'"):
        cpu.decompress(container.pack("image", one_tile, {"y": b"", "z": b"", "y_scales": b""}))


def test_damaged_sections_are_refused(cpu):
    img = astronaut_image("uint8", (64, 64, 3))
    buf = cpu.compress(img, model=MODEL, quality=5)
    c = container.unpack(buf)
    t = c.meta["tiles"]
    parts = tile_index.TileIndex(c.sections, 1, t["parts"], t["symbols"], 7).sections(0)
    rng = np.random.default_rng(0)
    for name in SLICES + ["z"]:
        body = bytes(parts[name])
        for cut in (0, len(body) // 2, len(body) - 1):
            with pytest.raises(VisemzError):
                cpu.decompress(with_tile_part(buf, name, body[:cut]))
        for i in rng.choice(len(body) * 8, 5, replace=False):
            bad = bytearray(body)
            bad[i // 8] ^= 1 << (i % 8)
            try:
                out = cpu.decompress(with_tile_part(buf, name, bytes(bad)))
            except VisemzError:
                continue
            assert out.shape == img.shape  # a flip inside the coded payload may decode to other in-range symbols
    n = math.prod(cpu.decode_symbols(buf)["y"].shape)
    for values in ([0, 1, 2], [n, 3], [5, 0, 3, 3], [0, 64], [0, 3]):  # odd, beyond, decreasing, index, far
        section = encode_ints(np.array(values, np.int32), policy="global", entropy="none")
        with pytest.raises(CorruptStreamError):
            cpu.decompress(with_tile_part(buf, "y_scales", section))
    big = cpu.compress(astronaut_image("uint8", (128, 64, 3)), model=MODEL, quality=5)
    other = tile_index.TileIndex(container.unpack(big).sections, 1, t["parts"], t["symbols"], 7).part(0, "y3")
    with pytest.raises(CorruptStreamError):
        cpu.decompress(with_tile_part(buf, "y3", bytes(other)))


def test_compressai_coder_runs_the_same_slices():
    """CompressAI's own rANS on the context model (for comparisons) reconstructs what its strings hold."""
    spec = registry.ModelSpec(MODEL, "rgb", 16, 40, (8,) * 5)
    torch.manual_seed(1)
    net = architectures.build(spec).eval()
    net.update(force=True)
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        enc = architectures.compressai_compress(net, x, 3.0)
        assert len(enc["strings"]) == 6
        out = architectures.compressai_decompress(net, enc["strings"], enc["shape"], 3.0)
        symbols = architectures.analyse(net, x, 3.0)
        ref = net.g_s(architectures.dequantise(net, symbols, 3.0))
    assert out.shape == x.shape
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=0)


def test_the_slice_walk_sees_only_decoded_slices():
    """Slice k's parameters do not depend on slices k, k + 1, ...: what makes slice-by-slice decoding possible."""
    spec = registry.ModelSpec(MODEL, "gray", 16, 40, (4, 4, 8, 8, 16))
    torch.manual_seed(2)
    net = architectures.build(spec).eval()
    params = torch.randn(1, 80, 3, 3)
    y = torch.randn(1, 40, 3, 3)

    def record(values):
        parts, seen = channel_context.split(net, values), []

        def take(k, mu, sigma):
            seen.append((mu.clone(), sigma.clone()))
            return parts[k]

        with torch.no_grad():
            channel_context.walk(net, params, take)
        return seen

    before = record(y)
    changed = y.clone()
    changed[:, 16:] += 1  # slices 3 and 4 (channels 16..39)
    after = record(changed)
    for k in range(4):  # slice 3 itself changed, but its parameters come from slices 0-2
        assert all(torch.equal(a, b) for a, b in zip(before[k], after[k])), k
    assert not torch.equal(before[4][0], after[4][0])
