"""tools/train_residual.py: a start from a shipped prior codes as that prior did, and the tool trains and
exports a colour prior end to end (a few steps on the CPU)."""

import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from skimage import data

from visemz.models import residual_prior, residual_weights

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import train_residual  # noqa: E402


def test_a_start_from_a_side_by_side_prior_ignores_the_pass_own_channels():
    """With its own pass's context weights zeroed, each head gives the same output whatever the channels coded
    earlier in its pass hold: the colour steps start exactly where the side-by-side coding was."""
    torch.manual_seed(0)
    prior = residual_prior.ResidualPrior(channels=3, features=16, width=8, reduced=4)
    for head in prior.heads:
        torch.nn.init.normal_(head[-1].weight)
    train_residual.zero_own_pass_inputs(prior)
    trunk = torch.randn(1, 8, 6, 5)
    for k in range(len(residual_prior.PASSES)):
        before = torch.randn(1, 12, 6, 5) * (torch.arange(12) < 3 * k).view(1, -1, 1, 1)  # earlier passes only
        same_pass = before.clone()
        same_pass[:, 3 * k:3 * k + 2] = torch.randn(1, 2, 6, 5)  # this pass's first two channels decoded
        for a, b in zip(prior.head(k, trunk, before), prior.head(k, trunk, same_pass)):
            torch.testing.assert_close(a, b)
        moved = prior.head(k, trunk, before + torch.randn(1, 12, 6, 5) * (torch.arange(12) < 3 * k).view(1, -1, 1, 1))
        assert k == 0 or not torch.equal(moved[0], prior.head(k, trunk, before)[0])  # earlier passes still count


def test_a_widened_prior_codes_as_the_narrow_one_and_its_new_channels_learn():
    """--init into a wider prior: every pass's (offset, log_scale) equal the narrow prior's, and a step of
    training reaches the new channels (their weights into old channels and the output get gradients)."""
    torch.manual_seed(1)
    narrow = residual_prior.ResidualPrior(channels=3, features=16, width=8, reduced=4)
    for head in narrow.heads:
        torch.nn.init.normal_(head[-1].weight)
    wide = residual_prior.ResidualPrior(channels=3, features=16, width=13, reduced=4)
    wide.load_state_dict(train_residual.widened(narrow.state_dict(), wide))
    reduced, x01 = torch.randn(2, 4, 6, 5), torch.rand(2, 3, 12, 10)
    sides = torch.tensor([0.0, 3.0]), torch.tensor([0.0, 1.6])
    context = torch.randn(2, 12, 6, 5)
    trunk_n, trunk_w = narrow.condition(reduced, x01, *sides), wide.condition(reduced, x01, *sides)
    torch.testing.assert_close(trunk_w[:, :8], trunk_n)
    for k in range(len(residual_prior.PASSES)):
        for a, b in zip(narrow.head(k, trunk_n, context), wide.head(k, trunk_w, context)):
            torch.testing.assert_close(a, b)
    wide.head(1, trunk_w, context)[1].square().sum().backward()
    assert wide.heads[1][-1].weight.grad[:, 8:].abs().sum() > 0
    state = narrow.state_dict()
    assert train_residual.widened(state, narrow) is state
    with pytest.raises(SystemExit, match="narrower"):
        train_residual.widened(wide.state_dict(), narrow)


def test_the_tool_fine_tunes_and_exports_a_colour_prior(tmp_path):
    rgb = tmp_path / "data" / "train" / "rgb"
    rgb.mkdir(parents=True)
    photo = data.astronaut()[::4, ::4, ::-1]  # 128 x 128, BGR for OpenCV
    for k in range(2):
        cv2.imwrite(str(rgb / f"im{k}.png"), np.ascontiguousarray(photo[k * 20:k * 20 + 72]))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    tool = [sys.executable, str(ROOT / "tools" / "train_residual.py"), "--variant", "rgb"]
    start = residual_weights.path_of("rgb")
    r = subprocess.run([*tool, "--data", str(tmp_path / "data"), "--out", str(tmp_path / "run"), "--init", str(start),
                        "--time-limit", "3", "--batch", "2", "--patch", "64", "--log-every", "1"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"starting from {start}" in r.stdout
    r = subprocess.run([*tool, "--export", str(tmp_path / "run"), "--weights-dir", str(tmp_path / "w")],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    exported = residual_weights._load(tmp_path / "w" / "residual-rgb.safetensors", "rgb", "cpu")
    assert exported.prior64.channels == 3 and exported.lossy_model == "mbt2018-mean-rgb"
