"""Train the residual prior of lossless and near-lossless coding on a GPU (``visemz/models/residual_prior.py``).

    python tools/train_residual.py --data DATA --variant gray --out runs/res [--resume runs/res] \
        [--time-limit 1500] [--final-decay 0.3]
    python tools/train_residual.py --data DATA --variant rgb --out runs/rgb \
        --init visemz/models/weights/residual-rgb.safetensors   # fine-tune a shipped prior
    python tools/train_residual.py --export runs/res --variant gray   # -> visemz/models/weights/
    python tools/train_residual.py --data DATA --variant gray --out runs/int8 --integer \
        --init visemz/models/weights/residual-gray.safetensors   # the integer prior, from the float one

DATA holds train/gray, train2/gray/*, train2/gray16 (gray) or train/rgb, train2/rgb/* (rgb), as the
lossy models' training reads them; nothing under eval/ is read.  Images keep their own values: 8-bit
as 0..255, 16-bit with their own [min, max] as the codec normalises them.  Files whose name stem is
in --holdout (default ``HOLDOUT``, 16-bit images and EM slices kept for the evaluation) are left out,
with their 8-bit copies.

Each step: random crops with flips, drawn by group (--mix); every sample gets its own lossy quality
(stratified over [1, 8]) and bound E (0 with probability --lossless-share, else one of --bounds, in
levels); the shipped lossy model of the variant (frozen) gives the reconstruction and its features as
a decoder has them; the loss is the residual's bits per pixel under the prior, passes in coding order
(``residual_prior.nll_bits``).  Adam with a warm-up, then --final-decay as in tools/train.py.

--init starts from a prior's weights file (fresh Adam moments, a warm-up) where --resume finds no checkpoint.
A --width wider than the file's widens it so that the start codes exactly as the file does: the new hidden
channels start at random, and every weight from a new channel into an old one, or into the output, at zero.
--zero-own-pass zeroes a head's inputs for its own pass's context: a prior trained when a pass coded its
channels side by side never saw them other than zero (their weights are still their random start), and zero
weights there make the start code exactly as that prior did; training then learns them.

--integer trains the integer prior (``visemz/models/integer_prior.py``: 8-bit weights and activations, rounding's
gradient passed straight through); from --init (a float prior's weights) its steps start at the float network's
99.99th percentiles on the first batch.  Its files are named residual-int8-VARIANT.

Checkpoints (every --checkpoint-every seconds and at the end, atomically): --out/residual-VARIANT.ckpt.safetensors,
float32 parameters and Adam's moments, step and seconds in the metadata; --resume takes it.  A log row
every --log-every steps in --out/residual-VARIANT.csv.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import signal
import time
from pathlib import Path

import cv2
import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from train import GRAY_GROUPS, CropSampler, Image, _files, draw_weights, parse_mix
from visemz.io.writers import atomic_file
from visemz.models import integer_prior, registry, residual_prior, residual_weights, training
from visemz.models import weights as W

# kept out of training for the lossless evaluation: 16-bit fluorescence and astronomy images (and their
# 8-bit copies), and EM slices
HOLDOUT = (
    "astro_HorseHead", "astro_M51", "astro_gc_2mass_k", "astro_synth_lowsnr",
    "fl_cp_0_2_N_G", "fl_cp_1-162hrhoe2", "fl_cp_101210OranePlt1_C16_w3",
    "fl_cp_1649_1109_0003_Amp5-1_B_20070424_C20_w2",
    "em_train_image_24", "em_train_image_25", "em_train_image_26", "em_train_image_27", "em_train_image_28",
    "em_train_image_29",
)
DEFAULT_MIX = {"gray": "xray=0.3,science=0.3,sixteen=0.2,photo=0.2", "rgb": "photo=1"}


def stem(path: Path) -> str:
    """A file's source name: the stem without the crop number a collection adds (``_0``, ``_1``)."""
    return re.sub(r"_\d+$", "", path.stem) if not path.stem.startswith("em_") else path.stem


