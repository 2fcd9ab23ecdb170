"""Train visemz's models on a GPU: several models in one process, images resident on the GPU.

    python scripts/train.py --data ../shared/data --models balle2016-rgb-q1 balle2016-gray-q1 ... \
        --out runs/r1 [--resume runs/r0 | --init-from visemz/models/weights] [--time-limit 540] [--steps 100000]

Loss: lambda * 255^2 * MSE + bpp (CompressAI's rate-distortion loss, lambda from its ladder),
Adam (lr 1e-4, linear warm-up after every (re)start, x0.1 from --decay-at of the time limit)
plus the entropy bottleneck's auxiliary loss (Adam, lr 1e-3); transforms under bf16 autocast,
entropy models in float32.  Random 256x256 crops and flips are cut on the GPU.

Small models are launch-bound (about 24 ms a step for N=64 when run eagerly), so on CUDA each
model's whole step (crop sampling, forward, backward, both optimisers) is captured once in a
CUDA graph and replayed; --no-graphs runs it eagerly (and is what runs on a CPU).

Checkpoints: one safetensors file per architecture/variant group in --out (fp16 parameters,
so a group of four fits the 16 MB a device job can return) plus state.json (steps, wall time).
Resuming restores the parameters and step counts; Adam's moments start afresh.  Each model
logs a CSV row every --log-every steps.
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


def load_images(folder: Path, channels: int) -> list[np.ndarray]:
    """Every readable image in ``folder`` as a C x H x W uint8 array."""
    import cv2

    images = []
    for p in sorted(folder.iterdir()):
        img = cv2.imread(str(p), cv2.IMREAD_GRAYSCALE if channels == 1 else cv2.IMREAD_COLOR)
        if img is None:
            continue
        img = img[None] if channels == 1 else cv2.cvtColor(img, cv2.COLOR_BGR2RGB).transpose(2, 0, 1)
        images.append(np.ascontiguousarray(img))
    if not images:
        raise SystemExit(f"no images in {folder}")
    return images


class CropSampler:
    """Random patch x patch crops with flips, cut on the device with one gather.

    The images are packed into one zero-padded K x C x Hmax x Wmax uint8 tensor; crops never
    reach into the padding.  Every step is tensor ops on the device with no host sync, so the
    sampler can live inside a CUDA graph.
    """

    def __init__(self, images: list[np.ndarray], patch: int, device):
        images = [im for im in images if min(im.shape[1:]) >= patch]
        if not images:
            raise SystemExit(f"no training image is at least {patch}x{patch}")
        c = images[0].shape[0]
        hmax = max(im.shape[1] for im in images)
        wmax = max(im.shape[2] for im in images)
        packed = np.zeros((len(images), c, hmax, wmax), np.uint8)
        for k, im in enumerate(images):
            packed[k, :, : im.shape[1], : im.shape[2]] = im
        self.images = torch.from_numpy(packed).to(device)
        self.count = len(images)
        heights = torch.tensor([im.shape[1] for im in images], dtype=torch.float32)
        widths = torch.tensor([im.shape[2] for im in images], dtype=torch.float32)
        area = heights * widths
        self.cdf = (torch.cumsum(area, 0) / area.sum()).to(device)  # images drawn by area
        self.y_room = (heights - patch + 1).to(device)
        self.x_room = (widths - patch + 1).to(device)
        self.ramp = torch.arange(patch, device=device)
        self.channels = torch.arange(c, device=device)
        self.patch = patch

    def _axis(self, room: torch.Tensor, k: torch.Tensor, n: int) -> torch.Tensor:
        """Indices along one axis: a random start within room[k], reversed for half the samples."""
        start = (torch.rand(n, device=room.device) * room[k]).long()
        flip = torch.rand(n, device=room.device) < 0.5
        ramp = torch.where(flip[:, None], self.patch - 1 - self.ramp, self.ramp)
        return start[:, None] + ramp

    def sample_into(self, out: torch.Tensor) -> None:
        """Fill ``out`` (n x C x patch x patch, float) with crops scaled to [0, 1]."""
        n = out.shape[0]
        u = torch.rand(n, device=self.cdf.device)
        k = torch.searchsorted(self.cdf, u).clamp_(max=self.count - 1)
        rows = self._axis(self.y_room, k, n)
        cols = self._axis(self.x_room, k, n)
        crops = self.images[k[:, None, None, None], self.channels[None, :, None, None],
                            rows[:, None, :, None], cols[:, None, None, :]]
        torch.div(crops, 255.0, out=out)


class Trainer:
    WARMUP = 500  # steps of linear LR warm-up after every (re)start: Adam's moments start afresh

    def __init__(self, spec, sampler: CropSampler, batch: int, device, lr: float, amp: bool):
        self.spec = spec
        self.sampler = sampler
        self.model = architectures.build(spec).to(device).train()
        aux = {n for n, _ in self.model.named_parameters() if n.endswith("quantiles")}
        params = dict(self.model.named_parameters())
        on_gpu = torch.device(device).type == "cuda"
        # A tensor LR lives in the graph: changing it needs no re-capture.
        opt_args = {"fused": True, "capturable": True} if on_gpu else {}
        self.lr_now = torch.tensor(lr, device=device)
        self.opt = torch.optim.Adam([params[n] for n in params if n not in aux], lr=self.lr_now, **opt_args)
        self.aux_opt = torch.optim.Adam([params[n] for n in aux], lr=1e-3, **opt_args)
        self.x = torch.zeros(batch, spec.channels, sampler.patch, sampler.patch, device=device)
        self.amp = amp
        self.lr = lr
        self.step = 0
        self.started = 0  # step at which this run began: the LR warms up from there
        self.good = None  # last finite state, restored if the loss turns non-finite
        self.graph = None
        self.metrics = None  # the last step's [loss, mse, bpp, aux], on the device

    def _step(self) -> torch.Tensor:
        """One whole training step in tensor ops (the body a CUDA graph captures)."""
        self.sampler.sample_into(self.x)
        x_hat, liks = architectures.forward_train(self.model, self.x, self.amp)
        pixels = self.x.shape[0] * self.x.shape[2] * self.x.shape[3]
        bpp = sum(torch.log(l).sum() for l in liks) / (-math.log(2) * pixels)
        mse = torch.mean((x_hat - self.x) ** 2)
        loss = self.spec.lam * 255**2 * mse + bpp
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0, error_if_nonfinite=False)
        self.opt.step()
        aux = self.model.aux_loss()
        self.aux_opt.zero_grad(set_to_none=True)
        aux.backward()
        self.aux_opt.step()
        return torch.stack([loss.detach(), mse.detach(), bpp.detach(), aux.detach()])

    def capture(self, warmup_steps: int = 3) -> None:
        """Run a few eager steps on a side stream (Adam state, cuDNN autotuning), then capture one."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup_steps):
                self.train_step(1.0)
        torch.cuda.current_stream().wait_stream(side)
        self.opt.zero_grad(set_to_none=True)
        self.aux_opt.zero_grad(set_to_none=True)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.metrics = self._step()

    def train_step(self, lr_scale: float) -> torch.Tensor:
        warm = min(1.0, (self.step - self.started + 1) / self.WARMUP)
        self.lr_now.fill_(self.lr * warm * lr_scale)
        if self.graph is not None:
            self.graph.replay()
        else:
            self.metrics = self._step()
        self.step += 1
        return self.metrics

    def check_finite(self, metrics: list[float]) -> bool:
        """Called at log time: keep a finite snapshot, or roll back to the last one in place."""
        if all(math.isfinite(v) for v in metrics):
            self.good = (self.step, {k: v.detach().clone() for k, v in self.model.state_dict().items()})
            return True
        with torch.no_grad():
            if self.good is not None:
                self.step, state = self.good  # progress since the snapshot is lost: count it so
                self.model.load_state_dict(state)  # copies in place: the graph keeps its pointers
            for opt in (self.opt, self.aux_opt):  # Adam's moments are poisoned too
                for state in opt.state.values():
                    for v in state.values():
                        if torch.is_tensor(v):
                            v.zero_()
        self.started = self.step  # warm up again
        return False


