"""Fixed-rate training (MODEL@qQ in scripts/train.py) and scripts/fixed_vs_variable.py (variable rate against
fixed rate)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from skimage import data

from visemz.errors import InvalidArgumentError
from visemz.models import parse, training

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))  # fixed_vs_variable imports export_weights and evalkit beside it
import fixed_vs_variable as fvv  # noqa: E402
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


def test_psnr_at_bpp_is_linear_in_log_bpp_between_the_bracketing_points():
    points = [{"quality": 3.0, "bpp": 1.0, "psnr": 34.0}, {"quality": 1.0, "bpp": 0.25, "psnr": 28.0},
              {"quality": 2.0, "bpp": 0.5, "psnr": 31.0}]
    psnr, bracket = fvv.psnr_at_bpp(points, math.sqrt(0.5))  # halfway between 0.5 and 1.0 in log(bpp)
    assert psnr == pytest.approx(32.5) and bracket == [2.0, 3.0]
    assert fvv.psnr_at_bpp(points, 0.5) == (31.0, [1.0, 2.0])
    assert fvv.psnr_at_bpp(points, 0.2) == (None, None) and fvv.psnr_at_bpp(points, 1.5) == (None, None)
    assert fvv.variable_qualities([2.0, 7.5], [-1, 0, 1]) == [1.0, 2.0, 3.0, 6.5, 7.5, 8.0]


def test_a_gap_outside_the_variable_curve_is_bounded_by_its_nearer_end(tmp_path):
    curve = [{"quality": 1.0, "bpp": 0.25, "psnr": 28.0}, {"quality": 2.0, "bpp": 0.5, "psnr": 31.0}]
    below = fvv.compare("v", "v@q1", 1.0, {"quality": 1.0, "bpp": 0.2, "psnr": 29.0}, curve, 0.2)
    assert below["gap_db"] is None and below["gap_at_least_db"] == pytest.approx(1.0)
    assert below["gap_at_most_db"] is None and below["within_target"] is False
    above = fvv.compare("v", "v@q2", 2.0, {"quality": 2.0, "bpp": 0.6, "psnr": 30.9}, curve, 0.2)
    assert above["gap_at_most_db"] == pytest.approx(-0.1) and above["within_target"] is True
    inside = fvv.compare("v", "v@q2", 2.0, {"quality": 2.0, "bpp": 0.5, "psnr": 31.5}, curve, 0.2)
    assert inside["gap_db"] == pytest.approx(0.5) and inside["gap_at_least_db"] is None
    # --rescore recomputes the comparisons of a written JSON from its points, nothing measured
    saved = {"target_db": 0.2, "variable_curves": {"v": curve},
             "fixed_points": {"v@q1": {"quality": 1.0, "bpp": 0.2, "psnr": 29.0}}, "device": "cpu",
             "images": {"count": 1, "folder": "x"}, "checkpoints": {"v": {"steps": 5}, "v@q1": {"steps": 5}},
             "comparisons": [{"variable": "v", "fixed": "v@q1", "quality": 1.0}]}
    path = tmp_path / "fvv.json"
    path.write_text(json.dumps(saved))
    result = fvv.main(["--rescore", "--out", str(path)])
    assert json.loads(path.read_text())["comparisons"] == result["comparisons"]
    assert result["comparisons"][0]["gap_at_least_db"] == pytest.approx(1.0)
    assert "quality 1 is the lowest" in result["comparisons"][0]["why_no_gap"]
    assert "widen --offsets" in above["why_no_gap"]
    path.write_text("[1, 2]")
    with pytest.raises(SystemExit, match="fvv.json.*not a JSON this script wrote"):
        fvv.main(["--rescore", "--out", str(path)])


def _train_tiny(tmp_path: Path, models: list[str], device: str = "cpu") -> Path:
    """scripts/train.py itself, 2 steps on three small images (on the CPU eagerly; on a GPU as CUDA graphs);
    returns the checkpoint folder."""
    rgb = tmp_path / "data" / "train" / "rgb"
    rgb.mkdir(parents=True)
    photo = data.astronaut()[::4, ::4, ::-1]  # 128 x 128, BGR for OpenCV
    for k in range(3):
        cv2.imwrite(str(rgb / f"im{k}.png"), np.ascontiguousarray(photo[k * 20:k * 20 + 72]))
    out = tmp_path / "ckpt"
    # the project first, then whatever the caller already had on the path (site folders of extras)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "train.py"), "--data", str(tmp_path / "data"),
                        "--models", *models, "--out", str(out), "--state-dir", str(tmp_path / "state"),
                        "--steps", "2", "--device", device, "--batch", "2", "--patch", "64",
                        *(["--no-graphs"] if device == "cpu" else [])],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return out


def _eval_images(tmp_path: Path) -> Path:
    folder = tmp_path / "kodak"
    folder.mkdir()
    cv2.imwrite(str(folder / "a.png"), np.ascontiguousarray(data.astronaut()[64:128, 96:192, ::-1]))
    cv2.imwrite(str(folder / "b.png"), np.ascontiguousarray(data.coffee()[:64, :64, ::-1]))
    return folder


def _with_steps(src: Path, dst: Path, steps: int) -> None:
    """A copy of a compact checkpoint whose metadata claims ``steps``."""
    with safe_open(str(src), framework="pt") as f:
        meta = dict(f.metadata())
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    save_file(tensors, str(dst), metadata=dict(meta, step=str(steps)))


def test_fixed_vs_variable_end_to_end_on_train_py_checkpoints(tmp_path):
    ckpt = _train_tiny(tmp_path, ["mbt2018-mean-rgb", "mbt2018-mean-rgb@q2", "mbt2018-mean-rgb@q6"])
    images = _eval_images(tmp_path)
    out = tmp_path / "fvv.json"
    fvv.main(["--ckpt", str(ckpt), "--images", str(images), "--limit", "1", "--device", "cpu",
              "--offsets", "-1", "0", "1", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["device"].startswith("CPU") and result["images"] == {"folder": str(images), "count": 1,
                                                                       "names": ["a.png"]}
    assert {n: (c["steps"], c["qualities"]) for n, c in result["checkpoints"].items()} == {
        "mbt2018-mean-rgb": (2, "1-8"), "mbt2018-mean-rgb@q2": (2, "2"), "mbt2018-mean-rgb@q6": (2, "6")}
    curve = result["variable_curves"]["mbt2018-mean-rgb"]
    assert [p["quality"] for p in curve] == [1.0, 2.0, 3.0, 5.0, 6.0, 7.0]
    assert [(c["fixed"], c["quality"]) for c in result["comparisons"]] == [("mbt2018-mean-rgb@q2", 2.0),
                                                                         ("mbt2018-mean-rgb@q6", 6.0)]
    for c in result["comparisons"]:
        assert c["fixed_bpp"] > 0 and math.isfinite(c["fixed_psnr"])
        same_q = c["variable_at_same_quality"]
        assert same_q == next(p for p in curve if p["quality"] == c["quality"])
        # another network (its own random start): its own weights were in the codec, not the variable model's
        assert (c["fixed_bpp"], c["fixed_psnr"]) != (same_q["bpp"], same_q["psnr"])
        if c["gap_db"] is None:
            assert "outside the variable model's measured range" in c["why_no_gap"]
        else:
            assert c["gap_db"] == pytest.approx(c["fixed_psnr"] - c["variable_psnr_at_fixed_bpp"])
            assert set(c["bracket_qualities"]) <= {p["quality"] for p in curve}

    # The same network under a fixed-rate name measures a gap of exactly 0; step counts that differ are refused.
    same = tmp_path / "same"
    same.mkdir()
    (same / "mbt2018-mean-rgb.safetensors").write_bytes((ckpt / "mbt2018-mean-rgb.safetensors").read_bytes())
    _with_steps(ckpt / "mbt2018-mean-rgb.safetensors", same / "mbt2018-mean-rgb@q2.safetensors", 100)
    args = ["--ckpt", str(same), "--images", str(images), "--limit", "1", "--device", "cpu", "--offsets", "0",
            "--out", str(tmp_path / "same.json")]
    with pytest.raises(SystemExit, match=r"not trained as long \(mbt2018-mean-rgb 2, mbt2018-mean-rgb@q2 100"):
        fvv.main(args)
    assert not (tmp_path / "same.json").exists()
    result = fvv.main(args + ["--allow-unequal"])
    (c,) = result["comparisons"]
    assert c["gap_db"] == 0.0 and c["within_target"] is True
    assert result["allow_unequal"] and result["checkpoints"]["mbt2018-mean-rgb@q2"]["steps"] == 100


def test_fixed_vs_variable_needs_a_fixed_rate_checkpoint_and_its_variable_one(tmp_path):
    folder = tmp_path / "ck"
    folder.mkdir()
    with pytest.raises(SystemExit, match="no fixed-rate checkpoint"):
        fvv.find_pairs(folder)
    (folder / "mbt2018-mean-rgb@q2.safetensors").write_bytes(b"")
    with pytest.raises(SystemExit, match="has no variable-rate mbt2018-mean-rgb.safetensors"):
        fvv.find_pairs(folder)
    (folder / "mbt2018-mean-rgb.safetensors").write_bytes(b"")
    (folder / "mbt2018-mean-rgb.full.safetensors").write_bytes(b"")
    (folder / "balle2016-gray@area.safetensors").write_bytes(b"")  # an ablation, not part of the comparison
    assert fvv.find_pairs(folder) == [("mbt2018-mean-rgb", "mbt2018-mean-rgb@q2", 2.0)]
    (folder / "mbt2018-mean-rgb@q11.safetensors").write_bytes(b"")
    with pytest.raises(SystemExit, match="fixed quality '11' is outside"):
        fvv.find_pairs(folder)


@pytest.mark.gpu
def test_fixed_rate_training_captures_and_measures_on_the_gpu(tmp_path):
    """The fixed-quality batch inside a captured CUDA graph, and the measurement through the GPU codec."""
    ckpt = _train_tiny(tmp_path, ["mbt2018-mean-rgb", "mbt2018-mean-rgb@q3"], "cuda")
    result = fvv.main(["--ckpt", str(ckpt), "--images", str(_eval_images(tmp_path)), "--device", "cuda",
                       "--offsets", "-1", "0", "1", "--out", str(tmp_path / "gpu.json")])
    assert result["device"] == torch.cuda.get_device_name()
    assert {n: c["steps"] for n, c in result["checkpoints"].items()} == {"mbt2018-mean-rgb": 2,
                                                                         "mbt2018-mean-rgb@q3": 2}
    (c,) = result["comparisons"]
    assert c["quality"] == 3.0 and c["fixed_bpp"] > 0 and math.isfinite(c["fixed_psnr"])
    assert [p["quality"] for p in result["variable_curves"]["mbt2018-mean-rgb"]] == [2.0, 3.0, 4.0]
