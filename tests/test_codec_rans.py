"""Image format 3 on the CPU: latents coded by conditional rANS with the tables shipped in the weights."""

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from skimage import data

import visemz
from visemz import container
from visemz.encoders import encode_ints
from visemz.errors import CorruptStreamError, InvalidArgumentError, UnsupportedFormatError, VisemzError
from visemz.image import codec, latents
from visemz.models import all_specs, architectures, entropy_tables, parse
from visemz.models import weights as W

from .helpers import astronaut_image, repack, symbols_of, with_meta

pytestmark = pytest.mark.usefixtures("model_weights")

MODELS = ("balle2016", "mbt2018-mean")


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("dtype,shape", [("uint8", (48, 70, 3)), ("uint8", (48, 70)), ("uint16", (48, 70)),
                                         ("uint16", (48, 70, 3))])
def test_format_3_holds_the_same_symbols_as_format_2(cpu, model, dtype, shape):
    """Both formats of one image at a fractional quality decode to the same symbols and the same pixels."""
    img = astronaut_image(dtype, shape)
    new, old = (cpu.compress(img, model=model, quality=3.7, image_format=f) for f in (3, 2))
    assert container.unpack(new).meta["format"] == 3 and container.unpack(old).meta["format"] == 2
    a, b = symbols_of(new), symbols_of(old)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    out = cpu.decompress(new)
    assert out.dtype == img.dtype and out.shape == img.shape
    np.testing.assert_array_equal(out, cpu.decompress(old))


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("name", ["astronaut", "camera"])
def test_rans_sections_are_smaller_than_block_coding_on_a_natural_image(cpu, model, name):
    """On photos the model's prior wins: every symbol section is rANS-coded, 3% or more below format 2's."""
    img = getattr(data, name)()[:256, :256]
    sizes = {}
    for fmt in (2, 3):
        c = container.unpack(cpu.compress(img, model=model, quality=4, image_format=fmt))
        sizes[fmt] = sum(len(c.sections[k]) for k in latents.section_names(fmt, c.meta["symbols"]))
    assert set(c.meta["coding"].values()) == {"rans"}
    assert sizes[3] < 0.97 * sizes[2], sizes


def test_a_section_the_prior_fits_badly_keeps_the_block_coding(cpu):
    """A flat image's latents cost the factorized prior more than zstd's run-length view: the
    encoder keeps the format-2 coding for that section, records it, and the file decodes the same."""
    img = np.full((128, 128), 37, np.uint8)
    new, old = (cpu.compress(img, model="balle2016", quality=5, image_format=f) for f in (3, 2))
    c = container.unpack(new)
    assert c.meta["coding"] == {"y": "ints"} and bytes(c.sections["y"]) == bytes(container.unpack(old).sections["y"])
    np.testing.assert_array_equal(cpu.decompress(new), cpu.decompress(old))


@pytest.mark.parametrize("model", MODELS)
def test_error_bound_path_is_unchanged(cpu, model):
    img = astronaut_image("uint16", (40, 52), seed=3)
    for e in (0, 40):
        out = cpu.decompress(cpu.compress(img, model=model, quality=2.5, max_error=e))
        assert np.abs(out.astype(np.int64) - img).max() <= e


def test_weights_ship_the_tables_the_model_gives():
    """The stored integer tables are what entropy_tables.compute gives for the loaded model, and the
    factorized ones cover CompressAI's EntropyBottleneck.update() ranges."""
    for spec in all_specs():
        net, _ = W.load(spec)
        stored, fresh = net.visemz_tables, entropy_tables.compute(net)
        for key in ("factorized", "gaussian"):
            a, b = getattr(stored, key), getattr(fresh, key)
            assert (a is None) == (b is None) == (key == "gaussian" and spec.arch == "balle2016")
            if a is not None:
                assert a.fingerprint == b.fingerprint, (spec.name, key)
        ref = W.architectures.build(spec)
        ref.load_state_dict(net.state_dict())
        ref.entropy_bottleneck.update(force=True)
        np.testing.assert_array_equal(stored.factorized.offsets, ref.entropy_bottleneck._offset.numpy())
        np.testing.assert_array_equal(np.diff(stored.factorized.cdf_start), ref.entropy_bottleneck._cdf_length.numpy())


