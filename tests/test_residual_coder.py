"""The learned residual (image formats 6, 8 and 9): lossless and near-lossless coding under the residual prior (the
float one, and from format 9 the integer one), on the CPU.

What must hold whatever the prior's weights: every pixel within max_error (exact at 0), on adversarial
inputs too; the same bytes decode to the same pixels when the float64 values' last bits differ (the fixes list; the
integer prior's inputs list); damage is refused; the training loss is what the coder spends.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from skimage import data

import visemz
from visemz import container
from visemz.errors import CorruptStreamError
from visemz.image import codec as codec_module
from visemz.image import image_header, residual_coder, tiling
from visemz.models import blocks, integer_prior, registry, residual_prior, residual_weights
from visemz.models import residual_tables as RT

from .helpers import integer_prior_bits, max_abs_error, with_tile_part

pytestmark = pytest.mark.usefixtures("model_weights")


def _residual_of(buf) -> str | None:
    return container.unpack(buf).meta["residual"]


def _photo(shape, dtype="uint8") -> np.ndarray:
    img = data.camera()[: shape[0], : shape[1]]
    if dtype == "uint16":
        img = img.astype(np.uint16) * 16 + 7  # 12-bit detector data in 16-bit words
    return np.ascontiguousarray(img)


@pytest.mark.parametrize("dtype", ["uint8", "uint16"])
@pytest.mark.parametrize("e", [0, 1, 2, 5])
def test_bound_holds_and_learned_residual_is_used(dtype, e):
    img = _photo((40, 52), dtype)
    buf = visemz.compress(img, max_error=e, quality=2)
    out = visemz.decompress(buf)
    assert _residual_of(buf) == "learned" and container.unpack(buf).meta["format"] == codec_module.FORMAT
    assert out.dtype == img.dtype and out.shape == img.shape
    assert max_abs_error(out, img) <= e
    if e == 0:
        np.testing.assert_array_equal(out, img)


def _adversarial() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    checker = (np.indices((34, 46)).sum(0) % 2 * 255).astype(np.uint8)
    return [
        np.full((30, 30), 200, np.uint8),  # constant: a range of one level
        checker,  # every pixel at an extreme, next to the other extreme
        rng.integers(0, 256, (33, 47), dtype=np.uint8),  # noise the prior cannot predict
        rng.integers(0, 65536, (35, 41), dtype=np.uint16),  # full 16-bit noise: wide scales, low bits
        np.array([[1000, 1001], [1001, 1000]], np.uint16).repeat(9, 0).repeat(11, 1),  # a range of 2 levels
        rng.integers(0, 256, (21, 19, 2), dtype=np.uint8),  # two planes of one image
    ]


@pytest.mark.parametrize("e", [0, 3, 100])
def test_bound_on_adversarial_inputs(e):
    for img in _adversarial():
        buf = visemz.compress(img, max_error=e, quality=1)
        out = visemz.decompress(buf)
        assert _residual_of(buf) == "learned"
        assert out.shape == img.shape and out.dtype == img.dtype
        assert max_abs_error(out, img) <= e, (img.shape, img.dtype, e)


@pytest.mark.parametrize("shape", [(24, 30), (64, 64)])
def test_wide_distributions_take_the_low_bits_tables(monkeypatch, shape):
    """Full-range 16-bit noise needs scales beyond the logistic grid: q >> k plus k uniform low bits; in a tile with
    padding (masked positions) and in one the image fills (no masks)."""
    seen = []
    inner = residual_coder._stream_inputs

    def spy(high, low, shift, table, real, wide):
        seen.append((int((shift if real is None else shift[real]).max()), real is None))
        return inner(high, low, shift, table, real, wide)

    monkeypatch.setattr(residual_coder, "_stream_inputs", spy)
    img = np.random.default_rng(3).integers(0, 65536, shape, dtype=np.uint16)
    np.testing.assert_array_equal(visemz.decompress(visemz.compress(img, max_error=0, quality=1)), img)
    assert max(k for k, _ in seen) > 0
    assert {whole for _, whole in seen} == {shape == (64, 64)}


def test_tiles_and_regions():
    img = _photo((90, 100))
    buf = visemz.compress(img, max_error=1, quality=3, tile=64)
    assert container.unpack(buf).meta["tiles"]["grid"] == [2, 2]
    out = visemz.decompress(buf)
    assert max_abs_error(out, img) <= 1
    np.testing.assert_array_equal(visemz.decompress(buf, region=(50, 90, 10, 30)), out[50:90, 10:30])


@pytest.mark.parametrize("e", [0, 2])
def test_rgb_takes_the_rgb_prior(e):
    img = np.ascontiguousarray(data.astronaut()[100:140, 150:202])
    for fmt in (image_header.CALIBRATED, image_header.INTEGER):
        buf = visemz.ImageCodec("cpu").compress(img, max_error=e, quality=2, image_format=fmt)
        assert _residual_of(buf) == "learned"
        prior = residual_weights.load("rgb", integer=image_header.integer_prior(fmt))
        assert container.unpack(buf).meta["residual_id"] == prior.model_id
        out = visemz.decompress(buf)
        assert out.shape == img.shape and max_abs_error(out, img) <= e
        if e == 0:
            np.testing.assert_array_equal(out, img)


def test_without_a_prior_the_residual_stays_block_coded(monkeypatch):
    img = data.astronaut()[:24, :30]
    monkeypatch.setattr(residual_weights, "load", lambda variant, device="cpu", integer=False: None)
    buf = visemz.compress(img, max_error=0)
    assert _residual_of(buf) == "int"
    np.testing.assert_array_equal(visemz.decompress(buf), img)


def test_older_format_still_written_on_request():
    img = _photo((20, 30))
    buf = visemz.ImageCodec("cpu").compress(img, max_error=0, image_format=5)
    assert _residual_of(buf) == "int" and "residual_id" not in container.unpack(buf).meta
    np.testing.assert_array_equal(visemz.decompress(buf), img)
    six = visemz.ImageCodec("cpu").compress(img, max_error=0, image_format=codec_module.LEARNED)
    assert _residual_of(six) == "learned" and residual_coder.SCALES not in _tile_sections(six)
    np.testing.assert_array_equal(visemz.decompress(six), img)
    eight = visemz.ImageCodec("cpu").compress(img, max_error=1, image_format=image_header.CALIBRATED)
    assert container.unpack(eight).meta["residual_id"] == residual_weights.load("gray").model_id
    assert residual_coder.INPUTS not in _tile_sections(eight) and residual_coder.SCALES in _tile_sections(eight)
    assert max_abs_error(visemz.decompress(eight), img) <= 1
    nine = visemz.ImageCodec("cpu").compress(img, max_error=1, image_format=image_header.INTEGER)
    assert container.unpack(nine).meta["format"] == image_header.INTEGER
    assert max_abs_error(visemz.decompress(nine), img) <= 1
    assert container.unpack(nine).meta["residual_id"] == residual_weights.load("gray", integer=True).model_id
    assert residual_coder.INPUTS in _tile_sections(nine)


# ------------------------------------------------------------------ scale calibration (format 8)
def _noisy(shape, sigma: float, seed: int = 5) -> np.ndarray:
    """The camera photo with strong noise: far wider residuals than the prior predicts from its reconstruction."""
    img = data.camera()[100:100 + shape[0], 120:120 + shape[1]].astype(np.float64)
    return np.clip(img + np.random.default_rng(seed).normal(0, sigma, shape), 0, 255).astype(np.uint8)


def test_calibration_finds_the_scale_the_values_have():
    """q drawn from a logistic five scale steps wider than the scale index says: the group of that index moves by
    about five, the others (no values) stay."""
    tables = residual_weights.load("gray").tables
    si_true, said = 100, 95
    scale = RT.SCALE_MIN * 2.0 ** (si_true / RT.STEPS)
    u = np.random.default_rng(0).uniform(1e-9, 1 - 1e-9, 200_000)
    q = torch.from_numpy(np.floor(scale * np.log(u / (1 - u)) + 0.5).astype(np.int64))
    si = torch.full_like(q, said)
    fi = torch.full_like(q, RT.CENTRES // 2)  # centre (8.5 / 16 - 0.5): next to 0, as the draws are
    shifts = residual_coder._calibration(q, si, fi, None, tables)
    assert shifts.shape == (residual_coder.GROUPS,)
    assert 4 <= int(shifts[said // residual_coder.GROUP]) <= 6
    assert int(shifts.abs().sum()) == int(shifts[said // residual_coder.GROUP].abs())


@pytest.mark.parametrize("e", [0, 2])
def test_calibrated_file_decodes_within_the_bound_and_is_smaller(e):
    img = _noisy((96, 112), sigma=12.0)
    cpu = visemz.ImageCodec("cpu")
    calibrated = cpu.compress(img, max_error=e, quality=2, image_format=image_header.CALIBRATED)
    plain = cpu.compress(img, max_error=e, quality=2, image_format=codec_module.LEARNED)
    shifts = residual_coder.unpack_scales(_tile_sections(calibrated)[residual_coder.SCALES])
    assert shifts.size == len(residual_prior.PASSES) * residual_coder.GROUPS and shifts.any()
    assert len(calibrated) < len(plain)
    out = visemz.decompress(calibrated)
    assert max_abs_error(out, img) <= e
    if e == 0:
        np.testing.assert_array_equal(out, img)


def test_colour_tiles_calibrate_each_step():
    """An RGB tile's twelve steps (a pass's channels in turn) each have their shifts."""
    img = np.clip(data.astronaut()[100:196, 150:262].astype(np.float64)
                  + np.random.default_rng(6).normal(0, 12, (96, 112, 3)), 0, 255).astype(np.uint8)
    buf = visemz.compress(img, max_error=0, quality=6)
    shifts = residual_coder.unpack_scales(_tile_sections(buf)[residual_coder.SCALES])
    assert shifts.size == len(residual_prior.steps(3)) * residual_coder.GROUPS and shifts.any()
    np.testing.assert_array_equal(visemz.decompress(buf), img)


def test_small_tiles_calibrate_nothing():
    """Where no step's shifts would pay for their share of the section, the section is empty."""
    buf = visemz.compress(_photo((24, 20)), max_error=0, quality=2)
    assert _tile_sections(buf)[residual_coder.SCALES] == b""