def group_of(spec) -> str:
    return f"{spec.arch}-{spec.variant}"


def save_checkpoints(trainers: list[Trainer], out: Path, wall: float, note: str) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    groups: dict[str, dict] = {}
    for t in trainers:
        params = {k for k, _ in t.model.named_parameters()}
        for k, v in t.model.state_dict().items():
            # Parameters as fp16 (the checkpoint must fit 16 MB); buffers are constants such as
            # the likelihood bound 1e-9, which fp16 would flush to zero (and so train into NaN).
            v = v.detach().cpu()
            groups.setdefault(group_of(t.spec), {})[f"{t.spec.name}/{k}"] = (v.half() if k in params else v).contiguous()
    for g, tensors in groups.items():
        tmp = out / f"{g}.tmp"
        save_file(tensors, str(tmp))
        tmp.replace(out / f"{g}.safetensors")
    state = {"steps": {t.spec.name: t.step for t in trainers}, "train_seconds": wall, "note": note}
    tmp = out / "state.json.tmp"
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(out / "state.json")


def init_from_weights(trainers: list[Trainer], folder: Path) -> float:
    """Start each model from shipped weights in ``folder`` (int8 kernels dequantised), continuing
    the step count of its model card; returns the cards' training seconds (largest)."""
    from visemz.models import weights as W

    seconds = 0.0
    for t in trainers:
        path = folder / f"{t.spec.name}.safetensors"
        if not path.is_file():
            print(f"{t.spec.name}: no weights in {folder}, starting fresh")
            continue
        tensors, _ = W.read_tensors(path)
        state = W.dequantize_state(tensors)
        params = dict(t.model.named_parameters())
        missing = sorted(set(params) - set(state))
        if missing:
            raise SystemExit(f"{t.spec.name}: {path} lacks {missing[:3]}")
        with torch.no_grad():  # parameters only, as in resume(): buffers are constants the model builds
            for k, p in params.items():
                p.copy_(state[k])
        card = json.loads(path.with_suffix(".json").read_text()) if path.with_suffix(".json").is_file() else {}
        t.step = t.started = int(card.get("steps", 0))
        seconds = max(seconds, float(card.get("train_seconds_all_models", 0.0)))
        print(f"{t.spec.name}: starts from {path.name} at step {t.step}")
    return seconds


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
        params = dict(t.model.named_parameters())
        missing = sorted(set(params) - set(tensors))
        if missing:
            raise SystemExit(f"{t.spec.name}: checkpoint {f} lacks {missing[:3]}")
        with torch.no_grad():  # parameters only: buffers are constants the model builds itself
            for k, p in params.items():
                p.copy_(tensors[k])
        t.step = t.started = state["steps"][t.spec.name]
        print(f"{t.spec.name}: resumed at step {t.step}")
    return float(state.get("train_seconds", 0.0))


