"""The integer residual prior (models/integer_prior.py): its exact integer inputs, its training form against the
integer layers coding runs, the layers' exactness (8-bit products, float64), its weights file."""

import math
from fractions import Fraction

import pytest
import torch
from safetensors.torch import save_file

from visemz.errors import UnsupportedFormatError
from visemz.models import integer_prior as IP
from visemz.models import residual_weights
from visemz.models.residual_prior import ResidualPrior
from visemz.models.weights import read_tensors

from .helpers import integer_prior_bits


def test_octave_steps_are_exact():
    """round(8 log2(num / den)) by integers: the defining inequalities hold everywhere, and math.log2 agrees away
    from the rounding's boundaries; the clamp and bad arguments."""
    for num in list(range(1, 2100)) + [65535, 65536, 1 << 20, 3 ** 13]:
        for den in (1, 7, 255):
            n = IP.octave_steps(num, den)
            exact = 8 * math.log2(num / den)
            if abs(exact) < 126:
                a, b = Fraction(num, den) ** 16, Fraction(2)
                assert b ** (2 * n - 1) <= a < b ** (2 * n + 1), (num, den, n)
            if abs(exact - math.floor(exact) - 0.5) > 1e-9:
                assert n == max(-127, min(127, math.floor(exact + 0.5))), (num, den)
    assert IP.octave_steps(1 << 20, 1) == 127 and IP.octave_steps(1, 1 << 20) == -127
    assert IP.side_steps(255, 1) == (0, 0) and IP.side_steps(65535, 5) == (64, 19)
    try:
        IP.octave_steps(0, 255)
    except ValueError as e:
        assert "0 / 255" in str(e)
    else:
        raise AssertionError("octave_steps(0, 255) returned")


def test_recon_and_context_steps_round_their_definitions():
    """recon = round(127 (p16 / 16 - lo) / span) in 0..127 and context = round(2 * 255 (x - p16 / 16) / span) in
    -127..127, halves up, computed in integers (int64 and float64 tensors alike)."""
    g = torch.Generator().manual_seed(0)
    for lo, span in ((0, 255), (100, 900), (0, 65535), (17, 1)):
        p16 = torch.randint(16 * lo - 40, 16 * (lo + span) + 40, (500,), generator=g)
        x = torch.randint(lo, lo + span + 1, (500,), generator=g)
        for dtype in (torch.int64, torch.float64):
            recon = IP.recon_steps(p16.to(dtype), lo, span)
            context = IP.context_steps(x.to(dtype), p16.to(dtype), span)
            for i in range(0, 500, 7):
                r = Fraction(127) * (Fraction(int(p16[i]), 16) - lo) / span
                assert int(recon[i]) == max(0, min(127, math.floor(r + Fraction(1, 2)))), (lo, span, i)
                c = Fraction(2 * 255) * (int(x[i]) - Fraction(int(p16[i]), 16)) / span
                assert int(context[i]) == max(-127, min(127, math.floor(c + Fraction(1, 2)))), (lo, span, i)


def trained_like(seed: int = 0) -> IP.IntegerPrior:
    """A small integer prior with seeded weights (its output layers too) and steps set on a seeded batch."""
    torch.manual_seed(seed)
    prior = IP.IntegerPrior(1, 16, 24, 8).double()
    for head in prior.heads:
        torch.nn.init.normal_(head[-1].weight, std=0.05)
    reduced = torch.randn(2, 8, 12, 10, dtype=torch.float64)
    x01 = torch.rand(2, 1, 24, 20, dtype=torch.float64)
    prior.init_steps(reduced, x01, torch.zeros(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64),
                     torch.randn(2, 4, 12, 10, dtype=torch.float64) * 0.3)
    return prior.requires_grad_(False)


def test_the_integer_layers_compute_what_the_training_form_does():
    """The exported layers against the training form on the same integer inputs: the trunk's activations equal
    (the requantisation's fixed point can move a value at a rounding tie only), the heads' outputs within a
    rounding of the fixed point."""
    prior = trained_like()
    net = prior.integers()
    g = torch.Generator().manual_seed(1)
    r = torch.randint(-127, 128, (2, 8, 12, 10), generator=g)
    recon = torch.randint(0, 128, (2, 4, 12, 10), generator=g)
    context = torch.randint(-30, 31, (2, 4, 12, 10), generator=g)
    side = (IP.octave_steps(900, 255), IP.octave_steps(5, 1))
    want = prior.condition_int(r.double(), recon.double(), torch.tensor([side, side], dtype=torch.float64))
    got = net.condition(r, recon, side)
    assert got.dtype == torch.int8 and float((got.double() == want).double().mean()) > 0.999
    assert 0.05 < float((got > 0).double().mean()) < 0.95
    for k in range(4):
        w_off, w_log = prior.head_int(k, got.double(), context.double())
        g_off, g_log = net.head(k, got, context)
        assert g_off.dtype == torch.float64
        assert float((g_off - w_off).abs().max()) < 0.05 and float((g_log - w_log).abs().max()) < 0.05


