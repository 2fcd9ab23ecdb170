"""Encoder-side latent refinement (visemz/image/refine.py): valid files, a lower measured RD cost, the
error bound, tiles, the model left untouched, bad step counts refused."""

import dataclasses
import re

import numpy as np
import pytest
import torch
from skimage import data

import visemz
from visemz import config, defaults, measure
from visemz.errors import InvalidArgumentError
from visemz.image import refine, tiling
from visemz.image.pixels import describe, to_batch
from visemz.models import architectures, registry
from visemz.models import weights as W

from .helpers import symbols_of, trained

pytestmark = pytest.mark.usefixtures("model_weights")

ARCHS = ("balle2016", "mbt2018-mean")


def _rgb() -> np.ndarray:
    return data.astronaut()[0:128, 160:288].copy()


def _gray() -> np.ndarray:
    return data.camera()[80:208, 200:328].copy()


def _rd_cost(img: np.ndarray, buf: bytes, out: np.ndarray, quality: float) -> float:
    """The training loss measured for real: the file's bits per pixel + lambda * 255^2 * the decoded MSE (on [0, 1])."""
    bpp = measure.bpp(len(buf), measure.pixel_count(img.shape))
    return bpp + registry.lam(quality) * measure.mse(img, out)


def test_refine_zero_is_the_analysis(cpu):
    """refine=0 (and the default, VISEMZ_REFINE=0) writes the same bytes as before refinement existed: the
    symbols are round(g * g_a(x) - median) (factorized) and round(hg * h_a(y) - median_z), round(y - mean)
    (hyperprior), computed here from the model's layers directly."""
    assert defaults.get("refine") == 0
    img = _rgb()
    for arch in ARCHS:
        buf = cpu.compress(img, model=arch, quality=3.3, refine=0)
        assert buf == cpu.compress(img, model=arch, quality=3.3)
        net, _ = W.load(registry.spec(arch, "rgb"), "cpu")
        t = torch.from_numpy(img)
        with torch.inference_mode():
            x = to_batch(t, describe(t))
            g, _ = net.gain.at(3.3, x.dtype, x.device)
            y = net.g_a(x) * g
            med = architectures.medians(net.entropy_bottleneck)
            if arch == "balle2016":
                want = {"y": torch.round(y - med)}
            else:
                hg, _ = net.hyper_gain.at(3.3, x.dtype, x.device)
                z_sym = torch.round(net.h_a(y) * hg - med)
                _, means = architectures._hyper_params(net, z_sym, 3.3)
                want = {"y": torch.round(y - means), "z": z_sym}
        got = symbols_of(buf)
        assert set(got) == set(want)
        for k in want:
            torch.testing.assert_close(got[k], want[k].to(torch.int32), rtol=0, atol=0)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("variant", ["rgb", "gray"])
def test_refined_files_cost_less(cpu, model_weights, arch, variant):
    """Measured on the real bytes and the real decode: bpp + lambda * 255^2 * MSE is lower with 30 refinement
    steps than without, at a low and a high quality; the refined file decodes with the ordinary decoder."""
    if not trained(model_weights, f"{arch}-{variant}"):
        pytest.skip("rate-distortion needs the shipped weights (this test run made random ones)")
    img = _rgb() if variant == "rgb" else _gray()
    for quality in (2, 6):
        costs = {}
        for steps in (0, 30):
            buf = cpu.compress(img, model=arch, quality=quality, refine=steps)
            out = cpu.decompress(buf)
            assert out.dtype == img.dtype and out.shape == img.shape
            costs[steps] = _rd_cost(img, buf, out, quality)
        assert costs[30] < costs[0], f"{arch}-{variant} q{quality}: refined cost {costs[30]:.4f} >= {costs[0]:.4f}"


