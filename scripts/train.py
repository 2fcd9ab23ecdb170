"""Train visemz's models on a GPU: several models in one process, images resident on the GPU.

    python scripts/train.py --data ../shared/data --models balle2016-rgb-q1 balle2016-gray-q1 ... \
        --out runs/r1 [--resume runs/r0] [--time-limit 540] [--steps 100000]

Loss: lambda * 255^2 * MSE + bpp (CompressAI's rate-distortion loss, lambda from its ladder),
Adam (lr 1e-4) plus the entropy bottleneck's auxiliary loss (Adam, lr 1e-3); transforms under
bf16 autocast, entropy models in float32.  Random 256x256 crops and flips are cut on the GPU.

Checkpoints: one safetensors file per architecture/variant group in --out (fp16 parameters,
so a group of four fits the 16 MB a device job can return) plus state.json (steps, wall time).
Resuming restores the parameters and step counts; Adam's moments start afresh.  Each model
logs a CSV row every --log-every steps.  --export DIR writes the shipped int8 weights.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from visemz.models import architectures, parse


def load_images(folder: Path, channels: int, device) -> list[torch.Tensor]:
    import cv2

    images = []
    for p in sorted(folder.iterdir()):
        img = cv2.imread(str(p), cv2.IMREAD_GRAYSCALE if channels == 1 else cv2.IMREAD_COLOR)
        if img is None:
            continue
        if channels == 3:
            img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
        t = torch.from_numpy(np.ascontiguousarray(img)).to(device)
        images.append(t[None] if channels == 1 else t.permute(2, 0, 1).contiguous())
    if not images:
        raise SystemExit(f"no images in {folder}")
    return images


class CropSampler:
    """Random patch x patch crops with flips, cut from GPU-resident uint8 images."""

    def __init__(self, images: list[torch.Tensor], patch: int, seed: int):
        self.images = [im for im in images if min(im.shape[1:]) >= patch]
        areas = np.array([im.shape[1] * im.shape[2] for im in self.images], np.float64)
        self.p = areas / areas.sum()
        self.patch = patch
        self.rng = np.random.default_rng(seed)

    def batch(self, n: int) -> torch.Tensor:
        crops = []
        for i in self.rng.choice(len(self.images), n, p=self.p):
            im = self.images[i]
            y = int(self.rng.integers(0, im.shape[1] - self.patch + 1))
            x = int(self.rng.integers(0, im.shape[2] - self.patch + 1))
            c = im[:, y : y + self.patch, x : x + self.patch]
            if self.rng.random() < 0.5:
                c = c.flip(2)
            if self.rng.random() < 0.5:
                c = c.flip(1)
            crops.append(c)
        return torch.stack(crops).float().div_(255.0)


class Trainer:
    def __init__(self, spec, device, lr: float, amp: bool):
        self.spec = spec
        self.model = architectures.build(spec).to(device).train()
        aux = {n for n, _ in self.model.named_parameters() if n.endswith("quantiles")}
        params = dict(self.model.named_parameters())
        self.opt = torch.optim.Adam([params[n] for n in params if n not in aux], lr=lr)
        self.aux_opt = torch.optim.Adam([params[n] for n in aux], lr=1e-3)
        self.amp = amp
        self.step = 0
        self.lr = lr
        self.started = 0  # step at which this run began: the LR warms up from there
        self.good = None  # last finite state, restored if the loss turns non-finite

    WARMUP = 500  # steps of linear LR warm-up after every (re)start: Adam's moments start afresh

    def train_step(self, x: torch.Tensor) -> torch.Tensor:
        for g in self.opt.param_groups:
            g["lr"] = self.lr * min(1.0, (self.step - self.started + 1) / self.WARMUP)
        x_hat, liks = architectures.forward_train(self.model, x, self.amp)
        pixels = x.shape[0] * x.shape[2] * x.shape[3]
        bpp = sum(torch.log(l).sum() for l in liks) / (-math.log(2) * pixels)
        mse = torch.mean((x_hat - x) ** 2)
        loss = self.spec.lam * 255**2 * mse + bpp
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0, error_if_nonfinite=False)
        self.opt.step()
        aux = self.model.aux_loss()
        self.aux_opt.zero_grad(set_to_none=True)
        aux.backward()
        self.aux_opt.step()
        self.step += 1
        # stays on the GPU: reading it here would stall the queue every step
        return torch.stack([loss.detach(), mse.detach(), bpp.detach(), aux.detach()])


    def check_finite(self, metrics: list[float]) -> bool:
        """Called at log time: keep a finite snapshot, or roll back to the last one."""
        if all(math.isfinite(v) for v in metrics):
            self.good = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
            return True
        if self.good is not None:
            self.model.load_state_dict(self.good)
        self.opt.state.clear()  # Adam's moments are poisoned too
        self.started = self.step  # warm up again
        return False


def group_of(spec) -> str:
    return f"{spec.arch}-{spec.variant}"


def save_checkpoints(trainers: list[Trainer], out: Path, wall: float) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    groups: dict[str, dict] = {}
    for t in trainers:
        for k, v in t.model.state_dict().items():
            groups.setdefault(group_of(t.spec), {})[f"{t.spec.name}/{k}"] = v.detach().half().cpu().contiguous()
    for g, tensors in groups.items():
        tmp = out / f"{g}.tmp"
        save_file(tensors, str(tmp))
        tmp.replace(out / f"{g}.safetensors")
    state = {"steps": {t.spec.name: t.step for t in trainers}, "train_seconds": wall}
    (out / "state.json").write_text(json.dumps(state, indent=1))


def resume(trainers: list[Trainer], src: Path) -> float:
    from safetensors.torch import load_file

    state = json.loads((src / "state.json").read_text())
    for t in trainers:
        f = src / f"{group_of(t.spec)}.safetensors"
        if not f.is_file() or t.spec.name not in state["steps"]:
            print(f"{t.spec.name}: no checkpoint in {src}, starting fresh")
            continue
        prefix = t.spec.name + "/"
        tensors = {k[len(prefix):]: v.float() for k, v in load_file(str(f)).items() if k.startswith(prefix)}
        t.model.load_state_dict(tensors)
        t.step = t.started = state["steps"][t.spec.name]
        print(f"{t.spec.name}: resumed at step {t.step}")
    return float(state.get("train_seconds", 0.0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("../shared/data"))
    ap.add_argument("--models", nargs="+", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--resume", type=Path)
    ap.add_argument("--steps", type=int, default=1_000_000, help="stop when every model has this many steps")
    ap.add_argument("--time-limit", type=float, default=float("inf"), help="seconds of training in this run")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--patch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--no-amp", action="store_true")
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    device = "cuda"
    torch.manual_seed(args.seed)
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    specs = [parse(m) for m in args.models]
    samplers = {}
    for v, ch in (("rgb", 3), ("gray", 1)):
        if any(s.variant == v for s in specs):
            samplers[v] = CropSampler(load_images(args.data / "train" / v, ch, device), args.patch, args.seed)
            print(f"{v}: {len(samplers[v].images)} training images on the GPU")
    trainers = [Trainer(s, device, args.lr, not args.no_amp) for s in specs]
    prior = resume(trainers, args.resume) if args.resume else 0.0
    args.out.mkdir(parents=True, exist_ok=True)
    log = open(args.out / "train_log.csv", "a", newline="")
    writer = csv.writer(log)
    writer.writerow(["model", "step", "loss", "mse", "psnr", "bpp", "aux", "seconds"])
    t0 = time.perf_counter()
    acc = {t.spec.name: [] for t in trainers}
    while time.perf_counter() - t0 < args.time_limit and min(t.step for t in trainers) < args.steps:
        for t in trainers:
            if t.step >= args.steps:
                continue
            m = t.train_step(samplers[t.spec.variant].batch(args.batch))
            acc[t.spec.name].append(m)
            if t.step % args.log_every == 0:
                vals = torch.stack(acc[t.spec.name]).mean(0).tolist()  # one sync per model per log
                if not t.check_finite(vals):
                    print(f"{t.spec.name}: non-finite loss at step {t.step}; rolled back to the last finite state")
                mean = dict(zip(("loss", "mse", "bpp", "aux"), vals))
                psnr = 10 * math.log10(1.0 / max(mean["mse"], 1e-12))
                writer.writerow([t.spec.name, t.step, f"{mean['loss']:.5f}", f"{mean['mse']:.7f}", f"{psnr:.3f}",
                                 f"{mean['bpp']:.5f}", f"{mean['aux']:.3f}", f"{time.perf_counter() - t0:.1f}"])
                acc[t.spec.name] = []
        if trainers[0].step % (10 * args.log_every) == 0:
            log.flush()
            print(f"{time.perf_counter() - t0:7.1f}s  step {trainers[0].step}", flush=True)
    wall = prior + time.perf_counter() - t0
    save_checkpoints(trainers, args.out, wall)
    log.close()
    for t in trainers:
        print(f"{t.spec.name}: {t.step} steps")
    print(f"trained {time.perf_counter() - t0:.0f} s this run, {wall:.0f} s in all; checkpoints in {args.out}")


if __name__ == "__main__":
    main()