def test_weights_without_tables_still_decode_format_2_and_refuse_format_3(tmp_path, monkeypatch, cpu):
    spec = parse("balle2016-gray")
    tensors, meta = W.read_tensors(W.weights_path(spec))
    save_file({k: v for k, v in tensors.items() if not k.startswith("tables/")},
              str(tmp_path / f"{spec.name}.safetensors"), metadata=meta)
    monkeypatch.setenv("VISEMZ_WEIGHTS_DIR", str(tmp_path))
    W.load.cache_clear()
    codec._model64.cache_clear()
    try:
        img = astronaut_image("uint8", (40, 40))
        assert cpu.decompress(cpu.compress(img, model="balle2016", image_format=2)).shape == img.shape
        with pytest.raises(UnsupportedFormatError, match="tables"):
            cpu.compress(img, model="balle2016")
    finally:
        monkeypatch.undo()
        W.load.cache_clear()
        codec._model64.cache_clear()


@pytest.mark.parametrize("model", MODELS)
def test_damaged_rans_sections_raise_visemz_errors(cpu, model):
    buf = cpu.compress(astronaut_image("uint8", (64, 64, 3)), model=model, quality=5, image_format=3)
    sections = container.unpack(buf).sections
    rng = np.random.default_rng(0)
    for name in sorted(latents.section_names(3, container.unpack(buf).meta["symbols"])):
        body = bytes(sections[name])
        if not body:  # an empty exception list: damage is a non-empty one (below)
            continue
        for i in rng.choice(len(body) * 8, 60, replace=False):
            bad = bytearray(body)
            bad[i // 8] ^= 1 << (i % 8)
            try:
                out = cpu.decompress(repack(buf, **{name: bytes(bad)}))
            except VisemzError:
                continue
            # a flip inside the coded payload may decode to other in-range symbols: never to another shape
            assert out.shape == (64, 64, 3)
        for cut in (0, 1, len(body) // 2, len(body) - 1):
            with pytest.raises(VisemzError):
                cpu.decompress(repack(buf, **{name: body[:cut]}))


@pytest.mark.parametrize("model", MODELS)
def test_a_section_of_another_image_is_rejected(cpu, model):
    """Symbols / indexes mismatch: a y section of a bigger image holds another symbol count."""
    small = cpu.compress(astronaut_image("uint8", (64, 64, 3)), model=model, image_format=3)
    big = cpu.compress(astronaut_image("uint8", (128, 64, 3)), model=model, image_format=3)
    with pytest.raises(CorruptStreamError):
        cpu.decompress(repack(small, y=bytes(container.unpack(big).sections["y"])))


def test_hostile_scale_exceptions_are_rejected(cpu):
    buf = cpu.compress(astronaut_image("uint8", (64, 64, 3)), model="mbt2018-mean", quality=5, image_format=3)
    n = int(np.prod(container.unpack(buf).meta["symbols"]["y"]))
    hostile = {
        "odd count": [0, 1, 2],
        "position beyond the symbols": [n, 3],
        "decreasing positions": [5, 0, 3, 3],
        "index beyond the table": [0, 64],
        "position far from a boundary": [0, 3],  # (the test image's scales are not within 1e-8 of one)
    }
    for values in hostile.values():
        section = encode_ints(np.array(values, np.int32), policy="global", entropy="none")
        with pytest.raises(CorruptStreamError):
            cpu.decompress(repack(buf, y_scales=section))
    c = container.unpack(buf)
    without = container.pack(c.kind, c.meta, {k: bytes(v) for k, v in c.sections.items() if k != "y_scales"})
    with pytest.raises(CorruptStreamError, match="y_scales"):
        cpu.decompress(without)


@pytest.mark.parametrize("model", MODELS)
def test_hostile_coding_fields_are_rejected(cpu, model):
    buf = cpu.compress(astronaut_image("uint8", (64, 64, 3)), model=model, quality=5, image_format=3)
    coding = container.unpack(buf).meta["coding"]
    assert set(coding.values()) == {"rans"}
    for bad in (None, "rans", {"y": "lzma"}, dict(coding, w="rans"),
                {"z": "rans"} if model == "balle2016" else {"y": "rans"}):
        with pytest.raises(CorruptStreamError, match="coding"):
            cpu.decompress(with_meta(buf, coding=bad))
    with pytest.raises(VisemzError):  # a rANS stream read as an ints stream
        cpu.decompress(with_meta(buf, coding={k: "ints" for k in coding}))
    c = container.unpack(buf)
    without = container.pack(c.kind, {k: v for k, v in c.meta.items() if k != "coding"},
                             {k: bytes(v) for k, v in c.sections.items()})
    with pytest.raises(CorruptStreamError, match="coding"):
        cpu.decompress(without)


def test_image_format_argument_is_checked(cpu):
    with pytest.raises(visemz.errors.InvalidArgumentError, match="image_format=1"):
        cpu.compress(astronaut_image("uint8", (16, 16)), image_format=1)


def test_swapped_weights_code_with_their_own_float64_copy(tmp_path, monkeypatch, cpu):
    """Weights swapped under the same model name (another VISEMZ_WEIGHTS_DIR and W.load.cache_clear(), as
    tools/export_weights.py does) write what a fresh process would: the float64 copy
    that gives rANS its scales is the new weights', not a cached copy of the old ones."""
    spec = parse("mbt2018-mean-rgb")
    for seed, name in ((1, "a"), (2, "b")):
        torch.manual_seed(seed)
        net = architectures.build(spec)
        if name == "a":  # scales near 3 (a random start's are ~0.02, all at the table's floor, like b's)
            with torch.no_grad():
                net.h_s[-1].bias.fill_(3.0)
        (tmp_path / name).mkdir()
        W.save(net, spec, tmp_path / name / f"{spec.name}.safetensors", {"note": "test"})
    img = astronaut_image("uint8", (64, 64, 3))
    try:
        monkeypatch.setenv("VISEMZ_WEIGHTS_DIR", str(tmp_path / "a"))
        W.load.cache_clear()
        cpu.compress(img, model="mbt2018-mean", quality=3)  # caches weights a's float64 copy
        monkeypatch.setenv("VISEMZ_WEIGHTS_DIR", str(tmp_path / "b"))
        W.load.cache_clear()
        swapped = cpu.compress(img, model="mbt2018-mean", quality=3)
        codec._model64.cache_clear()
        assert swapped == cpu.compress(img, model="mbt2018-mean", quality=3)
    finally:
        monkeypatch.undo()
        W.load.cache_clear()
        codec._model64.cache_clear()


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("min_zeros", [0.0, 1.01])
def test_only_static_prior_sections_are_also_tried_as_ints_streams(cpu, model, min_zeros, monkeypatch):
    """Format 3 codes a hyperprior model's y by rANS alone (its ints stream never won, latents.tries_ints);
    balle2016's y is still coded both ways, and mbt2018-mean's z when enough of its symbols are 0
    (latents.Z_INTS_MIN_ZEROS), the smaller kept."""
    tried = []
    real = latents.start_encode_ints

    def spy(items):
        tried.append([a.size for a, _ in items])
        return real(items)

    monkeypatch.setattr(latents, "start_encode_ints", spy)
    monkeypatch.setattr(latents, "Z_INTS_MIN_ZEROS", min_zeros)
    img = data.astronaut()[:128, :128]
    buf = cpu.compress(img, model=model, quality=4, image_format=3)
    shapes = container.unpack(buf).meta["symbols"]
    want = ["y"] if model == "balle2016" else ["z"] if min_zeros <= 1 else []
    assert tried == [[int(np.prod(shapes[k])) for k in want]]
    cpu.compress(img, model=model, quality=4, image_format=2)  # format 2: every section, as ever
    assert tried[1] == [int(np.prod(shapes[k])) for k in shapes]


def test_a_hyper_latent_is_tried_as_an_ints_stream_by_its_share_of_zeros():
    z = torch.zeros(1, 4, 5, 5, dtype=torch.int32)
    y = torch.ones(1, 8, 20, 20, dtype=torch.int32)
    assert latents.zero_share(z) == 1.0 and latents.tries_ints("z", {"y": y, "z": z})
    z.view(-1)[: 11] = 3  # 89 of 100 zeros: below the 0.90 share
    assert latents.zero_share(z) == pytest.approx(0.89) and not latents.tries_ints("z", {"y": y, "z": z})
    z.view(-1)[10] = 0
    assert latents.tries_ints("z", {"y": y, "z": z})
    assert not latents.tries_ints("y", {"y": y, "z": z}) and latents.tries_ints("y", {"y": y})


def test_float64_copy_is_made_from_the_loaded_model_once_per_weights(monkeypatch):
    """codec._model64 keys its float64 copy by (spec, device, weights id) and builds it from the model of
    that same load: one W.load per call, the same copy for the same weights, a new one for new weights."""
    spec = parse("mbt2018-mean-rgb")
    codec._model64.cache_clear()
    loads = []
    real = codec.W.load

    def counting_load(s, d, model_id=None):
        loads.append(s)
        return real(s, d, model_id)

    monkeypatch.setattr(codec.W, "load", counting_load)
    a = codec._model64(spec, "cpu")
    assert codec._model64(spec, "cpu") is a and len(loads) == 2
    assert next(a.parameters()).dtype == torch.float64
    net, model_id = real(spec, "cpu")
    monkeypatch.setattr(codec.W, "load", lambda s, d, _=None: (net, model_id + "-other"))  # other weights, same spec
    b = codec._model64(spec, "cpu")
    assert b is not a and next(b.parameters()).dtype == torch.float64
    codec._model64.cache_clear()


def test_hyper_latent_lanes_take_at_most_the_hyper_cap(cpu, monkeypatch):
    """z's rANS stream is planned with lanes of at most VISEMZ_RANS_HYPER_LANE_SYMBOLS symbols (its decode
    precedes y's); y keeps VISEMZ_RANS_LANE_SYMBOLS.  The setting is validated like the others."""
    from visemz import config, defaults
    from visemz.encoders import rans_layout as RL
    from visemz.image import tile_index

    img = data.astronaut()  # 512 x 512: z holds 128 x 8 x 8 = 8192 symbols
    c = container.unpack(cpu.compress(img, model="mbt2018-mean", quality=1))
    t = c.meta["tiles"]
    index = tile_index.TileIndex(c.sections, 1, t["parts"], t["symbols"], c.meta["format"])
    assert index.coding(0)["z"] == "rans"
    z = RL.parse(index.part(0, "z"), None, None).plan
    y = RL.parse(index.part(0, "y"), None, None).plan
    assert z.n == 8192 and z.lanes * z.groups >= 8 and z.steps <= defaults.get("rans_hyper_lane_symbols")
    assert y.steps > 1024  # y is planned by bytes and VISEMZ_RANS_LANE_SYMBOLS, not the hyper cap
    monkeypatch.setenv("VISEMZ_RANS_HYPER_LANE_SYMBOLS", "256")
    assert config.from_env().rans_hyper_lane_symbols == 256
    for bad in ("0", str((1 << 20) + 1)):
        monkeypatch.setenv("VISEMZ_RANS_HYPER_LANE_SYMBOLS", bad)
        with pytest.raises(InvalidArgumentError, match="VISEMZ_RANS_HYPER_LANE_SYMBOLS"):
            config.from_env()


def test_loaded_models_are_frozen_for_inference():
    """W.load's models and the codec's float64 copies carry FrozenGDN layers with buffers derived in their own
    dtype (the fast path), and the float32 model's state dict keeps CompressAI's keys."""
    from visemz.models.architectures import FrozenGDN

    spec = parse("mbt2018-mean-rgb")
    net, _ = W.load(spec, "cpu")
    gdn = [m for m in net.modules() if isinstance(m, FrozenGDN)]
    assert len(gdn) == 6 and all(m.frozen_dtype == torch.float32 == m.gamma_eff.dtype for m in gdn)
    assert not any(k.endswith("_eff") for k in net.state_dict())
    n64 = codec._model64(spec, "cpu")
    assert all(m.frozen_dtype == torch.float64 == m.gamma_eff.dtype for m in n64.modules() if isinstance(m, FrozenGDN))


@pytest.mark.parametrize("model,quality", [("mbt2018-mean", 1), ("balle2016", 6)])  # balle2016's y is rANS-coded there
def test_skipping_near_certain_zeros_keeps_the_symbols(cpu, model, quality):
    """With VISEMZ_RANS_SKIP_FREQ the image's rANS sections are version-3 streams, the file decodes to the same
    symbols and pixels, and its size moves by under 1%."""
    from visemz import defaults
    from visemz.encoders import rans_layout as RL
    from visemz.image import tile_index

    img = data.astronaut()
    plain = cpu.compress(img, model=model, quality=quality)
    with defaults.set(rans_skip_freq=65531):
        skipping = cpu.compress(img, model=model, quality=quality)
    c = container.unpack(skipping)
    t = c.meta["tiles"]
    index = tile_index.TileIndex(c.sections, 1, t["parts"], t["symbols"], c.meta["format"])
    versions = {k: bytes(index.part(0, k))[4] for k, v in index.coding(0).items() if v == "rans"}
    assert versions and set(versions.values()) == {RL.VERSION_SKIP}, versions
    a, b = symbols_of(skipping), symbols_of(plain)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    np.testing.assert_array_equal(cpu.decompress(skipping), cpu.decompress(plain))
    assert abs(len(skipping) / len(plain) - 1) < 0.01, (len(skipping), len(plain))