def held_out(path: Path, holdout: set[str]) -> bool:
    s = stem(path)
    return any(s == h or s.startswith(h) for h in holdout)


def read_raw(path: Path, variant: str) -> tuple[np.ndarray, int] | None:
    """(C x H x W uint16 pixels as stored, bits 8 or 16), or None for a file of another kind."""
    img = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    if img is None:
        return None
    if variant == "rgb":
        if img.ndim != 3 or img.dtype != np.uint8:
            return None
        return cv2.cvtColor(img[:, :, :3], cv2.COLOR_BGR2RGB).transpose(2, 0, 1).astype(np.uint16), 8
    if img.ndim == 3:
        if img.dtype != np.uint8:
            return None
        img = cv2.cvtColor(img[:, :, :3], cv2.COLOR_BGR2GRAY)
    return img[None].astype(np.uint16), 16 if img.dtype == np.uint16 else 8


def group_of(path: Path, bits: int, variant: str) -> str:
    if variant == "rgb":
        return "photo"
    if bits == 16:
        return "sixteen"
    return GRAY_GROUPS.get(path.name.split("_", 1)[0], "photo")


def load(data: Path, variant: str, holdout: set[str]) -> tuple[list[Image], np.ndarray]:
    """The training images as Image records (raw values) and each one's (lo, hi)."""
    if variant == "rgb":
        files = _files(data / "train" / "rgb") + _files(data / "train2" / "rgb")
    else:
        files = _files(data / "train" / "gray") + _files(data / "train2" / "gray") + _files(data / "train2" / "gray16")
    images, ranges = [], []
    for p in files:
        if held_out(p, holdout):
            continue
        got = read_raw(p, variant)
        if got is None:
            continue
        pixels, bits = got
        images.append(Image(pixels, group_of(p, bits, variant)))
        ranges.append((0, 255) if bits == 8 else (int(pixels.min()), int(pixels.max())))
    if not images:
        raise SystemExit(f"no {variant} training images under {data}")
    return images, np.asarray(ranges, np.float32)


def parse_args(argv=None) -> argparse.Namespace:
    a = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--data", type=Path, help="folder holding train/ and train2/")
    a.add_argument("--variant", choices=("gray", "rgb"), default="gray")
    a.add_argument("--out", type=Path, help="checkpoint and log folder")
    a.add_argument("--resume", type=Path, help="folder of a checkpoint to go on from")
    a.add_argument("--init", type=Path, help="a residual prior weights file to start from (no checkpoint yet)")
    a.add_argument("--export", type=Path, help="write the shipped weights from this folder's checkpoint, then stop")
    a.add_argument("--weights-dir", type=Path, help="where --export writes (default: the package's weights folder)")
    a.add_argument("--time-limit", type=float, default=1200.0, help="seconds of training (a resumed run's "
                   "earlier seconds count)")
    a.add_argument("--final-decay", type=float, default=0.0, help="share of --time-limit at the end with a "
                   "half-cosine LR decay to x0.05")
    a.add_argument("--batch", type=int, default=16)
    a.add_argument("--patch", type=int, default=128)
    a.add_argument("--lr", type=float, default=1e-3)
    a.add_argument("--width", type=int, default=48, help="hidden channels (wider than --init's widens it)")
    a.add_argument("--zero-own-pass", action="store_true", help="with --init from a prior that coded a pass's "
                   "channels side by side: zero the heads' inputs for their own pass")
    a.add_argument("--integer", action="store_true", help="train (or export) the integer prior")
    a.add_argument("--lossless-share", type=float, default=0.5)
    a.add_argument("--bounds", default="1,2,3,4,6,8", help="near-lossless bounds E drawn for the other samples")
    a.add_argument("--mix", help="GROUP=SHARE,... (default by variant)")
    a.add_argument("--holdout", default=",".join(HOLDOUT), help="file stems kept out of training")
    a.add_argument("--checkpoint-every", type=float, default=180.0)
    a.add_argument("--log-every", type=int, default=200)
    a.add_argument("--seed", type=int, default=0)
    args = a.parse_args(argv)
    if args.export is None and (args.data is None or args.out is None):
        a.error("--data and --out are needed to train")
    return args


