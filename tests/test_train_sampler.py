"""tools/train.py's data path and the training pieces of the gained models."""

import importlib.util
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from compressai.entropy_models import EntropyBottleneck

from visemz.models import architectures, registry, training

_spec = importlib.util.spec_from_file_location("train_script", Path(__file__).parents[1] / "tools" / "train.py")
train = importlib.util.module_from_spec(_spec)
sys.modules["train_script"] = train  # dataclasses look their module up
_spec.loader.exec_module(train)


def _windows(img: np.ndarray, patch: int):
    _, h, w = img.shape
    for y in range(h - patch + 1):
        for x in range(w - patch + 1):
            yield img[:, y : y + patch, x : x + patch]


def _image(pixels: np.ndarray, group: str = "photo"):
    return train.Image(train._to16(pixels), group)


def test_crops_are_flipped_windows_of_the_images():
    rng = np.random.default_rng(1)
    images = [rng.integers(0, 256, (3, 9 + k, 7 + 2 * k), dtype=np.uint8) for k in range(3)]
    images.append(rng.integers(0, 256, (3, 4, 30), dtype=np.uint8))  # smaller than the patch: mirror-padded
    recs = [_image(im) for im in images]
    sampler = train.CropSampler(recs, train.draw_weights(recs, None), patch=5, device="cpu")
    padded = [train.CropSampler._fit(im, 5) for im in images]
    assert padded[3].shape == (3, 5, 30) and np.array_equal(padded[3][:, 4], images[3][:, 3])
    torch.manual_seed(0)
    out = torch.empty(96, 3, 5, 5)
    sampler.sample_into(out)
    crops = np.rint(out.numpy() * 255).astype(np.uint8)
    flips, sources = set(), set()
    for c in crops:
        found = None
        for k, im in enumerate(padded):
            for win in _windows(im, 5):
                for fy in (False, True):
                    for fx in (False, True):
                        cand = win[:, ::-1] if fy else win
                        cand = cand[:, :, ::-1] if fx else cand
                        if np.array_equal(cand, c):
                            found = (fy, fx)
                            sources.add(k)
        assert found is not None
        flips.add(found)
    assert len(flips) == 4  # all four flip combinations occur
    assert sources == {0, 1, 2, 3}


def test_sixteen_bit_images_are_stretched_like_the_codec_does():
    img = np.array([[1000, 3000], [2000, 1000]], np.uint16)
    assert train._to16(img).tolist() == [[0, 65535], [32768, 0]]
    assert train._to16(np.array([[0, 255]], np.uint8)).tolist() == [[0, 65535]]


def test_gray_mix_weights_groups_not_pixels():
    recs = [_image(np.zeros((1, 100, 100), np.uint8), "photo") for _ in range(8)]
    recs += [_image(np.zeros((1, 10, 10), np.uint8), "xray"), _image(np.zeros((1, 20, 10), np.uint8), "science")]
    by_area = train.draw_weights(recs, None)
    assert by_area[:8].sum() > 0.99
    mixed = train.draw_weights(recs, train.parse_mix("xray=0.5,science=0.2,photo=0.3"))
    assert mixed[8] == pytest.approx(0.5) and mixed[9] == pytest.approx(0.2) and mixed[:8].sum() == pytest.approx(0.3)
    with pytest.raises(SystemExit, match="no weight"):
        train.draw_weights(recs[:8], {"xray": 1.0})


def test_graph_safe_bottleneck_equals_compressai():
    eb = EntropyBottleneck(5).train()
    x = torch.randn(2, 5, 6, 7) * 3
    torch.manual_seed(3)
    want = eb(x)
    torch.manual_seed(3)
    got = training.bottleneck_train(eb, x)
    for w, g in zip(want, got):
        assert w.shape == g.shape
        assert torch.equal(w, g)
    got[1].sum().backward()  # gradients reach the bottleneck's own parameters
    assert eb.matrices[0].grad is not None


