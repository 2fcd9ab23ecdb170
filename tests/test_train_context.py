"""Training the channel-context model: its training forward, the normalised loss, tools/train.py's --ddp and
--patch-schedule, and tools/bench_train_step.py, on the CPU with small inputs."""

from __future__ import annotations

import csv
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

from visemz.models import architectures, registry, training

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))  # bench_train_step imports train beside it
import bench_train_step as bench  # noqa: E402
import train  # noqa: E402

SMALL = registry.ModelSpec("minnen2020", "gray", 16, 40, (4, 4, 8, 8, 16))


def test_the_training_forward_gives_each_slice_its_likelihoods_and_every_transform_a_gradient():
    torch.manual_seed(0)
    net = architectures.build(SMALL).train()
    x = torch.rand(2, 1, 64, 64)
    q = torch.tensor([1.5, 7.0])
    x_hat, liks = training.forward_train(net, x, q, amp=False)
    assert x_hat.shape == x.shape
    assert [tuple(v.shape) for v in liks] == [(2, g, 4, 4) for g in SMALL.slices] + [(2, 16, 1, 1)]
    loss, _, _ = training.rd_loss(x, x_hat, liks, q, training.log_lambda_table("cpu"),
                                  training.log_reference_table("cpu"))
    loss.backward()
    for name in ("param_transforms", "lrp_transforms", "h_s", "g_a", "g_s", "gain"):
        grads = [p.grad for n, p in net.named_parameters() if n.startswith(name)]
        assert grads and all(g is not None and torch.isfinite(g).all() for g in grads), name
    assert any(g.abs().sum() > 0 for g in (p.grad for p in net.lrp_transforms.parameters()))
    features, rec = training.reconstruct(net, x, torch.tensor([3.0, 3.0]), amp=False)  # what the residual prior sees
    with torch.no_grad():
        codec = net.g_s(architectures.dequantise(net, architectures.analyse(net, x, 3.0), 3.0))
    assert features.shape == (2, 16, 32, 32)
    torch.testing.assert_close(rec, codec, atol=1e-5, rtol=0)  # rounded about the slices' means as the codec does


def test_the_normalised_loss_divides_each_sample_by_its_qualitys_reference():
    refs = training.reference_losses()
    assert refs[0] == pytest.approx(0.323, abs=1e-3) and refs[-1] == pytest.approx(2.631, abs=1e-3)
    x = torch.full((3, 1, 8, 8), 0.5)
    x_hat = x + torch.tensor([0.01, 0.02, 0.03]).view(3, 1, 1, 1)
    liks = [torch.full((3, 2, 2, 2), 0.5)]  # 8 bits per sample: 1/8 bpp
    q = torch.tensor([1.0, 4.5, 8.0])
    lams, ref = training.log_lambda_table("cpu"), training.log_reference_table("cpu")
    plain, mse, bpp = training.rd_loss(x, x_hat, liks, q, lams)
    normal, _, _ = training.rd_loss(x, x_hat, liks, q, lams, ref)
    per = [registry.lam(float(v)) * 255**2 * d**2 + 0.125 for v, d in zip(q, (0.01, 0.02, 0.03))]
    mid = np.exp(0.5 * np.log(refs[3]) + 0.5 * np.log(refs[4]))  # quality 4.5: geometric, as lambda
    assert float(plain) == pytest.approx(np.mean(per), rel=1e-5)
    assert float(normal) == pytest.approx(np.mean([per[0] / refs[0], per[1] / mid, per[2] / refs[7]]), rel=1e-5)
    assert float(bpp) == pytest.approx(0.125)


def test_one_training_step_of_the_context_model_resumes(tmp_path):
    recs = [train.Image(train._to16(np.random.default_rng(k).integers(0, 256, (1, 70, 70), dtype=np.uint8)), "xray")
            for k in range(2)]
    sampler = train.CropSampler(recs, train.draw_weights(recs, None), patch=64, device="cpu")
    t = train.Trainer("minnen2020-gray", sampler, 1, "cpu", 1e-4, amp=False, spec=SMALL)
    before = [p.detach().clone() for p in t.model.param_transforms.parameters()]
    assert torch.isfinite(t.train_step(1.0)).all()
    assert any(not torch.equal(a, b) for a, b in zip(before, t.model.param_transforms.parameters()))
    t.save(tmp_path, tmp_path, 1.0, "test")
    u = train.Trainer("minnen2020-gray", sampler, 1, "cpu", 1e-4, amp=False, spec=SMALL)
    u.load(train.resume_path(tmp_path, "minnen2020-gray"))
    assert u.step == 1 and all(torch.equal(a, b) for a, b in zip(t.model.state_dict().values(),
                                                                 u.model.state_dict().values()))


def test_patch_schedules_are_parsed_and_followed():
    args = train.parse_args(["--data", "D", "--models", "minnen2020-rgb", "--out", "O", "--batch", "16",
                             "--patch-schedule", "900000:512x8, 950000:768"])
    assert args.schedule == [(900000, 512, 8), (950000, 768, None)]
    assert [train.crops_at(s, args) for s in (0, 899999, 900000, 960000)] == [(256, 16), (256, 16), (512, 8), (768, 8)]
    for bad in ("900000", "x:512", "10:500", "10:512x0", "-1:512"):
        with pytest.raises(SystemExit):
            train.parse_args(["--data", "D", "--models", "minnen2020-rgb", "--out", "O", "--patch-schedule", bad])


def _photos(tmp_path: Path) -> Path:
    rgb = tmp_path / "data" / "train" / "rgb"
    rgb.mkdir(parents=True)
    photo = data.astronaut()[::2, ::2, ::-1]  # 256 x 256, BGR for OpenCV
    for k in range(2):
        cv2.imwrite(str(rgb / f"im{k}.png"), np.ascontiguousarray(photo[k * 40:k * 40 + 140]))
    return tmp_path / "data"


def test_ddp_trains_one_model_on_two_ranks_and_follows_the_patch_schedule(tmp_path):
    """torchrun, two CPU ranks over Gloo: rank 0 alone writes the log (means over the ranks) and the checkpoint,
    the 128x128 crops start at step 2, and both ranks stop together at the step goal."""
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        str(ROOT / "tools" / "train.py"), "--ddp", "--device", "cpu", "--no-amp",
                        "--data", str(_photos(tmp_path)), "--models", "balle2016-gray", "--out", str(out),
                        "--steps", "3", "--batch", "1", "--patch", "64", "--patch-schedule", "2:128x2",
                        "--log-every", "1"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["balle2016-gray.full.safetensors", "balle2016-gray.safetensors",
                                                    "train_log.csv"]
    with open(out / "train_log.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(row["step"]) for row in rows] == [1, 2, 3] and {row["gpu"] for row in rows} == {"cpu x2"}
    with safe_open(str(out / "balle2016-gray.safetensors"), framework="pt") as f:
        meta = f.metadata()
    assert (meta["step"], meta["patch"], meta["batch"], meta["loss"]) == ("3", "128", "2", "normalised")


def test_bench_train_step_runs_tiny_models():
    result = bench.main(["--device", "cpu", "--tiny", "--no-amp", "--batch", "1", "--patch", "64", "--steps", "1",
                         "--warmup", "0"])
    rows = result["rows"]
    assert result["device"] == "cpu" and [r["model"] for r in rows] == list(bench.MODELS)
    for row in rows:
        assert "error" in row or (row["median_ms"] > 0 and row["mode"] == "eager"), row