def test_crafted_scale_sections_are_refused():
    img = _noisy((96, 112), sigma=12.0)
    buf = visemz.compress(img, max_error=1, quality=2)
    n = len(residual_prior.PASSES) * residual_coder.GROUPS
    frame = residual_coder.pack_scales
    too_far = np.zeros(n, np.int64)
    too_far[7] = residual_coder.MAX_DELTA + 1
    bad = [
        frame(too_far),  # a shift beyond the range
        frame(np.ones(n - 1, np.int64)),  # not GROUPS per step
        frame(np.ones(3 * n, np.int64)),  # a colour tile's count in a gray one
        b"\x00\x01\x02\x03",  # not a zstd frame
        frame(np.ones(n, np.int64))[:-3],  # a frame cut short
    ]
    for body in bad:
        with pytest.raises(CorruptStreamError, match="scale calibration"):
            visemz.decompress(with_tile_part(buf, residual_coder.SCALES, body))


# ------------------------------------------------------------------ devices that differ in the last bits
def _moved(t: torch.Tensor, rel: float, gen) -> torch.Tensor:
    return t * (1 + rel * (2 * torch.rand(t.shape, generator=gen, dtype=t.dtype) - 1)) + 1e-12


def _perturbed_heads(monkeypatch, rel: float, seed: int):
    """Every head's outputs (float and integer prior) moved by up to ``rel`` of themselves (and 1e-12 absolute): what
    another device's float64 arithmetic could give."""
    gen = torch.Generator().manual_seed(seed)
    for owner in (residual_prior.ResidualPrior, integer_prior.IntegerNet):
        def head(self, k, trunk, context, inner=owner.head):
            return tuple(_moved(t, rel, gen) for t in inner(self, k, trunk, context))

        monkeypatch.setattr(owner, "head", head)


