"""Fixed-rate training (MODEL@qQ in tools/train.py): the names and their tags, the batch's qualities, and
that a fixed-rate model trains only its own quality, eagerly on the CPU and as CUDA graphs on a GPU."""

import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from safetensors import safe_open
from skimage import data

from visemz.errors import InvalidArgumentError
from visemz.models import parse, training

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import train  # noqa: E402


@pytest.mark.parametrize("name, draw, quality", [
    ("mbt2018-mean-rgb", "mix", None), ("balle2016-gray@area", "area", None), ("mbt2018-mean-rgb@q2", "mix", 2.0),
    ("mbt2018-mean-gray@q6", "mix", 6.0), ("balle2016-rgb@q1", "mix", 1.0), ("balle2016-rgb@q8", "mix", 8.0),
    ("mbt2018-mean-rgb@q2.5", "mix", 2.5)])
def test_training_names_and_their_tags(name, draw, quality):
    parsed = training.parse_name(name)
    assert parsed == training.TrainingName(parse(name.partition("@")[0]), draw, quality)


@pytest.mark.parametrize("name, match", [
    ("mbt2018-mean-rgb@q0.5", r"fixed quality '0\.5' is outside \[1, 8\]"),
    ("mbt2018-mean-rgb@q9", r"fixed quality '9' is outside"), ("mbt2018-mean-rgb@qnan", "fixed quality 'nan'"),
    ("mbt2018-mean-rgb@q", "tag @q is not q followed by a quality"),
    ("mbt2018-mean-rgb@qtwo", "tag @qtwo is not q followed"), ("mbt2018-mean-rgb@fixed", "unknown tag @fixed"),
    ("mbt2018-mean-rgb@", "unknown tag @"), ("mbt2018-rgb@q2", "model='mbt2018'")])
def test_bad_training_names_are_refused_naming_the_value(name, match):
    with pytest.raises(InvalidArgumentError, match=match):
        training.parse_name(name)


def test_train_refuses_a_bad_tag_before_loading_anything(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        train.parse_args(["--data", "DATA", "--models", "mbt2018-mean-rgb", "mbt2018-mean-rgb@q12",
                          "--out", str(tmp_path)])
    assert e.value.code == 2 and "fixed quality '12' is outside [1, 8]" in capsys.readouterr().err


def test_batch_qualities_stratified_or_fixed():
    q = training.batch_qualities(16, "cpu")
    assert q.min() >= 1 and q.max() <= 8
    assert torch.equal(torch.floor((q - 1) * 16 / 7), torch.arange(16, dtype=q.dtype))
    assert torch.equal(training.batch_qualities(16, "cpu", 2.5), torch.full((16,), 2.5))


def _moved_gain_levels(name: str) -> set[int]:
    """The ladder levels whose gain vectors one training step of ``name`` changed."""
    rng = np.random.default_rng(0)
    recs = [train.Image(train._to16(rng.integers(0, 256, (1, 40, 40), dtype=np.uint8)), "photo") for _ in range(2)]
    sampler = train.CropSampler(recs, train.draw_weights(recs, None), patch=32, device="cpu")
    torch.manual_seed(0)
    t = train.Trainer(name, sampler, 4, "cpu", 1e-2, amp=False)
    before = t.model.gain.log_gain.detach().clone()
    t.train_step(1.0)
    changed = (t.model.gain.log_gain.detach() != before).any(dim=1)
    return {i for i in range(len(changed)) if changed[i]}


def test_a_fixed_rate_trainer_trains_only_its_quality():
    assert _moved_gain_levels("balle2016-gray@q3") == {2}  # quality 3: the third level, alone
    assert len(_moved_gain_levels("balle2016-gray")) >= 4  # four stratified samples move levels all over the ladder


def _train_tiny(tmp_path: Path, models: list[str], device: str = "cpu") -> Path:
    """tools/train.py itself, 2 steps on three small images (on the CPU eagerly; on a GPU as CUDA graphs);
    returns the checkpoint folder."""
    rgb = tmp_path / "data" / "train" / "rgb"
    rgb.mkdir(parents=True)
    photo = data.astronaut()[::4, ::4, ::-1]  # 128 x 128, BGR for OpenCV
    for k in range(3):
        cv2.imwrite(str(rgb / f"im{k}.png"), np.ascontiguousarray(photo[k * 20:k * 20 + 72]))
    out = tmp_path / "ckpt"
    # the project first, then whatever the caller already had on the path (site folders of extras)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "train.py"), "--data", str(tmp_path / "data"),
                        "--models", *models, "--out", str(out), "--state-dir", str(tmp_path / "state"),
                        "--steps", "2", "--device", device, "--batch", "2", "--patch", "64",
                        *(["--no-graphs"] if device == "cpu" else [])],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return out


@pytest.mark.gpu
def test_fixed_rate_training_captures_on_the_gpu(tmp_path):
    """The fixed-quality batch inside a captured CUDA graph: train.py writes both checkpoints, each with its steps
    and its qualities (the fixed Q, or the ladder)."""
    ckpt = _train_tiny(tmp_path, ["mbt2018-mean-rgb", "mbt2018-mean-rgb@q3"], "cuda")
    for name, qualities in (("mbt2018-mean-rgb", "1-8"), ("mbt2018-mean-rgb@q3", "3")):
        with safe_open(str(ckpt / f"{name}.safetensors"), framework="pt") as f:
            meta = f.metadata()
        assert (meta["step"], meta["qualities"]) == ("2", qualities), name