class Log:
    """Per-model CSV rows, averaged over --log-every steps (one host sync per model per row)."""

    FIELDS = ("model", "step", "loss", "mse", "psnr", "bpp", "aux", "seconds")

    def __init__(self, path: Path, trainers: list[Trainer]):
        new = not path.exists()
        self.file = open(path, "a", newline="")
        self.writer = csv.writer(self.file)
        if new:
            self.writer.writerow(self.FIELDS)
        self.sums = {t.spec.name: torch.zeros(4, device=t.x.device) for t in trainers}
        self.counts = {t.spec.name: 0 for t in trainers}

    def add(self, t: Trainer, metrics: torch.Tensor) -> None:
        self.sums[t.spec.name] += metrics
        self.counts[t.spec.name] += 1

    def row(self, t: Trainer, seconds: float) -> list[float]:
        vals = (self.sums[t.spec.name] / max(self.counts[t.spec.name], 1)).tolist()
        self.sums[t.spec.name].zero_()
        self.counts[t.spec.name] = 0
        mean = dict(zip(("loss", "mse", "bpp", "aux"), vals))
        psnr = 10 * math.log10(1.0 / max(mean["mse"], 1e-12)) if math.isfinite(mean["mse"]) else float("nan")
        self.writer.writerow([t.spec.name, t.step, f"{mean['loss']:.5f}", f"{mean['mse']:.7f}", f"{psnr:.3f}",
                              f"{mean['bpp']:.5f}", f"{mean['aux']:.3f}", f"{seconds:.1f}"])
        return vals


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("../shared/data"))
    ap.add_argument("--models", nargs="+", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--resume", type=Path, help="a checkpoint folder this script wrote")
    ap.add_argument("--init-from", type=Path,
                    help="start from shipped weights in this folder (e.g. visemz/models/weights)")
    ap.add_argument("--steps", type=int, default=1_000_000, help="stop when every model has this many steps")
    ap.add_argument("--time-limit", type=float, default=float("inf"), help="seconds of training in this run")
    ap.add_argument("--decay-at", type=float, default=0.85,
                    help="fraction of --time-limit after which the LR drops 10x (1 = never)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--patch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--no-amp", action="store_true")
    ap.add_argument("--no-graphs", action="store_true", help="run steps eagerly instead of as CUDA graphs")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--note", default="", help="how this run trained, for the model cards (export_weights.py)")
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    specs = [parse(m) for m in args.models]
    samplers = {}
    for v, ch in (("rgb", 3), ("gray", 1)):
        if any(s.variant == v for s in specs):
            samplers[v] = CropSampler(load_images(args.data / "train" / v, ch), args.patch, device)
            print(f"{v}: {samplers[v].count} training images on {device}")
    trainers = [Trainer(s, samplers[s.variant], args.batch, device, args.lr, not args.no_amp) for s in specs]
    if args.resume and args.init_from:
        raise SystemExit("--resume and --init-from exclude each other")
    prior = resume(trainers, args.resume) if args.resume else 0.0
    if args.init_from:
        prior = init_from_weights(trainers, args.init_from)
    args.out.mkdir(parents=True, exist_ok=True)
    if device.type == "cuda" and not args.no_graphs:
        t = time.perf_counter()
        for tr in trainers:
            try:
                tr.capture()
            except RuntimeError as e:  # the run still trains, eagerly, and says so
                tr.graph = None
                torch.cuda.synchronize()
                print(f"{tr.spec.name}: CUDA graph capture failed ({e}); this model runs eagerly", flush=True)
        print(f"captured {len(trainers)} CUDA graphs in {time.perf_counter() - t:.1f} s", flush=True)
    log = Log(args.out / "train_log.csv", trainers)
    t0 = time.perf_counter()
    decay_at = args.decay_at * args.time_limit
    rounds = 0
    while time.perf_counter() - t0 < args.time_limit and min(t.step for t in trainers) < args.steps:
        scale = 0.1 if time.perf_counter() - t0 >= decay_at else 1.0
        for t in trainers:
            if t.step >= args.steps:
                continue
            log.add(t, t.train_step(scale))
            if t.step % args.log_every == 0 and not t.check_finite(log.row(t, time.perf_counter() - t0)):
                print(f"{t.spec.name}: non-finite loss at step {t.step}; rolled back to the last finite state")
        rounds += 1
        if rounds % (10 * args.log_every) == 0:
            log.file.flush()
            print(f"{time.perf_counter() - t0:7.1f}s  step {trainers[0].step}", flush=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall = prior + time.perf_counter() - t0
    save_checkpoints(trainers, args.out, wall, args.note)
    log.file.close()
    for t in trainers:
        print(f"{t.spec.name}: {t.step} steps")
    print(f"trained {time.perf_counter() - t0:.0f} s this run, {wall:.0f} s in all; checkpoints in {args.out}")


if __name__ == "__main__":
    main()