def _perturbed_synthesis(monkeypatch, rel: float, seed: int):
    """The decoder's float64 synthesis (reconstruction and reduced features) moved by up to ``rel`` of itself: what
    another device's could give."""
    gen, inner = torch.Generator().manual_seed(seed), residual_coder.decode

    def decode(res, sections, synthesis, meta, e):
        return inner(res, sections, [_moved(synthesis[0], rel, gen), _moved(synthesis[1], rel, gen)], meta, e)

    monkeypatch.setattr(residual_coder, "decode", decode)


@pytest.mark.parametrize("fmt", [image_header.CALIBRATED, image_header.INTEGER])
@pytest.mark.parametrize("e", [0, 2])
def test_decoder_with_other_last_bits_decodes_the_same(monkeypatch, e, fmt):
    img = _photo((48, 56), "uint16")
    buf = visemz.ImageCodec("cpu").compress(img, max_error=e, quality=2, image_format=fmt)
    want = visemz.decompress(buf)
    assert max_abs_error(want, img) <= e
    _perturbed_heads(monkeypatch, 1e-12, seed=e)
    _perturbed_synthesis(monkeypatch, 1e-12, seed=e)
    np.testing.assert_array_equal(visemz.decompress(buf), want)


@pytest.mark.parametrize("fmt", [image_header.CALIBRATED, image_header.INTEGER])
def test_every_position_listed_decodes_through_the_list(monkeypatch, fmt):
    """With a tolerance of half a unit every position (and every input of the integer prior) is listed: the decoder
    then codes with the encoder's integers alone, whatever its own network and synthesis say."""
    img = _photo((32, 40))
    monkeypatch.setattr(residual_coder, "TOL", 0.5)
    buf = visemz.ImageCodec("cpu").compress(img, max_error=1, quality=2, image_format=fmt)
    sections = _tile_sections(buf)
    assert len(sections[residual_coder.FIXES]) > 0
    _perturbed_heads(monkeypatch, 1e-3, seed=1)  # far beyond float64 noise: only the lists can keep it right
    if fmt == image_header.INTEGER:
        assert len(sections[residual_coder.INPUTS]) > 0
        _perturbed_synthesis(monkeypatch, 1e-3, seed=2)
    assert max_abs_error(visemz.decompress(buf), img) <= 1