def test_error_bound_tiles_and_planes_with_refine(cpu):
    """max_error holds with refined symbols (the residual is taken against their reconstruction), on a tiled
    two-plane uint16 image whose size is not a multiple of 64 (edge padding left out of the distortion)."""
    rng = np.random.default_rng(0)
    base = data.camera()[:100, :150].astype(np.uint16) * 200
    img = np.stack([base, base[::-1] // 2], -1) + rng.integers(0, 50, (100, 150, 2), dtype=np.uint16)
    for arch in ARCHS:
        plain = cpu.compress(img, model=arch, quality=2, tile=64, max_error=300)
        buf = cpu.compress(img, model=arch, quality=2, tile=64, max_error=300, refine=4)
        assert buf != plain  # the symbols moved
        out = cpu.decompress(buf)
        assert out.dtype == img.dtype and out.shape == img.shape
        assert measure.max_abs_error(img, out) <= 300
        region = cpu.decompress(buf, region=(30, 90, 40, 140))
        np.testing.assert_array_equal(region, out[30:90, 40:140])
    rgb = _rgb()[:70, :90]
    out = cpu.decompress(cpu.compress(rgb, quality=5, max_error=0, refine=3))
    np.testing.assert_array_equal(out, rgb)


def test_model_untouched_and_grad_modes(cpu, monkeypatch):
    """Refinement under the caller's no_grad or inference_mode works (gradients reach the latents at
    every step), gives the same bytes each time, and leaves the model's weights, requires_grad flags,
    .grad and eval mode as they were."""
    img = _gray()[:64, :64]
    nonzero_grads = []
    real_grad = torch.autograd.grad

    def grad_spy(outputs, inputs, *args, **kwargs):
        grads = real_grad(outputs, inputs, *args, **kwargs)
        nonzero_grads.append(any(bool(g.abs().sum() > 0) for g in grads))
        return grads

    monkeypatch.setattr(torch.autograd, "grad", grad_spy)
    W.load.cache_clear()
    with torch.inference_mode():  # a model first loaded in inference mode is still one autograd can use
        nets = [W.load(registry.spec(arch, "gray"), "cpu")[0] for arch in ARCHS]
    before = [{k: v.clone() for k, v in net.state_dict().items()} for net in nets]
    flags = [[p.requires_grad for p in net.parameters()] for net in nets]
    outs = []
    for arch in ARCHS:
        with torch.inference_mode():
            a = visemz.compress(img, model=arch, quality=4, refine=3, device="cpu")
        with torch.no_grad():
            b = cpu.compress(img, model=arch, quality=4, refine=3)
        assert a == b
        outs.append(a)
    for net, state, flag in zip(nets, before, flags):
        assert not net.training
        assert [p.requires_grad for p in net.parameters()] == flag
        assert all(p.grad is None for p in net.parameters())
        for k, v in net.state_dict().items():
            assert torch.equal(v, state[k]), k
    # The refined symbols may equal the analysis's own (the start is kept when no step beats it), so
    # what shows that refinement ran is that every step's gradient reached the latents.
    assert nonzero_grads == [True] * (len(ARCHS) * 2 * 3)


@pytest.mark.parametrize("bad", [-1, 1.5, "3", True, None, config.MAX_REFINE + 1, 10**12])
def test_bad_refine_values_are_refused(cpu, bad):
    img = _gray()[:64, :64]
    if bad is None:  # None is the default (VISEMZ_REFINE), valid: the check itself refuses it
        with pytest.raises(InvalidArgumentError, match="refine=None"):
            refine.check_steps(None)
        return
    with pytest.raises(InvalidArgumentError, match=re.escape(f"refine={bad!r}")):
        cpu.compress(img, refine=bad)
    with pytest.raises(InvalidArgumentError, match="refine="):
        visemz.compress(img, refine=bad, device="cpu")


def test_refine_environment_default(monkeypatch):
    monkeypatch.setenv("VISEMZ_REFINE", "25")
    assert config.from_env().refine == 25
    for bad in ("-1", str(config.MAX_REFINE + 1), "ten"):
        monkeypatch.setenv("VISEMZ_REFINE", bad)
        with pytest.raises(InvalidArgumentError, match="VISEMZ_REFINE"):
            config.from_env()


def test_settings_schedules():
    s = refine.RefineSettings(11, lr=0.02, lr_floor=0.1, tau_start=0.5, tau_end=0.05)
    assert s.lr_at(0) == pytest.approx(0.02) and s.lr_at(10) == pytest.approx(0.002)
    assert s.tau_at(0) == pytest.approx(0.5) and s.tau_at(10) == pytest.approx(0.05)
    assert all(s.lr_at(i) > s.lr_at(i + 1) for i in range(10))
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.steps = 3


def test_cli_refine(cli, tmp_path, monkeypatch):
    """--refine reaches the codec (the refinement runs with that many steps and the file decodes); a bad
    value is a usage error naming it."""
    import cv2

    steps_seen = []
    real_refine = tiling.refine_symbols

    def refine_spy(net, x, quality, crop, valid, settings):
        steps_seen.append(settings.steps)
        return real_refine(net, x, quality, crop, valid, settings)

    monkeypatch.setattr(tiling, "refine_symbols", refine_spy)
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    cv2.imwrite(str(src / "a.png"), _gray()[:64, :64])
    assert cli("compress", src, dst / "r0", "--device", "cpu", "--refine", "0").exit_code == 0
    assert steps_seen == []
    assert cli("compress", src, dst / "r3", "--device", "cpu", "--refine", "3").exit_code == 0
    assert steps_seen == [3]
    b = (dst / "r3" / "a.png.vsz").read_bytes()
    assert visemz.decompress(b, device="cpu").shape == (64, 64)
    r = cli("compress", src, dst / "bad", "--refine", "-2")
    assert r.exit_code == 2 and "refine=-2" in r.stderr


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ARCHS)
def test_refined_on_gpu(gpu_cpu_codecs, model_weights, arch):
    """On CUDA: refined files decode on both devices to the same symbols, keep the error bound, and cost
    less (measured) than unrefined ones."""
    gpu, cpu = gpu_cpu_codecs
    img = _rgb()
    for quality in (2, 6):
        plain = gpu.compress(img, model=arch, quality=quality)
        buf = gpu.compress(img, model=arch, quality=quality, refine=30)
        on_gpu, on_cpu = symbols_of(buf, "cuda"), symbols_of(buf, "cpu")
        for k in on_cpu:
            torch.testing.assert_close(on_gpu[k].cpu(), on_cpu[k], rtol=0, atol=0)
        if trained(model_weights, f"{arch}-rgb"):
            assert _rd_cost(img, buf, cpu.decompress(buf), quality) < \
                _rd_cost(img, plain, cpu.decompress(plain), quality)
    out = cpu.decompress(gpu.compress(img, model=arch, quality=3, max_error=2, refine=10))
    assert measure.max_abs_error(img, out) <= 2