@pytest.mark.parametrize("path", ["int8 products", "float64"])
def test_layers_are_exact_integers(path, monkeypatch):
    """``run_layer`` on the CPU's 8-bit matrix products and through float64 convolutions equals the integer sums made
    in int64, requantised by hand: a 3 x 3 layer of 64 inputs with sums at their largest, and a 1 x 1 head layer."""
    if path == "float64":
        monkeypatch.setattr(IP, "int8_products_run", lambda: False)
    elif not IP.int8_products_run():  # a CPU without them: the probe warned, the float64 path serves (tested above)
        pytest.skip("this CPU's torch has no 8-bit matrix products")
    g = torch.Generator().manual_seed(2)
    w = torch.randint(-127, 128, (6, 64, 3, 3), generator=g).to(torch.int8)
    w[0], w[1] = 127, -127  # every product at its largest: sums of +-9 x 64 x 127 x 127
    b = torch.randint(-1000, 1000, (6,), generator=g).to(torch.int32)
    mult = torch.randint(1 << 20, 1 << 22, (6,), generator=g)
    x = torch.randint(-127, 128, (2, 64, 7, 9), generator=g).to(torch.int8)
    x[1] = 127
    cols = torch.nn.functional.unfold(torch.nn.functional.pad(x.double(), (1, 1, 1, 1)), 3).to(torch.int64)
    sums = (w.reshape(6, -1).to(torch.int64) @ cols).reshape(2, 6, 7, 9)
    assert int(sums.abs().max()) == 9 * 64 * 127 * 127
    acc = sums + b.view(1, -1, 1, 1)
    want = ((acc * mult.view(1, -1, 1, 1) + (1 << 31)) >> 32).clamp(0, 127)
    got = IP.run_layer(IP.IntegerLayer(w, b, mult, None), x)
    assert torch.equal(got.to(torch.int64), want) and int(want.max()) == 127 and int(want.min()) == 0
    step = torch.rand(6, generator=g, dtype=torch.float64)
    assert torch.equal(IP.run_layer(IP.IntegerLayer(w, b, None, step), x), acc.double() * step.view(1, -1, 1, 1))
    head = torch.randint(-127, 128, (2, 6, 1, 1), generator=g).to(torch.int8)
    want = torch.einsum("oc,bchw->bohw", head[:, :, 0, 0].to(torch.int64), got.to(torch.int64))
    assert torch.equal(IP.layer_sums(head, got, 0), want)
    assert IP.layer_sums(w, torch.zeros(0, 64, 7, 9, dtype=torch.int8), 1).shape == (0, 6, 7, 9)  # no images


def test_without_int8_products_float64_serves(monkeypatch):
    """Where the CPU's 8-bit products fail, one warning names it and the float64 path gives the same sums."""
    def fails(*_):
        raise RuntimeError("no int8 matrix products here")

    IP.int8_products_run.cache_clear()
    monkeypatch.setattr(torch, "_int_mm", fails)
    try:
        with pytest.warns(RuntimeWarning, match="8-bit matrix products cannot run here.*no int8 matrix products"):
            assert not IP.int8_products_run()
        x = torch.randint(-127, 128, (1, 5, 4, 4), dtype=torch.int8)
        w = torch.randint(-127, 128, (3, 5, 3, 3), dtype=torch.int8)
        want = torch.round(torch.nn.functional.conv2d(x.double(), w.double(), padding=1)).to(torch.int64)
        assert torch.equal(IP.layer_sums(w, x, 1), want)
    finally:
        IP.int8_products_run.cache_clear()


def test_weights_file_round_trip(tmp_path):
    """An exported prior written as residual-int8-VARIANT beside a float prior and loaded back: the same layers and
    outputs, the float prior's tables; beside a float prior of other tables it is refused."""
    card = {"lossy_model": "m", "lossy_model_id": "0"}
    residual_weights.save(ResidualPrior(1, 16, 24, 8), "gray", card, tmp_path)
    net = trained_like(3).integers()
    model_id = residual_weights.save(net, "gray", card, tmp_path)
    path = residual_weights.path_of("gray", tmp_path, integer=True)
    assert path.name == "residual-int8-gray.safetensors" and len(model_id) == 16
    assert not any(k.startswith("tables/") for k in read_tensors(path)[0])  # they stay in the float prior's file
    back = residual_weights._load(path, "gray", "cpu", integer=True)
    assert back.model_id == model_id and back.prior64 is None and back.features == 16
    float_prior = residual_weights._load(residual_weights.path_of("gray", tmp_path), "gray", "cpu")
    assert residual_weights.tables_digest(back.tables) == residual_weights.tables_digest(float_prior.tables)
    r, recon = torch.zeros(1, 8, 5, 6, dtype=torch.int64), torch.full((1, 4, 5, 6), 60)
    assert torch.equal(back.integer.condition(r, recon, (1, 2)), net.condition(r, recon, (1, 2)))
    assert back.integer.trunk[0].weight.dtype == torch.int8 and back.integer.heads[0][2].step.dtype == torch.float64
    tensors, meta = read_tensors(residual_weights.path_of("gray", tmp_path))
    tensors["tables/residual/offsets"] = tensors["tables/residual/offsets"].clone()
    tensors["tables/residual/offsets"][0] -= 1  # valid tables, other than those it was written with
    save_file(tensors, str(residual_weights.path_of("gray", tmp_path)), metadata=meta)
    with pytest.raises(UnsupportedFormatError, match="other tables"):
        residual_weights._load(path, "gray", "cpu", integer=True)


def test_nll_bits_is_what_the_integer_layers_code():
    """The training loss on an image equals the bits of the same passes run by the integer layers (float64 inputs
    rounded as coding rounds them)."""
    prior = trained_like(4)
    net = prior.integers()
    torch.manual_seed(5)
    x01 = torch.rand(1, 1, 24, 20, dtype=torch.float64)
    x = (x01 * 255 + torch.randn_like(x01) * 3).round().clamp(0, 255)
    reduced = torch.randn(1, 8, 12, 10, dtype=torch.float64)
    lo, hi, e = torch.zeros(1, dtype=torch.float64), torch.full((1,), 255.0, dtype=torch.float64), 1
    want = float(IP.nll_bits(prior, reduced, x01, x, lo, hi, torch.full((1,), float(e), dtype=torch.float64)))
    got = integer_prior_bits(net, reduced / torch.exp(prior.log_reduced).view(1, -1, 1, 1), x01, x, e)
    assert abs(got - want) < 1e-3 * want