def _tile_sections(buf) -> dict:
    return codec_module.ImageCodec("cpu")._open(buf).tile(0)[0]


def test_crafted_fixes_are_refused():
    img = _photo((20, 24))
    buf = visemz.compress(img, max_error=0, quality=2)
    n = 10 * 12  # positions of a pass's half-resolution grid
    bad = [
        [1, 0, 0, 0, n + 5, 3, 0, 0],  # a position beyond the grid
        [1, 0, 0, 0, 0, 3, RT.SI_MAX + 1, 0],  # a scale index beyond the grid
        [1, 0, 0, 0, 0, 3, 0, RT.CENTRES],  # a centre index beyond the grid
        [2, 0, 0, 0, 4, 0, 3, 3, 0, 0, 0, 0],  # positions not increasing
        [1, 0, 0],  # fewer values than the counts say
        [-1, 0, 0, 0],
    ]
    for values in bad:
        fixes = residual_coder.encode_ints(np.asarray(values, np.int32), policy="global", entropy="none")
        with pytest.raises(CorruptStreamError):
            visemz.decompress(with_tile_part(buf, residual_coder.FIXES, fixes))


def test_crafted_inputs_lists_are_refused():
    img = _photo((20, 24))
    buf = visemz.ImageCodec("cpu").compress(img, max_error=0, quality=2, image_format=image_header.INTEGER)
    n_reduced, n_pred = 32 * 32 * 32, 4 * 32 * 32  # the padded 64 x 64 core's reduced features and predictions
    bad = [
        [1, 0, n_reduced, 5],  # a position beyond the reduced features
        [0, 1, n_pred, 5],  # beyond the predictions
        [2, 0, 4, 0, 1, 1],  # positions not increasing
        [1, 1, 0, 3],  # fewer values than the counts say
        [-1, 0],
        [5],
    ]
    for values in bad:
        body = residual_coder.encode_ints(np.asarray(values, np.int32), policy="global", entropy="none")
        with pytest.raises(CorruptStreamError, match="residual inputs"):
            visemz.decompress(with_tile_part(buf, residual_coder.INPUTS, body))
    listed = residual_coder.encode_ints(np.asarray([1, 1, 7, 0, 3, 200], np.int32), policy="global", entropy="none")
    try:  # a valid list, if not the encoder's: other pixels in range, or damage found by the streams
        assert visemz.decompress(with_tile_part(buf, residual_coder.INPUTS, listed)).shape == img.shape
    except CorruptStreamError:
        pass
    # a reduced feature listed far beyond the clamp (as an older writer could list it) is the clamp's value
    outcomes = []
    for value in (127, 40000, 2 ** 31 - 1):
        body = residual_coder.encode_ints(np.asarray([1, 0, 7, value], np.int32), policy="global", entropy="none")
        try:
            outcomes.append(visemz.decompress(with_tile_part(buf, residual_coder.INPUTS, body)).tobytes())
        except CorruptStreamError as e:
            outcomes.append(str(e))
    assert outcomes[1] == outcomes[0] and outcomes[2] == outcomes[0]