def test_training_gains_and_lambdas_match_inference():
    """The per-sample gains and lambdas of training equal what inference uses at the same quality."""
    units = architectures.GainUnits(6)
    with torch.no_grad():
        units.log_gain.add_(torch.randn_like(units.log_gain) * 0.3)
        units.log_inv_gain.add_(torch.randn_like(units.log_inv_gain) * 0.3)
    qs = [1.0, 1.5, 2.0, 3.25, 7.9, 8.0]
    g, inv = units.per_sample(torch.tensor(qs))
    table = training.log_lambda_table("cpu")
    lams = training.lambdas(torch.tensor(qs), table)
    for k, q in enumerate(qs):
        g1, inv1 = units.at(q, torch.float64, "cpu")
        torch.testing.assert_close(g[k].double(), g1[0], rtol=1e-6, atol=0)
        torch.testing.assert_close(inv[k].double(), inv1[0], rtol=1e-6, atol=0)
        assert float(lams[k]) == pytest.approx(registry.lam(q), rel=1e-6)
    assert registry.lam(3) == registry.COMPRESSAI_LAMBDAS[2]  # integers keep the zoo's meaning


def test_one_cpu_training_step_resumes_with_adam(tmp_path):
    recs = [_image(np.random.default_rng(k).integers(0, 256, (1, 70, 70), dtype=np.uint8), "xray") for k in range(3)]
    sampler = train.CropSampler(recs, train.draw_weights(recs, None), patch=64, device="cpu")
    t = train.Trainer("mbt2018-mean-gray", sampler, 1, "cpu", 1e-4, amp=False)
    metrics = t.train_step(1.0)
    assert torch.isfinite(metrics).all() and t.step == 1
    t.save(tmp_path / "out", tmp_path / "state", 1.0, "test")
    u = train.Trainer("mbt2018-mean-gray", sampler, 1, "cpu", 1e-4, amp=False)
    u.load(train.resume_path(tmp_path / "state", "mbt2018-mean-gray"))
    assert u.step == 1 and u.warm_from < 0  # Adam's moments came back: no new warm-up
    for (n, a), b in zip(t.model.state_dict().items(), u.model.state_dict().values()):
        assert torch.equal(a, b), n
    moments = t.opt.state[next(iter(t.opt.state))]
    assert torch.equal(u.opt.state[next(iter(u.opt.state))]["exp_avg"], moments["exp_avg"])
    compact = train.resume_path(tmp_path / "out", "mbt2018-mean-gray")
    assert compact.name == "mbt2018-mean-gray.safetensors"
    v = train.Trainer("mbt2018-mean-gray", sampler, 1, "cpu", 1e-4, amp=False)
    v.load(compact)  # fp16 parameters: close, and Adam starts afresh
    assert v.step == 1 and v.warm_from == 1


def test_upscale_enlarges_only_its_group_and_cuts_pieces_that_fit():
    rng = np.random.default_rng(3)
    photo = _image(rng.integers(0, 256, (1, 20, 24), dtype=np.uint8))
    xray = _image(rng.integers(0, 256, (1, 15, 18), dtype=np.uint8), "xray")
    out = train.upscale_groups([photo, xray], train.parse_upscale("xray=2"))
    assert out[0] is photo
    pieces = out[1:]
    assert all(p.group == "xray" and p.pixels.shape[1] <= 20 and p.pixels.shape[2] <= 24 for p in pieces)
    assert len(pieces) == 4  # 30 x 36 cut into a 2 x 2 grid
    whole = cv2.resize(xray.pixels[0], (36, 30), interpolation=cv2.INTER_CUBIC)
    top = np.concatenate([pieces[0].pixels[0], pieces[1].pixels[0]], axis=1)
    bottom = np.concatenate([pieces[2].pixels[0], pieces[3].pixels[0]], axis=1)
    assert np.array_equal(np.concatenate([top, bottom], axis=0), whole)
    assert train.upscale_groups([photo, xray], train.parse_upscale("")) == [photo, xray]


@pytest.mark.parametrize("text", ["xray=0.5", "xray=abc", "xray=9"])
def test_upscale_rejects_bad_factors(text):
    with pytest.raises(SystemExit, match="--upscale"):
        train.parse_upscale(text)