def zero_own_pass_inputs(prior: residual_prior.ResidualPrior) -> None:
    """Zero each head's weights on its own pass's context: what a colour step sees of the channels coded before
    it in the same pass (always zero for a prior that coded a pass's channels side by side)."""
    c, width = prior.channels, prior.width
    with torch.no_grad():
        for k, head in enumerate(prior.heads):
            head[0].weight[:, width + k * c:width + (k + 1) * c] = 0


def widened(state: dict[str, torch.Tensor], prior: residual_prior.ResidualPrior) -> dict[str, torch.Tensor]:
    """``state`` (a float prior's parameters) placed into ``prior``'s wider layers so that ``prior`` computes what
    ``state`` does: each old weight at its place (a head's context inputs move up past the new trunk channels), the
    new channels' own weights from ``prior``'s random start, every weight from a new channel into an old channel
    or into an output zero.  The same widths give ``state`` back."""
    old = state["trunk.0.weight"].shape[0]
    new = prior.width
    if new == old:
        return state
    if new < old:
        raise SystemExit(f"--width {new} is narrower than the --init prior's {old}")
    out = {}
    for name, start in prior.state_dict().items():
        w = state[name].to(start.device)
        if w.shape == start.shape:
            out[name] = w
            continue
        grown = start.clone()
        rows = w.shape[0]
        if w.ndim == 1:  # a bias
            grown[:rows] = w
        else:
            grown[:rows] = 0  # old rows see nothing of the new channels
            columns = list(range(w.shape[1]))
            if name.startswith("heads.") and name.endswith(".0.weight"):  # [trunk | context]: context moves up
                columns = [c if c < old else c + new - old for c in columns]
            grown[:rows, columns] = w
        out[name] = grown
    return out


def ckpt_path(folder: Path, variant: str, integer: bool = False) -> Path:
    return folder / f"{residual_weights.file_stem(variant, integer)}.ckpt.safetensors"


