"""scripts/train.py's on-device crop sampler: every crop is a window of one image, possibly flipped."""

import importlib.util
from pathlib import Path

from compressai.entropy_models import EntropyBottleneck
import numpy as np
import torch

from visemz.models.architectures import bottleneck_train

_spec = importlib.util.spec_from_file_location("train_script", Path(__file__).parents[1] / "scripts" / "train.py")
train = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(train)


def _windows(img: np.ndarray, patch: int):
    _, h, w = img.shape
    for y in range(h - patch + 1):
        for x in range(w - patch + 1):
            yield img[:, y : y + patch, x : x + patch]


def test_crops_are_flipped_windows_of_the_images():
    rng = np.random.default_rng(1)
    images = [rng.integers(0, 256, (3, 9 + k, 7 + 2 * k), dtype=np.uint8) for k in range(3)]
    images.append(rng.integers(0, 256, (3, 4, 30), dtype=np.uint8))  # smaller than the patch: never used
    sampler = train.CropSampler(images, patch=5, device="cpu")
    assert sampler.count == 3
    torch.manual_seed(0)
    out = torch.empty(64, 3, 5, 5)
    sampler.sample_into(out)
    crops = np.rint(out.numpy() * 255).astype(np.uint8)
    flips = set()
    for c in crops:
        found = None
        for im in images[:3]:
            for win in _windows(im, 5):
                for fy in (False, True):
                    for fx in (False, True):
                        cand = win[:, ::-1] if fy else win
                        cand = cand[:, :, ::-1] if fx else cand
                        if np.array_equal(cand, c):
                            found = (fy, fx)
        assert found is not None
        flips.add(found)
    assert len(flips) == 4  # all four flip combinations occur in 64 draws


def test_graph_safe_bottleneck_equals_compressai():
    eb = EntropyBottleneck(5).train()
    x = torch.randn(2, 5, 6, 7) * 3
    torch.manual_seed(3)
    want = eb(x)
    torch.manual_seed(3)
    got = bottleneck_train(eb, x)
    for w, g in zip(want, got):
        assert w.shape == g.shape
        assert torch.equal(w, g)
    got[1].sum().backward()  # gradients reach the bottleneck's own parameters
    assert eb.matrices[0].grad is not None
