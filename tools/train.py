"""Train visemz's variable-rate models on GPUs: several models per process, images resident on the GPU.

    python tools/train.py --data DATA --models balle2016-rgb mbt2018-mean-rgb \
        --out runs/r1 [--resume runs/r0] [--init-from visemz/models/weights] [--time-limit 1500]

    torchrun --nproc-per-node 4 tools/train.py ...      # the models are dealt out over the GPUs
    torchrun --nproc-per-node 4 tools/train.py --ddp --models minnen2020-rgb ...   # one model on all GPUs

--ddp trains every model on every GPU with torch's DistributedDataParallel: one process per GPU, each
drawing its own crops (--batch per GPU), gradients averaged over the GPUs each step; steps run eagerly
(no CUDA graphs), rank 0 writes the checkpoints and the log (its rows the mean over the GPUs), and the
ranks agree every few steps on stopping (SIGTERM, --time-limit, --steps), so they stop together.

Data: RGB models train on train/rgb + train2/rgb/* + train3/rgb/*; gray models on train/gray,
train2/gray/*, train2/gray16 (16-bit, stretched by their own range as the codec does), train3/gray/*
and the luminance of every RGB photo.  train3 (read where present) is what
tools/prepare_training_data.py writes: ImageNet class samples and BSDS500 photos downscaled 0.75x
(CBSD68, already in train2, left out), COVID-CXNet chest X-rays (xr_: the xray group); its
manifest.json lists every image and what was kept out (evaluation images and their near-duplicates,
the evaluation X-rays' source and patients).  The model cards (export_weights.py) name these folders,
train3 included: train a model for a card with all of them present under --data.

Gray crops are drawn by group (--gray-mix): X-rays and the other scientific
images (EM, fluorescence, astronomy) get fixed shares so that the photos' luminance, most of
the pixels, does not drown them out; ``MODEL@area`` trains a model that draws every image by
its area instead (the ablation that measures what the mix does).  --upscale GROUP=F enlarges
a group's images F times (bicubic) at load: the training X-rays were downscaled (2x, or cut
from downscaled JPEGs) while detectors write them at native resolution, where a pixel holds
less detail; an enlarged image larger than the largest other one is cut into pieces of at
most that size (the packed tensor does not grow).  Images smaller than the patch are
mirror-padded.  Nothing under eval/ is read.

Every sample of a batch gets its own quality, stratified over [1, 8]: its gains scale its
latent and its lambda (CompressAI's ladder, interpolated) weighs its distortion.  ``MODEL@qQ``
(e.g. mbt2018-mean-rgb@q2) trains the same network as a fixed-rate model: every sample at
quality Q (its lambda, its gains), all else as for MODEL; the reference a variable-rate model
was measured against (docs/benchmarks.md, "Training").  Loss (--loss): the
batch mean of lambda * 255^2 * MSE + bpp, each sample's divided by its quality's reference loss
(``normalised``, the default: every quality weighs alike, ``training.rd_loss`` says why) or not
(``rd``, the loss the first shipped weights were trained with); Adam (--lr) with a linear warm-up whenever Adam's
moments start afresh, constant after it; --final-decay F lowers the LR along a half cosine to
x0.05 over the last F of --time-limit (give it to the last run of a training only); the entropy
bottleneck's auxiliary loss has its own Adam (lr 1e-3).  Transforms run under bf16 autocast,
gains and entropy models in float32.  On CUDA each model's whole step is one CUDA graph.
--patch-schedule STEP:PATCH[xBATCH],... changes the crops (and the batch) from a step on, e.g.
``900000:512x8`` for 512x512 crops in batches of 8 over the last part of a 1M-step training; a run
resumed past a switch starts with that switch's crops.

Checkpoints, every --checkpoint-every seconds and at the end, written atomically:
  --out/NAME.safetensors         fp16 parameters (small enough to leave a GPU job); step,
                                 seconds and qualities (1-8, or the fixed Q) in the metadata;
  --state-dir/NAME.full.safetensors   float32 parameters and both Adams' moments, for resuming
                                 on the same machine without a new warm-up.
--resume DIR takes a folder of either kind (the full state where present).  --init-from takes
shipped weights (int8 kernels, dequantised).  A log row per model every --log-every steps.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import torch
import torch.distributed as dist
from safetensors import safe_open
from safetensors.torch import save_file
from torch.nn.parallel import DistributedDataParallel

from visemz.errors import InvalidArgumentError
from visemz.io.writers import atomic_file
from visemz.models import architectures, training
from visemz.models import weights as W

GRAY_GROUPS = {"xr": "xray", "xray": "xray", "em": "science", "fl": "science", "astro": "science"}
DEFAULT_GRAY_MIX = "xray=0.35,science=0.25,photo=0.40"


# ------------------------------------------------------------------------------------------ data
@dataclass(frozen=True)
class Image:
    pixels: np.ndarray  # C x H x W uint16, full scale 65535
    group: str


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")) if folder.is_dir() else []


def _to16(img: np.ndarray) -> np.ndarray:
    """8-bit -> x257; 16-bit -> stretched over its own range (what the codec's normalisation does)."""
    if img.dtype == np.uint8:
        return img.astype(np.uint16) * 257
    lo, hi = int(img.min()), int(img.max())
    return ((img.astype(np.float64) - lo) * (65535.0 / max(hi - lo, 1))).round().astype(np.uint16)


def _gray_group(path: Path) -> str:
    return GRAY_GROUPS.get(path.name.split("_", 1)[0], "photo")


def _read_rgb(p: Path, variant: str) -> Image | None:
    img = cv2.imread(str(p), cv2.IMREAD_COLOR)
    if img is None:
        return None
    if variant == "rgb":
        return Image(_to16(cv2.cvtColor(img, cv2.COLOR_BGR2RGB)).transpose(2, 0, 1).copy(), "photo")
    return Image(_to16(cv2.cvtColor(img, cv2.COLOR_BGR2GRAY))[None], "photo")  # luminance (BT.601)


def _read_gray(p: Path) -> Image | None:
    img = cv2.imread(str(p), cv2.IMREAD_UNCHANGED)
    return Image(_to16(img)[None], _gray_group(p)) if img is not None and img.ndim == 2 else None


def load_images(data: Path, variant: str) -> list[Image]:
    """Every training image of a variant (see the module docstring), as Image records."""
    rgb_files = _files(data / "train" / "rgb") + _files(data / "train2" / "rgb") + _files(data / "train3" / "rgb")
    gray_files = (_files(data / "train" / "gray") + _files(data / "train2" / "gray")
                  + _files(data / "train2" / "gray16")
                  + _files(data / "train3" / "gray"))
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:  # OpenCV decodes without the GIL
        images = list(pool.map(lambda p: _read_rgb(p, variant), rgb_files))
        if variant == "gray":
            images += list(pool.map(_read_gray, gray_files))
    images = [im for im in images if im is not None]
    if not images:
        raise SystemExit(f"no {variant} training images under {data}/train*")
    return images


def parse_mix(text: str) -> dict[str, float]:
    mix = {}
    for part in text.split(","):
        name, _, share = part.partition("=")
        mix[name.strip()] = float(share)
    if not mix or any(v < 0 for v in mix.values()) or sum(mix.values()) <= 0:
        raise SystemExit(f"--gray-mix {text!r}: expected GROUP=SHARE,... with shares >= 0")
    return mix


def parse_upscale(text: str) -> dict[str, float]:
    """'xray=2' -> {'xray': 2.0}; '' -> {} (no group enlarged)."""
    factors = {}
    for part in filter(None, (t.strip() for t in text.split(","))):
        name, _, factor = part.partition("=")
        try:
            factors[name.strip()] = float(factor)
        except ValueError:
            raise SystemExit(f"--upscale {text!r}: expected GROUP=FACTOR,...") from None
    if any(not (1.0 <= f <= 8.0) for f in factors.values()):
        raise SystemExit(f"--upscale {text!r}: factors must lie in [1, 8]")
    return factors


def _pieces(pixels: np.ndarray, max_h: int, max_w: int) -> list[np.ndarray]:
    """An image cut into an even grid of pieces no larger than max_h x max_w."""
    _, h, w = pixels.shape
    rows, cols = -(-h // max_h), -(-w // max_w)
    ys, xs = np.linspace(0, h, rows + 1).astype(int), np.linspace(0, w, cols + 1).astype(int)
    return [pixels[:, ys[i]:ys[i + 1], xs[j]:xs[j + 1]] for i in range(rows) for j in range(cols)]


def upscale_groups(images: list[Image], factors: dict[str, float]) -> list[Image]:
    """Each image of a group in ``factors`` enlarged by its factor (bicubic, clipped to uint16),
    cut into pieces no larger than the largest image of the other groups."""
    if not factors:
        return images
    others = [im.pixels.shape[1:] for im in images if im.group not in factors] or [(1024, 1024)]
    max_h, max_w = max(s[0] for s in others), max(s[1] for s in others)
    out = []
    for im in images:
        f = factors.get(im.group)
        if f is None or f == 1.0:
            out.append(im)
            continue
        c, h, w = im.pixels.shape
        big = cv2.resize(im.pixels.transpose(1, 2, 0), (round(w * f), round(h * f)), interpolation=cv2.INTER_CUBIC)
        big = big.reshape(big.shape[0], big.shape[1], c).transpose(2, 0, 1)  # cv2 drops a channel axis of 1
        out += [Image(np.ascontiguousarray(p), im.group) for p in _pieces(big, max_h, max_w)]
    return out


def draw_weights(images: list[Image], mix: dict[str, float] | None) -> np.ndarray:
    """Probability of drawing each image: by area, or by area within each group times the group's share."""
    area = np.array([im.pixels.shape[1] * im.pixels.shape[2] for im in images], np.float64)
    if mix is None:
        return area / area.sum()
    groups = np.array([im.group for im in images])
    w = np.zeros_like(area)
    for g in set(groups):
        sel = groups == g
        w[sel] = mix.get(g, 0.0) * area[sel] / area[sel].sum()
    if w.sum() <= 0:
        raise SystemExit(f"the gray mix {mix} gives no weight to any group present ({sorted(set(groups))})")
    return w / w.sum()


class CropSampler:
    """Random patch x patch crops with flips, cut on the device with one gather.

    The images are packed into one zero-padded K x C x Hmax x Wmax uint16 tensor; crops never
    reach into the padding (images smaller than the patch are mirror-padded to it first).
    Every step is tensor ops on the device with no host sync, so the sampler can live inside
    a CUDA graph.
    """

    def __init__(self, images: list[Image], weights: np.ndarray, patch: int, device):
        pix = [self._fit(im.pixels, patch) for im in images]
        c = pix[0].shape[0]
        hmax, wmax = max(p.shape[1] for p in pix), max(p.shape[2] for p in pix)
        packed = np.zeros((len(pix), c, hmax, wmax), np.uint16)
        for k, p in enumerate(pix):
            packed[k, :, : p.shape[1], : p.shape[2]] = p
        # torch has no uint16 arithmetic on every device: keep int32 views' source as int16 bits
        self.images = torch.from_numpy(packed.view(np.int16)).to(device)
        self.count = len(pix)
        heights = torch.tensor([p.shape[1] for p in pix], dtype=torch.float32)
        widths = torch.tensor([p.shape[2] for p in pix], dtype=torch.float32)
        self.cdf = torch.from_numpy(np.cumsum(weights)).float().to(device)
        self.y_room = (heights - patch + 1).to(device)
        self.x_room = (widths - patch + 1).to(device)
        self.ramp = torch.arange(patch, device=device)
        self.channels = torch.arange(c, device=device)
        self.patch = patch

    @staticmethod
    def _fit(p: np.ndarray, patch: int) -> np.ndarray:
        ph, pw = max(0, patch - p.shape[1]), max(0, patch - p.shape[2])
        return np.pad(p, ((0, 0), (0, ph), (0, pw)), mode="symmetric") if ph or pw else p

    def _axis(self, room: torch.Tensor, k: torch.Tensor, n: int) -> torch.Tensor:
        """Indices along one axis: a random start within room[k], reversed for half the samples."""
        start = (torch.rand(n, device=room.device) * room[k]).long()
        flip = torch.rand(n, device=room.device) < 0.5
        ramp = torch.where(flip[:, None], self.patch - 1 - self.ramp, self.ramp)
        return start[:, None] + ramp

    def sample(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """n crops (n x C x patch x patch, int32 values 0..65535) and the image each was cut from."""
        u = torch.rand(n, device=self.cdf.device) * self.cdf[-1]
        k = torch.searchsorted(self.cdf, u).clamp_(max=self.count - 1)
        rows = self._axis(self.y_room, k, n)
        cols = self._axis(self.x_room, k, n)
        crops = self.images[k[:, None, None, None], self.channels[None, :, None, None],
                            rows[:, None, :, None], cols[:, None, None, :]]
        return crops.to(torch.int32) & 0xFFFF, k

    def sample_into(self, out: torch.Tensor) -> None:
        """Fill ``out`` (n x C x patch x patch, float) with crops scaled to [0, 1]."""
        torch.div(self.sample(out.shape[0])[0], 65535.0, out=out)


# -------------------------------------------------------------------------------------- training
class TrainingStep(torch.nn.Module):
    """One model's training forward and losses as a module, what DistributedDataParallel wraps: every
    parameter gets its gradient from the one backward of (RD loss + the entropy bottleneck's auxiliary loss)."""

    def __init__(self, model: torch.nn.Module, amp: bool, log_lambdas: torch.Tensor,
                 log_references: torch.Tensor | None):
        super().__init__()
        self.model, self.amp, self.log_lambdas, self.log_references = model, amp, log_lambdas, log_references

    def forward(self, x: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x_hat, liks = training.forward_train(self.model, x, q, self.amp)
        loss, mse, bpp = training.rd_loss(x, x_hat, liks, q, self.log_lambdas, self.log_references)
        return loss, mse, bpp, self.model.aux_loss()


class Trainer:
    WARMUP = 500  # steps of linear LR warm-up whenever Adam's moments start afresh

    def __init__(self, name: str, sampler: CropSampler, batch: int, device, lr: float, amp: bool,
                 loss: str = "normalised", ddp: bool = False, spec=None):
        self.name = name  # e.g. "balle2016-gray", "balle2016-gray@area" or "mbt2018-mean-rgb@q2"
        parsed = training.parse_name(name)
        # ``spec``: another size of the named architecture (tools/bench_train_step.py's), else the registry's
        self.spec, self.fixed_quality = spec or parsed.spec, parsed.quality
        self.model = architectures.build(self.spec).to(device).train()
        self.aux_names = {n for n, _ in self.model.named_parameters() if n.endswith("quantiles")}
        params = dict(self.model.named_parameters())
        on_gpu = torch.device(device).type == "cuda"
        # A tensor LR lives in the graph: changing it needs no re-capture.
        opt_args = {"fused": True, "capturable": True} if on_gpu else {}
        self.lr_now = torch.tensor(lr, device=device)
        self.main_params = [params[n] for n in params if n not in self.aux_names]
        self.opt = torch.optim.Adam(self.main_params, lr=self.lr_now, **opt_args)
        self.aux_opt = torch.optim.Adam([params[n] for n in self.aux_names], lr=1e-3, **opt_args)
        self.loss = loss
        references = training.log_reference_table(device) if loss == "normalised" else None
        module = TrainingStep(self.model, amp, training.log_lambda_table(device), references)
        # broadcast_buffers off: the buffers are constants (the entropy models' tables and bounds)
        self.forward = DistributedDataParallel(module, device_ids=[torch.device(device).index] if on_gpu else None,
                                               broadcast_buffers=False) if ddp else module
        self.amp = amp
        self.lr = lr
        self.step = 0
        self.warm_from = 0  # step at which Adam's moments last started afresh
        self.seconds = 0.0  # training wall time of this model before this run
        self.good = None  # last finite state, restored if the loss turns non-finite
        self.graph = None
        # Each model's steps go to a stream of its own, so that one model's small kernels (the
        # hyper-transforms at 1/64 of the crop) overlap another's; models share nothing they write.
        self.stream = torch.cuda.Stream(device) if on_gpu and not ddp else None
        self.metrics = None  # the last step's [loss, mse, bpp, aux], on the device
        self.use(sampler, batch)

    def use(self, sampler: CropSampler, batch: int) -> None:
        """Train on ``sampler``'s crops in batches of ``batch`` from the next step on (a captured graph is dropped:
        capture again)."""
        self.sampler = sampler
        self.x = torch.zeros(batch, self.spec.channels, sampler.patch, sampler.patch, device=self.lr_now.device)
        self.graph = None

    def _step(self) -> torch.Tensor:
        """One whole training step in tensor ops (the body a CUDA graph captures)."""
        self.sampler.sample_into(self.x)
        q = training.batch_qualities(self.x.shape[0], self.x.device, self.fixed_quality)
        loss, mse, bpp, aux = self.forward(self.x, q)
        self.opt.zero_grad(set_to_none=True)
        self.aux_opt.zero_grad(set_to_none=True)
        (loss + aux).backward()  # disjoint parameters: the RD loss never reaches the bottleneck's quantiles
        torch.nn.utils.clip_grad_norm_(self.main_params, 1.0, error_if_nonfinite=False)
        self.opt.step()
        self.aux_opt.step()
        return torch.stack([loss.detach(), mse.detach(), bpp.detach(), aux.detach()])

    def capture(self, warmup_steps: int = 3) -> None:
        """Run a few eager steps on a side stream (Adam state, cuDNN autotuning), then capture one."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup_steps):
                self.train_step(0.0)  # LR 0: the warm-up steps only build state
        torch.cuda.current_stream().wait_stream(side)
        self.step -= warmup_steps
        self.opt.zero_grad(set_to_none=True)
        self.aux_opt.zero_grad(set_to_none=True)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.metrics = self._step()

    def train_step(self, lr_scale: float) -> torch.Tensor:
        warm = min(1.0, (self.step - self.warm_from + 1) / self.WARMUP)
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
                        if torch.is_tensor(v) and v.dim() > 0:
                            v.zero_()
        self.warm_from = self.step
        return False

    # --------------------------------------------------------------------- state in and out
    def _opt_tensors(self) -> dict[str, torch.Tensor]:
        """Both Adams' moments keyed by parameter name (the step counters are the model's step)."""
        names = {id(p): n for n, p in self.model.named_parameters()}
        out = {}
        for opt in (self.opt, self.aux_opt):
            for p, st in opt.state.items():
                for key in ("exp_avg", "exp_avg_sq"):
                    if key in st:
                        out[f"adam/{names[id(p)]}/{key}"] = st[key].detach().float().cpu().contiguous()
        return out

    def save(self, out: Path, state_dir: Path | None, seconds: float, note: str) -> None:
        meta = {"step": str(self.step), "train_seconds": f"{self.seconds + seconds:.1f}", "note": note,
                "model": self.name, "loss": self.loss, "patch": str(self.sampler.patch), "batch": str(self.x.shape[0]),
                "spec": json.dumps({"N": self.spec.N, "M": self.spec.M, **({"slices": list(self.spec.slices)}
                                                                            if self.spec.context else {})}),
                "qualities": "1-8" if self.fixed_quality is None else f"{self.fixed_quality:g}"}
        params = {n for n, _ in self.model.named_parameters()}
        state = {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
        # Parameters as fp16 (what leaves the GPU job must be small); buffers are constants such as
        # the likelihood bound 1e-9, which fp16 would flush to zero: they stay float32.
        compact = {k: (v.half() if k in params else v.float()).contiguous() for k, v in state.items()}
        _atomic_save(compact, out / f"{self.name}.safetensors", meta)
        if state_dir is not None:
            full = {f"param/{k}": v.float().contiguous() for k, v in state.items()}
            full.update(self._opt_tensors())
            _atomic_save(full, state_dir / f"{self.name}.full.safetensors", meta)

    def load(self, path: Path) -> None:
        """Parameters (and Adam's moments, from a full state file) from a checkpoint this script wrote."""
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        full = path.name.endswith(".full.safetensors")
        state = {k[len("param/"):]: v for k, v in tensors.items() if k.startswith("param/")} if full else tensors
        self._copy_params(state, path)
        self.step = int(meta.get("step", 0))
        self.seconds = float(meta.get("train_seconds", 0.0))
        self.warm_from = self.step
        if full:
            self._load_adam(tensors)
        print(f"{self.name}: resumed at step {self.step} from {path}" + (" with Adam's moments" if full else ""))

    def _copy_params(self, state: dict[str, torch.Tensor], path: Path) -> None:
        params = dict(self.model.named_parameters())
        missing = sorted(set(params) - set(state))
        if missing:
            raise SystemExit(f"{self.name}: {path} lacks {missing[:3]}")
        with torch.no_grad():  # parameters only: buffers are constants the model builds itself
            for k, p in params.items():
                p.copy_(state[k].float())

    def _load_adam(self, tensors: dict[str, torch.Tensor]) -> None:
        """Rebuild both Adams' state from the saved moments (before the graph is captured)."""
        names = {id(p): n for n, p in self.model.named_parameters()}
        for opt in (self.opt, self.aux_opt):
            for group in opt.param_groups:
                for p in group["params"]:
                    name = names[id(p)]
                    avg, sq = tensors.get(f"adam/{name}/exp_avg"), tensors.get(f"adam/{name}/exp_avg_sq")
                    if avg is None or sq is None:
                        return  # incomplete: Adam starts afresh (and the LR warms up)
                    on = {"device": p.device, "dtype": torch.float32}
                    opt.state[p] = {"step": torch.tensor(float(self.step), **on), "exp_avg": avg.to(**on),
                                    "exp_avg_sq": sq.to(**on)}
        self.warm_from = self.step - self.WARMUP  # moments restored: no new warm-up

    def init_from_weights(self, folder: Path) -> None:
        path = folder / f"{self.spec.name}.safetensors"
        tensors, meta = W.read_tensors(path)
        self._copy_params(W.dequantize_state(tensors), path)
        card = path.with_suffix(".json")
        info = json.loads(card.read_text()) if card.is_file() else {}
        self.step = self.warm_from = int(info.get("steps", 0))
        self.seconds = float(info.get("train_seconds", 0.0))
        print(f"{self.name}: starts from {path} at step {self.step}")


def _atomic_save(tensors: dict[str, torch.Tensor], path: Path, meta: dict[str, str]) -> None:
    with atomic_file(path) as (_, tmp):
        save_file(tensors, str(tmp), metadata=meta)


def resume_path(folder: Path, name: str) -> Path | None:
    for candidate in (folder / f"{name}.full.safetensors", folder / f"{name}.safetensors"):
        if candidate.is_file():
            return candidate
    return None


class Log:
    """Per-model CSV rows, averaged over --log-every steps (one host sync per model per row).  Under --ddp
    every rank calls ``row`` at the same steps (the means are all-reduced over the ranks), and rank 0 writes."""

    FIELDS = ("model", "step", "loss", "mse", "psnr", "bpp", "aux", "seconds", "lr", "gpu")

    def __init__(self, path: Path | None, trainers: list[Trainer], gpu: str, ranks: int = 1):
        self.file = self.writer = None
        if path is not None:
            new = not path.exists()
            self.file = open(path, "a", newline="")
            self.writer = csv.writer(self.file)
            if new:
                self.writer.writerow(self.FIELDS)
        self.gpu, self.ranks = gpu, ranks
        self.sums = {t.name: torch.zeros(4, device=t.x.device) for t in trainers}
        self.counts = {t.name: 0 for t in trainers}

    def add(self, t: Trainer, metrics: torch.Tensor) -> None:
        self.sums[t.name] += metrics
        self.counts[t.name] += 1

    def row(self, t: Trainer, seconds: float) -> list[float]:
        sums = self.sums[t.name] / max(self.counts[t.name], 1)
        if self.ranks > 1:
            dist.all_reduce(sums)  # a NaN on any rank reaches every rank: they roll back together
            sums = sums / self.ranks
        vals = sums.tolist()
        self.sums[t.name].zero_()
        self.counts[t.name] = 0
        mean = dict(zip(("loss", "mse", "bpp", "aux"), vals))
        psnr = 10 * math.log10(1.0 / max(mean["mse"], 1e-12)) if math.isfinite(mean["mse"]) else float("nan")
        if self.writer is not None:
            self.writer.writerow([t.name, t.step, f"{mean['loss']:.5f}", f"{mean['mse']:.7f}", f"{psnr:.3f}",
                                  f"{mean['bpp']:.5f}", f"{mean['aux']:.3f}", f"{t.seconds + seconds:.1f}",
                                  f"{float(t.lr_now):.2e}", self.gpu])
        return vals

    def flush(self) -> None:
        if self.file is not None:
            self.file.flush()


# ------------------------------------------------------------------------------------------- main
def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True,
                    help="the data folder, e.g. DATA: train/ and train2/ (see above); eval/ is never read")
    ap.add_argument("--models", nargs="+", required=True,
                    help="e.g. balle2016-rgb mbt2018-mean-gray balle2016-gray@area mbt2018-mean-rgb@q2 minnen2020-rgb")
    ap.add_argument("--out", type=Path, required=True, help="compact checkpoints and the log")
    ap.add_argument("--state-dir", type=Path, default=None,
                    help="full checkpoints with Adam's moments (default: --out)")
    ap.add_argument("--resume", type=Path, help="a folder of checkpoints this script wrote")
    ap.add_argument("--init-from", type=Path,
                    help="start from shipped weights in this folder (e.g. visemz/models/weights)")
    ap.add_argument("--steps", type=int, default=10_000_000, help="stop when every model has this many steps")
    ap.add_argument("--time-limit", type=float, default=float("inf"), help="seconds of training in this run")
    ap.add_argument("--final-decay", type=float, default=0.0,
                    help="fraction of --time-limit at the end over which the LR falls to x0.05 (the last run of a "
                         "training only)")
    ap.add_argument("--checkpoint-every", type=float, default=180.0, help="seconds between checkpoints")
    ap.add_argument("--gray-mix", default=DEFAULT_GRAY_MIX, help="shares of the gray groups (xray, science, photo)")
    ap.add_argument("--upscale", default="", help="enlarge a group's images at load, e.g. xray=2 (see above)")
    ap.add_argument("--batch", type=int, default=16, help="crops per step (per GPU under --ddp)")
    ap.add_argument("--patch", type=int, default=256)
    ap.add_argument("--patch-schedule", default="",
                    help="STEP:PATCH[xBATCH],...: other crops from a step on, e.g. 900000:512x8")
    ap.add_argument("--loss", choices=training.LOSSES, default="normalised",
                    help="normalised: each sample's RD loss divided by its quality's reference (see above); rd: not")
    ap.add_argument("--ddp", action="store_true",
                    help="under torchrun: every model on every GPU, DistributedDataParallel")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--no-amp", action="store_true")
    ap.add_argument("--no-graphs", action="store_true", help="run steps eagerly instead of as CUDA graphs")
    ap.add_argument("--one-stream", action="store_true", help="run every model on the default stream (no overlap)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--log-every", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--note", default="", help="how this run trained, for the model cards (export_weights.py)")
    args = ap.parse_args(argv)
    for name in args.models:  # a bad name or tag stops here, before any data is loaded
        try:
            training.parse_name(name)
        except InvalidArgumentError as e:
            ap.error(str(e))
    try:
        args.schedule = parse_schedule(args.patch_schedule)
    except ValueError as e:
        ap.error(str(e))
    return args


def parse_schedule(text: str) -> list[tuple[int, int, int | None]]:
    """'900000:512x8,950000:768' -> [(900000, 512, 8), (950000, 768, None)], sorted by step; '' -> []."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        step, _, crop = part.partition(":")
        patch, _, batch = crop.partition("x")
        try:
            entry = (int(step), int(patch), int(batch) if batch else None)
        except ValueError:
            raise ValueError(f"--patch-schedule {text!r}: expected STEP:PATCH[xBATCH],... e.g. 900000:512x8") from None
        if entry[0] < 0 or entry[1] < 64 or entry[1] % 64 or (entry[2] is not None and entry[2] < 1):
            raise ValueError(f"--patch-schedule {part!r}: the step must be >= 0, the patch a multiple of 64, the batch "
                             ">= 1")
        out.append(entry)
    return sorted(out)


def crops_at(step: int, args) -> tuple[int, int]:
    """(patch, batch) of a step: --patch and --batch, changed by every --patch-schedule entry at or before it."""
    patch, batch = args.patch, args.batch
    for at, p, b in args.schedule:
        if step >= at:
            patch, batch = p, b or batch
    return patch, batch


def distributed() -> tuple[int, int, int]:
    """(rank, world size, local rank) under torchrun; (0, 1, 0) without it."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))


def my_models(models: list[str], ddp: bool = False) -> tuple[list[str], str]:
    """Under torchrun each rank trains every WORLD_SIZE-th model on its own GPU (with --ddp: every model)."""
    rank, world, local = distributed()
    return (models if ddp else models[rank::world]), (f"cuda:{local}" if world > 1 else "")


class Data:
    """The training images of each variant (loaded once) and crop samplers of them, per (variant, draw, patch)."""

    def __init__(self, args, device):
        self.args, self.device = args, device
        self.images: dict[str, list[Image]] = {}
        self.samplers: dict[tuple[str, str, int], CropSampler] = {}

    def sampler(self, name: str, patch: int) -> CropSampler:
        parsed = training.parse_name(name)
        spec, draw = parsed.spec, parsed.draw
        key = (spec.variant, draw, patch)
        if key not in self.samplers:
            if spec.variant not in self.images:
                self.images[spec.variant] = upscale_groups(load_images(self.args.data, spec.variant),
                                                           parse_upscale(self.args.upscale))
            imgs = self.images[spec.variant]
            mix = None if (spec.variant == "rgb" or draw == "area") else parse_mix(self.args.gray_mix)
            self.samplers[key] = CropSampler(imgs, draw_weights(imgs, mix), patch, self.device)
            groups = {g: sum(1 for im in imgs if im.group == g) for g in sorted({im.group for im in imgs})}
            print(f"{spec.variant} ({draw}, {patch}x{patch}): {len(imgs)} images {groups} on {self.device}", flush=True)
        return self.samplers[key]

    def drop_unused(self, trainers: list["Trainer"]) -> None:
        """Samplers no trainer uses any more (a schedule moved on) give their device memory back."""
        used = {id(t.sampler) for t in trainers}
        for key in [k for k, v in self.samplers.items() if id(v) not in used]:
            del self.samplers[key]


def follow_schedule(t: Trainer, data: Data, args) -> bool:
    """Give a trainer the crops its step calls for; whether they changed (then a captured graph is gone)."""
    patch, batch = crops_at(t.step, args)
    if (patch, batch) == (t.sampler.patch, t.x.shape[0]):
        return False
    t.use(data.sampler(t.name, patch), batch)
    print(f"{t.name}: {patch}x{patch} crops, batch {batch}, from step {t.step}", flush=True)
    return True


def main(argv=None) -> None:
    args = parse_args(argv)
    rank, world, _ = distributed()
    names, dev_override = my_models(args.models, args.ddp)
    device = torch.device(dev_override if dev_override and args.device.startswith("cuda") else args.device)
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    if args.ddp and world > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    ranks = world if args.ddp else 1
    torch.manual_seed(args.seed + rank)  # under --ddp rank 0's initial weights are broadcast; crops differ
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    state_dir = args.state_dir or args.out
    data = Data(args, device)
    trainers = [Trainer(name, data.sampler(name, args.patch), args.batch, device, args.lr, not args.no_amp,
                        args.loss, ddp=ranks > 1) for name in names]
    for t in trainers:
        src = None
        for folder in (state_dir, args.resume):  # this machine's full state first
            src = src or (resume_path(folder, t.name) if folder else None)
        if src is not None:
            t.load(src)
        elif args.init_from and (args.init_from / f"{t.spec.name}.safetensors").is_file():
            t.init_from_weights(args.init_from)
        else:
            print(f"{t.name}: starts fresh")
        follow_schedule(t, data, args)
    data.drop_unused(trainers)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    args.graphs = device.type == "cuda" and not args.no_graphs and ranks == 1
    capture(trainers, args)
    args.out.mkdir(parents=True, exist_ok=True)
    writes = rank == 0 or ranks == 1
    name = f"train_log.rank{rank}.csv" if "RANK" in os.environ and ranks == 1 else "train_log.csv"
    log = Log(args.out / name if writes else None, trainers, gpu + (f" x{ranks}" if ranks > 1 else ""), ranks)
    try:
        run(trainers, log, args, state_dir, data, ranks, writes)
    finally:
        if ranks > 1:
            dist.destroy_process_group()


def capture(trainers: list[Trainer], args) -> None:
    """A CUDA graph of each trainer's step that has none (with graphs on)."""
    todo = [t for t in trainers if t.graph is None] if args.graphs else []
    if todo:
        t0 = time.perf_counter()
        for t in todo:
            t.capture()
        print(f"captured {len(todo)} CUDA graphs in {time.perf_counter() - t0:.1f} s", flush=True)


def lr_scale(elapsed: float, args) -> float:
    """1 until the final decay starts, then a half cosine down to 0.05."""
    if args.final_decay <= 0 or not math.isfinite(args.time_limit):
        return 1.0
    start = (1 - args.final_decay) * args.time_limit
    if elapsed <= start:
        return 1.0
    frac = min(1.0, (elapsed - start) / (args.final_decay * args.time_limit))
    return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac))


# steps between the --ddp ranks' agreements on stopping and the LR (one small all_reduce and host read)
AGREE_EVERY = 20


def run(trainers: list[Trainer], log: Log, args, state_dir: Path, data: Data | None = None, ranks: int = 1,
        writes: bool = True) -> None:
    """Train until the time limit, the step goal or SIGTERM/SIGINT; checkpoint on the way and at the end."""
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(True))
    if trainers[0].x.device.type == "cuda":
        torch.cuda.synchronize()  # the model streams start after everything loading and capture queued
    if ranks > 1:
        dist.barrier()  # the ranks' clocks start together
    t0 = last_ckpt = time.perf_counter()
    clock = Clock(t0, ranks, trainers[0].x.device)
    while not clock.should_stop(stop, trainers, args):
        scale = lr_scale(clock.elapsed, args)
        for t in trainers:
            with model_stream(t, args):
                log.add(t, t.train_step(scale))
                if t.step % args.log_every == 0 and not t.check_finite(log.row(t, time.perf_counter() - t0)):
                    print(f"{t.name}: non-finite loss at step {t.step}; rolled back to the last finite state",
                          flush=True)
        if data is not None and any([follow_schedule(t, data, args) for t in trainers]):
            data.drop_unused(trainers)
            capture(trainers, args)
        if writes and time.perf_counter() - last_ckpt >= args.checkpoint_every:
            checkpoint(trainers, log, args, state_dir, time.perf_counter() - t0)
            last_ckpt = time.perf_counter()
    if writes:
        checkpoint(trainers, log, args, state_dir, time.perf_counter() - t0)
    for t in trainers:
        print(f"{t.name}: {t.step} steps")
    print(f"trained {time.perf_counter() - t0:.0f} s this run; checkpoints in {args.out}", flush=True)


class Clock:
    """The run's elapsed time, which the LR schedule and the time limit read, and the decision to stop.

    Under --ddp every rank must take the same optimiser steps (DDP averages gradients, not parameters):
    the ranks agree every AGREE_EVERY rounds on the elapsed time (the largest of theirs) and on stopping
    (any rank's SIGTERM, SIGINT or time limit), and use the agreed time until the next agreement.  The step
    goal is the same on every rank and needs no agreement."""

    def __init__(self, t0: float, ranks: int, device):
        self.t0, self.ranks, self.device, self.rounds = t0, ranks, device, 0
        self.elapsed = 0.0

    def should_stop(self, stop: list, trainers: list[Trainer], args) -> bool:
        self.rounds += 1
        if min(t.step for t in trainers) >= args.steps:
            return True
        if self.ranks == 1:
            self.elapsed = time.perf_counter() - self.t0
            return bool(stop) or self.elapsed >= args.time_limit
        if (self.rounds - 1) % AGREE_EVERY:
            return False
        mine = torch.tensor([float(bool(stop)), time.perf_counter() - self.t0], dtype=torch.float64, device=self.device)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
        stopped, self.elapsed = mine.tolist()
        return stopped > 0 or self.elapsed >= args.time_limit


def model_stream(t: Trainer, args):
    """The context a model's step runs in: its own CUDA stream unless --one-stream (or on the CPU, or under --ddp)."""
    if t.stream is None or args.one_stream:
        return contextlib.nullcontext()
    return torch.cuda.stream(t.stream)


def checkpoint(trainers: list[Trainer], log: Log, args, state_dir: Path, elapsed: float) -> None:
    if trainers[0].x.device.type == "cuda":
        torch.cuda.synchronize()
    for t in trainers:
        t.save(args.out, state_dir, elapsed, args.note)
    log.flush()
    print(f"{elapsed:7.1f}s  checkpoint: " + ", ".join(f"{t.name} {t.step}" for t in trainers), flush=True)


if __name__ == "__main__":
    main()