class Trainer:
    WARMUP = 300

    def __init__(self, args, device):
        self.args, self.device = args, device
        self.spec = registry.spec(registry.DEFAULT_MODEL, args.variant)
        self.lossy, self.lossy_id = W.load(self.spec, device)
        channels = self.spec.channels
        kind = integer_prior.IntegerPrior if args.integer else residual_prior.ResidualPrior
        self.prior = kind(channels, self.spec.N, args.width).to(device)
        self.loss_bits = integer_prior.nll_bits if args.integer else residual_prior.nll_bits
        self.needs_steps = False  # the integer prior's steps, set from the first batch after --init
        self.opt = torch.optim.Adam(self.prior.parameters(), lr=args.lr)
        self.step, self.seconds, self.fresh_moments = 0, 0.0, True
        self.init_id = ""  # the id of the weights file --init started from
        self.bounds = torch.tensor([float(b) for b in args.bounds.split(",")], device=device)

    def save(self, path: Path) -> None:
        tensors = {f"p/{k}": v.detach().float().cpu().contiguous() for k, v in self.prior.state_dict().items()}
        names = dict(self.prior.named_parameters())
        for n, p in names.items():
            st = self.opt.state.get(p)
            if st:
                tensors[f"m/{n}"] = st["exp_avg"].cpu().contiguous()
                tensors[f"v/{n}"] = st["exp_avg_sq"].cpu().contiguous()
        meta = {"step": str(self.step), "seconds": f"{self.seconds:.1f}", "config": json.dumps(self.prior.config),
                "lossy_model": self.spec.name, "lossy_model_id": self.lossy_id, "init_id": self.init_id}
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(path) as (_, tmp):
            save_file(tensors, str(tmp), metadata=meta)

    def load(self, path: Path) -> None:
        with safe_open(str(path), framework="pt") as f:
            meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
        self.prior.load_state_dict({k[2:]: v for k, v in tensors.items() if k.startswith("p/")})
        self.step, self.seconds = int(meta["step"]), float(meta["seconds"])
        self.init_id = meta.get("init_id", "")
        moments = [k for k in tensors if k.startswith("m/")]
        if moments:
            names = dict(self.prior.named_parameters())
            for k in moments:
                n = k[2:]
                p = names[n]
                self.opt.state[p] = {"step": torch.tensor(float(self.step)), "exp_avg": tensors[k].to(self.device),
                                     "exp_avg_sq": tensors["v/" + n].to(self.device)}
            self.fresh_moments = False

    def init_from(self, path: Path) -> None:
        """Start from a prior's weights file."""
        tensors, _ = W.read_tensors(path)
        self.init_id = W.file_id(path)
        prefix = residual_weights.PREFIX
        state = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
        if not self.args.integer:
            state = widened(state, self.prior)
        self.prior.load_state_dict(state, strict=not self.args.integer)
        if self.args.integer:  # from a prior that already codes a pass a channel at a time
            self.needs_steps = True
        elif self.args.zero_own_pass:
            zero_own_pass_inputs(self.prior)

    def set_steps(self, sampler: CropSampler, ranges: torch.Tensor) -> None:
        """The integer prior's steps from the float network's values on a batch (the context: the true residuals)."""
        x, lo, hi, bound, features, x_hat = self.batch(sampler, ranges)
        with torch.no_grad():
            reduced = self.prior.reduce(features)
        view = lambda v: v.view(-1, 1, 1, 1)  # noqa: E731
        span = (hi - lo).clamp_min(1.0)
        pred = view(lo) + x_hat.clamp(0, 1) * view(span)
        context = residual_prior.space_to_depth((x - pred) / (residual_prior.CONTEXT_SCALE * view(span) / 255.0))
        self.prior.init_steps(reduced.detach(), x_hat, torch.log2(span / 255.0), torch.log2(2 * bound + 1), context)
        self.needs_steps = False

    def batch_settings(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        quality = training.batch_qualities(n, self.device)
        draw = torch.randint(0, self.bounds.numel(), (n,), device=self.device)
        lossless = torch.rand(n, device=self.device) < self.args.lossless_share
        return quality, torch.where(lossless, torch.zeros_like(draw, dtype=torch.float32), self.bounds[draw])

    def batch(self, sampler: CropSampler, ranges: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """A batch of crops with their settings and what the lossy decoder gives: (x, lo, hi, bound, g_s's
        features, x_hat)."""
        raw, k = sampler.sample(self.args.batch)
        x = raw.float()
        lo, hi = ranges[k, 0], ranges[k, 1]
        x01 = (x - lo.view(-1, 1, 1, 1)) / (hi - lo).clamp_min(1).view(-1, 1, 1, 1)
        quality, bound = self.batch_settings(x.shape[0])
        features, x_hat = training.reconstruct(self.lossy, x01, quality, amp=True)
        return x, lo, hi, bound, features, x_hat

    def train_step(self, sampler: CropSampler, ranges: torch.Tensor, lr: float) -> tuple[float, float]:
        x, lo, hi, bound, features, x_hat = self.batch(sampler, ranges)
        reduced = self.prior.reduce(features)
        bits = self.loss_bits(self.prior, reduced, x_hat, x, lo, hi, bound)
        pixels = x.shape[1] * x.shape[2] * x.shape[3]
        loss = bits.mean() / pixels
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.prior.parameters(), 1.0)
        self.opt.step()
        self.step += 1
        lossless = bound == 0
        bpp0 = (bits[lossless].mean() / pixels) if bool(lossless.any()) else torch.tensor(float("nan"))
        return float(loss), float(bpp0)


def lr_at(t: Trainer, elapsed: float, args) -> float:
    scale = min(1.0, (t.step + 1) / t.WARMUP) if t.fresh_moments else 1.0
    start = args.time_limit * (1 - args.final_decay)
    if args.final_decay > 0 and elapsed > start:
        frac = min(1.0, (elapsed - start) / (args.time_limit - start))
        scale *= 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac))
    return args.lr * scale