def test_damaged_pass_stream_is_refused_or_stays_in_range():
    img = _photo((20, 24))
    buf = visemz.compress(img, max_error=0, quality=2)
    c = container.unpack(buf)
    body = bytearray(c.sections["tiles"])
    for pos in range(0, len(body), max(1, len(body) // 12)):
        damaged = bytearray(body)
        damaged[pos] ^= 0x5A
        crafted = container.pack(c.kind, c.meta, {"tile_index": bytes(c.sections["tile_index"]),
                                                  "tiles": bytes(damaged)})
        try:
            out = visemz.decompress(crafted)
        except visemz.VisemzError:
            continue
        assert out.shape == img.shape and out.dtype == img.dtype  # damage that decodes still gives pixels in range


@pytest.mark.parametrize("step", [0, 3])
@pytest.mark.parametrize("where, why", [(0, "beyond"), (-1, "low-bits value outside")])
def test_symbols_out_of_range_are_refused_after_the_passes(monkeypatch, step, where, why):
    """A stream whose symbols decode to a residual beyond MAX_Q bins, or to low bits beyond their table (the last
    value of a pass of wide distributions), is refused.  The check waits for the last pass; damage in an earlier
    pass changes the later passes' distributions, whose streams then fail their own checks first."""
    img = np.random.default_rng(3).integers(0, 65536, (24, 30), dtype=np.uint16)
    buf = visemz.compress(img, max_error=0, quality=1)
    inner, steps_run = residual_coder.decode_conditional, []

    def tampered(stream, idx, tables):
        values = np.array(inner(stream, idx, tables), copy=True)
        if len(steps_run) == step:
            values[where] = residual_coder.MAX_Q + 1 if where == 0 else 1 << 30
        steps_run.append(len(steps_run))
        return values

    monkeypatch.setattr(residual_coder, "decode_conditional", tampered)
    last = step == len(residual_prior.PASSES) - 1
    with pytest.raises(CorruptStreamError, match=why if last else None):
        visemz.decompress(buf)
    assert len(steps_run) == len(residual_prior.PASSES) or not last


# ------------------------------------------------------------------ the pieces
blocks_plan = blocks.plan


def test_blocks_give_the_whole_result(monkeypatch):
    torch.manual_seed(0)
    prior = residual_prior.ResidualPrior(1, 16, 8, 4).double()
    reduced = torch.randn(2, 4, 37, 23, dtype=torch.float64)
    x01 = torch.rand(2, 1, 74, 46, dtype=torch.float64)
    side = [torch.zeros(2, dtype=torch.float64)] * 2
    whole = prior.condition(reduced, x01, *side)
    monkeypatch.setitem(blocks.WORK_BYTES, "cpu", 9 * 8 * 8 * 2 * 2 * 100)  # 100 positions: 4 x 4 blocks, halo 3
    assert len(blocks.plan(37, 23, 3, 3, 9 * 8 * 8 * 2 * 2, "cpu")) > 20
    twice = residual_coder._twice
    blocked = residual_coder._blocked(lambda r, q: prior.condition(reduced[:, :, r, q], x01[:, :, twice(r), twice(q)],
                                                                   *side), reduced, 3, 8)
    torch.testing.assert_close(blocked, whole, rtol=1e-12, atol=1e-12)


def test_blocks_keep_the_windows_layout(monkeypatch):
    """The residual prior's activations are channels last on conv64's path: the whole result of several blocks is laid
    out as each window's was (the heads then read the trunk without a copy), and holds the same values."""
    x = torch.randn(1, 6, 9, 7, dtype=torch.float64)
    monkeypatch.setitem(blocks.WORK_BYTES, "cpu", 16)  # 16 positions a window
    for layout in (torch.contiguous_format, torch.channels_last):
        plan = blocks.plan(9, 7, 1, 1, 1, "cpu")
        out, = blocks.run(lambda r, c: ((x[:, :, r[0]:r[1], c[0]:c[1]] * 2).contiguous(memory_format=layout),),
                          plan, (1,))
        assert len(plan) > 1 and out.is_contiguous(memory_format=layout)
        torch.testing.assert_close(out, 2 * x, rtol=0, atol=0)


def test_blocks_on_the_implicit_gemm_kernel_are_sized_without_im2col(monkeypatch):
    """Where conv64 runs the float64 networks no im2col buffer is made: a 2048 x 2048 image's synthesis and prior
    passes then fit one block of the GPU's budget, where ATen's im2col needs two (each block recomputing its halo)."""
    from visemz.models import architectures
    from visemz.models import weights as W

    net, _ = W.load(registry.spec("mbt2018-mean", "gray"))
    y = torch.zeros(1, 192, 128, 128, dtype=torch.float64)
    half = torch.zeros(1, 48, 1024, 1024, dtype=torch.float64)
    plans = []
    monkeypatch.setattr(blocks, "plan", lambda *a: plans.append(blocks_plan(*a[:5], "cuda")) or plans[-1])
    for on in (False, True):
        monkeypatch.setattr(architectures, "implicit_gemm_on", lambda x, on=on: on)
        unit = tiling._synthesis_unit(net, y, im2col=not architectures.implicit_gemm_on(y))
        synthesis = blocks_plan(128, 128, *tiling.SYNTHESIS_HALO, unit, "cuda")
        prior = residual_coder._blocked(lambda r, q: half[:, :2, r, q], half, 2, 52)
        assert prior.shape == (1, 2, 1024, 1024)
        assert (len(synthesis), len(plans[-1])) == ((1, 1) if on else (2, 2))


def test_blocked_synthesis_and_analysis_give_the_whole_result(monkeypatch):
    from visemz.models import architectures
    from visemz.models import weights as W

    spec = registry.spec("mbt2018-mean", "gray")
    net, _ = W.load(spec)
    net64 = codec_module._model64(spec, "cpu")
    reduce = torch.nn.Conv2d(net.g_s[-1].in_channels, 4, 1).double()
    y = torch.randn(1, 192, 9, 5, dtype=torch.float64)
    x = torch.rand(2, 1, 128, 192)
    with torch.inference_mode():
        whole = tiling.synthesis_features(net64, reduce, y)
        analysed = architectures.analysis_transform(net, x)
        monkeypatch.setitem(blocks.WORK_BYTES, "cpu", 1)  # one position per block
        assert len(blocks.plan(9, 5, 1, 2, 1, "cpu")) == 45
        for a, b in zip(tiling.synthesis_features(net64, reduce, y), whole):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(architectures.analysis_transform(net, x), analysed, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("variant", ["gray", "rgb"])
def test_training_loss_is_what_the_coder_spends(variant):
    """nll_bits (the training objective) against the bytes of the step streams, on one image, for the float prior
    (format 8) and the integer one (format 9, its layers run as coding runs them): the coder codes in the order
    training assumes (a colour pass a channel at a time)."""
    for fmt in (image_header.CALIBRATED, image_header.INTEGER):
        _check_training_loss(variant, fmt)


def _check_training_loss(variant: str, fmt: int) -> None:
    res = residual_weights.load(variant, integer=image_header.integer_prior(fmt))
    img = _photo((96, 128)) if variant == "gray" else np.ascontiguousarray(data.astronaut()[100:196, 150:278])
    e = 0
    buf = visemz.ImageCodec("cpu").compress(img, max_error=e, quality=3, image_format=fmt)
    sections = _tile_sections(buf)
    channels = 3 if variant == "rgb" else 1
    coded = 8 * sum(len(sections[k]) for k in residual_coder.step_sections(channels))
    f = codec_module.ImageCodec("cpu")._open(buf)
    with torch.inference_mode():
        _, _, (x01, reduced) = next(codec_module.ImageCodec("cpu")._tile_pixels(
            f.net, f.net64, f.header["quality"], f.meta, f.grid, [0], f.symbols, True, res))
        x = torch.from_numpy(np.atleast_3d(img).transpose(2, 0, 1).astype(np.float64))[None]
        one = torch.ones(1, dtype=torch.float64)
        h, w = img.shape[:2]  # the image's own pixels (the coder codes no padding)
        if res.integer is None:
            bits = float(residual_prior.nll_bits(res.prior64, reduced[:, :, :h // 2, :w // 2], x01[:, :, :h, :w], x,
                                                 0 * one, 255 * one, e * one))
        else:
            bits = integer_prior_bits(res.integer, reduced[:, :, :h // 2, :w // 2], x01[:, :, :h, :w], x, e)
    assert 0.95 < coded / bits < 1.05, (fmt, coded, bits)


def test_tables_family_is_shipped_with_the_prior():
    res = residual_weights.load("gray")
    assert res.tables.n_tables == RT.UNIFORM + RT.MAX_SHIFT
    assert math.isclose(RT.scales()[RT.TOP], RT.SCALE_MIN * 2 ** (RT.TOP / RT.STEPS))


# ------------------------------------------------------------------ sparse values: the palette
def _stretched() -> np.ndarray:
    """16-bit data stretched from 8-bit levels, as astronomy images and scaled microscope frames come."""
    return (data.camera()[:40, :48].astype(np.float64) * (65535 / 255)).round().astype(np.uint16)


def test_near_lossless_of_sparse_values_keeps_the_smaller_lossless_file(monkeypatch):
    """Near-lossless cannot use the palette, so a sparse image's lossless file is also made and kept when smaller
    (it keeps any bound); a dense image keeps its bounded file."""
    img = _stretched()
    chosen, lossless = (visemz.compress(img, max_error=e, quality=2) for e in (1, 0))
    assert chosen == lossless and container.unpack(chosen).meta["max_error"] == 0
    np.testing.assert_array_equal(visemz.decompress(chosen), img)
    dense = _photo((40, 52))
    assert container.unpack(visemz.compress(dense, max_error=1, quality=2)).meta["max_error"] == 1
    monkeypatch.setattr(residual_coder, "SPARSE", 1 << 20)  # nothing sparse: the bounded file alone
    bounded = visemz.compress(img, max_error=1, quality=2)
    assert container.unpack(bounded).meta["max_error"] == 1 and len(lossless) < len(bounded)
    assert max_abs_error(visemz.decompress(bounded), img) <= 1


def test_sparse_values_go_through_a_palette(monkeypatch):
    img = _stretched()
    buf = visemz.compress(img, max_error=0, quality=2)
    np.testing.assert_array_equal(visemz.decompress(buf), img)
    assert len(_tile_sections(buf)[residual_coder.PALETTE]) > 0
    monkeypatch.setattr(residual_coder, "SPARSE", 1 << 20)  # no palette
    plain = visemz.compress(img, max_error=0, quality=2)
    assert len(_tile_sections(plain)[residual_coder.PALETTE]) == 0
    np.testing.assert_array_equal(visemz.decompress(plain), img)
    assert len(buf) < 0.75 * len(plain)


def _crowded() -> np.ndarray:
    """16-bit values that are sparse in their span but many: a palette would list nearly every pixel's value."""
    return np.random.default_rng(5).normal(30000, 3000, (40, 48)).round().astype(np.uint16)


@pytest.mark.parametrize("image, palette_kept", [(_stretched, True), (_crowded, False)])
def test_sparse_values_are_coded_both_ways_and_the_smaller_kept(monkeypatch, image, palette_kept):
    img = image()
    assert codec_module._sparse_values(torch.from_numpy(img.astype(np.int32)), codec_module.describe(
        torch.from_numpy(img)))
    buf = visemz.compress(img, max_error=0, quality=2)
    np.testing.assert_array_equal(visemz.decompress(buf), img)
    assert (len(_tile_sections(buf)[residual_coder.PALETTE]) > 0) == palette_kept
    inner = residual_coder.encode
    monkeypatch.setattr(residual_coder, "encode", lambda *a: inner(*a[:5], False, *a[6:]))
    palette_only = visemz.compress(img, max_error=0, quality=2)
    monkeypatch.setattr(residual_coder.D, "encode", lambda *a: None)  # and image format 10's differences
    monkeypatch.setattr(residual_coder, "SPARSE", 1 << 20)
    levels_only = visemz.compress(img, max_error=0, quality=2)
    assert buf == min(palette_only, levels_only, key=len) and len(palette_only) != len(levels_only)


def test_near_lossless_tries_the_lossless_file_through_the_palette_only(monkeypatch):
    coded = []
    inner = residual_coder._encoded
    monkeypatch.setattr(residual_coder, "_encoded", lambda *a: coded.append(a[5] is not None) or inner(*a))
    visemz.compress(_stretched(), max_error=1, quality=2)
    assert coded == [False, True]  # the bounded file in levels, the lossless one through its palette


def test_near_lossless_and_dense_images_take_no_palette(monkeypatch):
    monkeypatch.setattr(codec_module, "_sparse_values", lambda t, meta: False)  # the bounded file
    for img, e in ((_stretched(), 1), (_photo((40, 48)), 0)):
        buf = visemz.compress(img, max_error=e, quality=2)
        assert len(_tile_sections(buf)[residual_coder.PALETTE]) == 0
        assert max_abs_error(visemz.decompress(buf), img) <= e


def test_crafted_palettes_are_refused():
    img = _stretched()
    buf = visemz.compress(img, max_error=0, quality=2)
    lo, hi = int(img.min()), int(img.max())
    bad = [
        [lo, 5, 0, 7],  # not increasing
        [lo - 1, 3],  # below the image's range
        [hi, 3],  # beyond it
        list(range(lo, lo + 400)),  # not sparse: values that fill their span
    ]
    for values in bad:
        gaps = np.diff(np.asarray(values, np.int64), prepend=0).astype(np.int32)
        body = residual_coder.encode_ints(gaps, policy="block", entropy="zstd")
        with pytest.raises(CorruptStreamError):
            visemz.decompress(with_tile_part(buf, residual_coder.PALETTE, body))
    near = visemz.compress(img, max_error=1, quality=2)  # a palette where the bound is not 0
    body = residual_coder.encode_ints(np.array([lo, 257], np.int32), policy="block", entropy="zstd")
    with pytest.raises(CorruptStreamError):
        visemz.decompress(with_tile_part(near, residual_coder.PALETTE, body))


def _ladder_walk(sizes: list[int], start: int) -> list[int]:
    """The rungs quality="auto" codes, as indexes into the ladder: ``start`` and the one above, then on up while each
    next file is smaller than the smallest so far; where the one above was not smaller, down from ``start`` alike."""
    walk = [start, start + 1]
    step = 1 if sizes[start + 1] < sizes[start] else -1
    j = max(walk) if step == 1 else start
    while 0 <= j + step < len(sizes):
        j += step
        walk.append(j)
        if sizes[j] >= min(sizes[k] for k in walk[:-1]):
            break
    return walk


@pytest.mark.parametrize("variant", ["gray", "rgb"])
def test_auto_quality_keeps_the_smallest_file(variant):
    img = _photo((40, 48)) if variant == "gray" else np.ascontiguousarray(data.astronaut()[100:140, 150:198])
    qualities = codec_module.AUTO_QUALITIES[variant]
    sizes = [len(visemz.compress(img, max_error=1, quality=q)) for q in qualities]
    buf = visemz.compress(img, max_error=1, quality="auto")
    walk = _ladder_walk(sizes, qualities.index(codec_module.AUTO_START[variant]))
    smallest = min(walk, key=lambda k: (sizes[k], walk.index(k)))
    assert len(buf) == sizes[smallest]
    assert container.unpack(buf).meta["quality"] == qualities[smallest]
    assert max_abs_error(visemz.decompress(buf), img) <= 1
    with pytest.raises(visemz.InvalidArgumentError, match="max_error"):
        visemz.compress(img, quality="auto")


@pytest.mark.parametrize("sizes, walk", [
    ([99, 100, 90, 80, 85], [1, 2, 3, 4]),  # up, until a file is larger
    ([99, 90, 95, 10, 10], [1, 2, 0]),  # the rung above not smaller: down
    ([80, 90, 95, 10, 10], [1, 2, 0]),  # ... where the rung below is smaller
    ([99, 100, 90, 80, 70], [1, 2, 3, 4]),  # up to the top
    ([99, 100, 100, 10, 10], [1, 2, 0]),  # a tie is no gain
])
def test_auto_quality_walks_the_ladder_while_it_pays(monkeypatch, sizes, walk):
    """From the start rung (gray: quality 2) the walk codes the rung above, then goes on up while each next file is
    smaller, or down where the rung above was not smaller; the smallest file is kept, the first of a tie."""
    qualities = codec_module.AUTO_QUALITIES["gray"]
    assert qualities.index(codec_module.AUTO_START["gray"]) == 1
    coded = []

    def fake(self, t, meta, q, e, **kw):
        coded.append(q)
        return bytes(sizes[qualities.index(q)])

    monkeypatch.setattr(codec_module.ImageCodec, "_compress", fake)
    buf = visemz.compress(_photo((40, 48)), max_error=1, quality="auto")
    assert _ladder_walk(sizes, 1) == walk
    assert coded == [qualities[k] for k in walk] and len(buf) == min(sizes[k] for k in walk)