def train(args) -> None:
    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
    t = Trainer(args, device)
    resume = ckpt_path(args.resume, args.variant, args.integer) if args.resume else None
    if resume is not None and resume.is_file():
        t.load(resume)
        print(f"resumed {resume} at step {t.step}")
    elif args.init is not None:
        t.init_from(args.init)
        print(f"starting from {args.init}")
    images, ranges = load(args.data, args.variant, set(filter(None, args.holdout.split(","))))
    mix = parse_mix(args.mix or DEFAULT_MIX[args.variant])
    sampler = CropSampler(images, draw_weights(images, mix), args.patch, device)
    ranges_t = torch.from_numpy(ranges).to(device)
    if t.needs_steps:
        t.set_steps(sampler, ranges_t)
    print(f"{len(images)} images; groups {sorted({im.group for im in images})}; device {device}"
          f" {torch.cuda.get_device_name() if device == 'cuda' else ''}", flush=True)
    log_path = args.out / f"{residual_weights.file_stem(args.variant, args.integer)}.csv"
    args.out.mkdir(parents=True, exist_ok=True)
    new_log = not log_path.exists()
    with open(log_path, "a", newline="") as f:
        w = csv.writer(f)
        if new_log:
            w.writerow(["step", "seconds", "lr", "bpp", "bpp_lossless"])
        t0, last_ckpt, acc = time.time(), time.time(), []
        base_seconds = t.seconds
        stop = []  # SIGTERM (a GPU job ending) stops after the step in hand, with a checkpoint
        signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
        while not stop:
            elapsed = base_seconds + time.time() - t0  # a resumed run goes on with its schedule
            if elapsed >= args.time_limit:
                break
            acc.append(t.train_step(sampler, ranges_t, lr_at(t, elapsed, args)))
            if t.step % args.log_every == 0:
                a = np.asarray(acc, np.float64)
                t.seconds = base_seconds + time.time() - t0
                w.writerow([t.step, f"{t.seconds:.1f}", f"{lr_at(t, elapsed, args):.2e}",
                            f"{np.nanmean(a[:, 0]):.4f}", f"{np.nanmean(a[:, 1]):.4f}"])
                f.flush()
                print(f"step {t.step} {t.seconds:.0f}s bpp {np.nanmean(a[:, 0]):.4f} lossless "
                      f"{np.nanmean(a[:, 1]):.4f}", flush=True)
                acc = []
            if time.time() - last_ckpt >= args.checkpoint_every:
                t.seconds = base_seconds + time.time() - t0
                t.save(ckpt_path(args.out, args.variant, args.integer))
                last_ckpt = time.time()
        t.seconds = base_seconds + time.time() - t0
        t.save(ckpt_path(args.out, args.variant, args.integer))
    print(f"done: step {t.step}, {t.seconds:.0f} s", flush=True)


def export(args) -> None:
    path = ckpt_path(args.export, args.variant, args.integer)
    with safe_open(str(path), framework="pt") as f:
        meta, tensors = f.metadata(), {k[2:]: f.get_tensor(k) for k in f.keys() if k.startswith("p/")}
    config = json.loads(meta["config"])
    prior = (integer_prior.IntegerPrior if args.integer else residual_prior.ResidualPrior)(**config)
    prior.load_state_dict(tensors)
    card = {"steps": int(meta["step"]), "train_seconds": float(meta["seconds"]), "lossy_model": meta["lossy_model"],
            "lossy_model_id": meta["lossy_model_id"], "holdout": list(HOLDOUT)}
    if meta.get("init_id"):
        card["init_id"] = meta["init_id"]  # the prior it started from (for --integer with no steps: quantised from)
    model_id = residual_weights.save(prior.integers() if args.integer else prior, args.variant, card,
                                     args.weights_dir)
    print(f"exported {residual_weights.file_stem(args.variant, args.integer)}: id {model_id}")


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.export is not None:
        export(args)
    else:
        train(args)


if __name__ == "__main__":
    main()
