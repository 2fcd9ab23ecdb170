"""More training images for the lossy models, from public image repositories given as git directories.

    python tools/prepare_training_data.py --imagenet GITDIR --bsds GITDIR --cxnet GITDIR \
        --train-data DATA --eval DATA/eval --out OUT [--scale 0.75] [--xray-max-side 1024] [--min-side 128] \
        [--chunk-mb 22]

Each source is read from a git directory (no work tree needed: the blobs of HEAD) by its layout:

  --imagenet  EliSchwartz/imagenet-sample-images: one JPEG per ImageNet class  -> rgb/inet_<name>.webp
  --bsds      BIDS/BSDS500: BSDS500/data/images/{train,val,test}/<id>.jpg       -> rgb/bsds_<id>.webp
  --cxnet     armiro/COVID-CXNet: chest_xray_images/covid19/*, metadata.csv     -> gray/xr_cxnet_<name>.png

and OUT/train3 is written in the layout tools/train.py reads: rgb/chunk_NN/*.webp (lossless WebP)
and gray/chunk_NN/*.png (8-bit), every chunk at most --chunk-mb MB (so that one chunk travels in one
GPU job) and holding every source of its kind in proportion; OUT/train3/manifest.json lists the
settings, each source's repository and commit, every image kept (file, source path and blob, sizes,
its nearest evaluation image) and every image dropped with its reason.  OUT/train3 appears whole or
not at all (it is built under a temporary name and renamed); an existing one is never touched.

Photos (JPEGs) are downscaled by --scale with cv2.INTER_AREA (an area average, antialiased).  X-rays
become 8-bit gray (colour files, which carry annotations, by BT.601 luminance; 16-bit ones stretched
over their own range) at native size, or downscaled by INTER_AREA to a longest side of
--xray-max-side where larger.  The X-rays' prefix ``xr_`` puts them in train.py's ``xray`` group.

Images are dropped by the first rule that applies, in this order:
  cbsd68          a BSDS image whose id --train-data holds already as bsd68_<id> (CBSD68)
  eval_source     an X-ray whose metadata row mentions --eval-source (the evaluation X-rays' source),
                  or any X-ray of a patient such a row names
  absent          the blob is not in the git directory (a large file left out of the copy)
  lfs_pointer     the blob is a Git LFS pointer, not the image
  undecodable     OpenCV cannot decode it
  too_small       its shorter side, resized, is under --min-side (a thumbnail: train.py would mirror-pad
                  it to the crop size, and the crops would be mostly mirror images)
  eval_duplicate  a near-duplicate of an image under --eval (any of its four rotations)
  in_training     a near-duplicate of an image under --train-data's train/ and train2/
  duplicate       a near-duplicate of an image of these sources kept before it
Near-duplicate: perceptual hashes within --hash-distance bits (48 of 255).  The hash: the signs
against their median of the 255 lowest-frequency DCT coefficients (a 16x16 block less DC) of a 64x64
area-averaged gray thumbnail.  Among COVID-CXNet's X-rays, copies differed by at most 10 bits,
re-cropped or annotated copies by 20 to 46, and the closest distinct X-rays by 58 or more; the common
8x8 hash (63 bits) cannot tell chest X-rays apart (different patients came within 6 bits).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import re
import shutil
import subprocess
import tempfile
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

from visemz.errors import InvalidArgumentError, VisemzError
from visemz.io.writers import write_atomic

REPOSITORIES = {"imagenet": "EliSchwartz/imagenet-sample-images", "bsds": "BIDS/BSDS500",
                "cxnet": "armiro/COVID-CXNet"}
PHOTO_EXT = (".jpg", ".jpeg")
XRAY_EXT = (".jpg", ".jpeg", ".jfif", ".png", ".webp", ".bmp", ".tif", ".tiff")
READ_EXT = (".png", ".webp", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp")
LFS_MAGIC = b"version https://git-lfs.github.com/spec/"
WEBP_LOSSLESS = [cv2.IMWRITE_WEBP_QUALITY, 101]  # OpenCV writes lossless WebP above quality 100
PNG_SMALLEST = [cv2.IMWRITE_PNG_COMPRESSION, 9]


# ------------------------------------------------------------------------------------ git sources
class GitTree:
    """The files of a git directory's HEAD, read without a work tree (``git cat-file --batch``)."""

    def __init__(self, git_dir: Path):
        self.git_dir = Path(git_dir)
        try:
            self.commit = self._git("rev-parse", "--verify", "HEAD^{commit}").strip()
        except InvalidArgumentError:
            raise InvalidArgumentError(f"{str(git_dir)!r} is not a git directory with a commit") from None
        self._batch = None

    def _git(self, *args: str) -> str:
        run = subprocess.run(["git", "--git-dir", str(self.git_dir), *args], capture_output=True, text=True)
        if run.returncode != 0:
            raise InvalidArgumentError(f"git {' '.join(args)} in {str(self.git_dir)!r}: {run.stderr.strip()}")
        return run.stdout

    def files(self, folder: str = "") -> list[tuple[str, str, bool]]:
        """(path, blob id, present) of every file under ``folder`` (all by default); git lists a blob
        that the directory lacks with the size BAD."""
        out = []
        for line in self._git("ls-tree", "-r", "-l", "-z", "HEAD", *(["--", folder] if folder else [])).split("\0"):
            if line:
                info, path = line.split("\t", 1)
                _, kind, blob, size = info.split()
                if kind == "blob":
                    out.append((path, blob, size != "BAD"))
        return sorted(out)

    def read(self, blob: str) -> bytes | None:
        """A blob's bytes, or None where the git directory lacks it."""
        if self._batch is None:
            self._batch = subprocess.Popen(["git", "--git-dir", str(self.git_dir), "cat-file", "--batch"],
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._batch.stdin.write(blob.encode() + b"\n")
        self._batch.stdin.flush()
        header = self._batch.stdout.readline().split()
        if len(header) < 3 or header[1] != b"blob":
            return None  # "<id> missing"
        data = self._batch.stdout.read(int(header[2]))
        self._batch.stdout.read(1)  # the newline after the contents
        return data

    def close(self) -> None:
        if self._batch is not None:
            self._batch.stdin.close()
            self._batch.wait()
            self._batch = None


@dataclass
class Candidate:
    """One source file that may become a training image."""
    source: str
    path: str
    blob: str
    present: bool
    kind: str  # "rgb" or "gray"
    name: str  # output file name
    patient: str = ""
    drop: tuple[str, str] | None = None  # (reason, detail)
    info: dict = field(default_factory=dict)


def safe_stem(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "-", text)


def imagenet_candidates(tree: GitTree) -> list[Candidate]:
    return [Candidate("imagenet", p, b, ok, "rgb", f"inet_{safe_stem(Path(p).stem)}.webp")
            for p, b, ok in tree.files() if "/" not in p and p.lower().endswith(PHOTO_EXT)]


def bsds_candidates(tree: GitTree, cbsd68_ids: set[str]) -> list[Candidate]:
    out = []
    for p, b, ok in tree.files("BSDS500/data/images"):
        if p.lower().endswith(PHOTO_EXT):
            c = Candidate("bsds", p, b, ok, "rgb", f"bsds_{safe_stem(Path(p).stem)}.webp")
            if Path(p).stem in cbsd68_ids:
                c.drop = ("cbsd68", f"train2 holds it as bsd68_{Path(p).stem}")
            out.append(c)
    return out


def cxnet_candidates(tree: GitTree, eval_source: str) -> list[Candidate]:
    """The X-rays, with their metadata row's patient; rows mentioning ``eval_source`` drop their
    file and every file of their patient."""
    rows = _metadata(tree)
    by_file = {r.get("filename", ""): r for r in rows}
    marked = [r for r in rows if eval_source and any(eval_source.lower() in (v or "").lower() for v in r.values())]
    patients = {r.get("patient_id", "") for r in marked} - {""}
    out = []
    for p, b, ok in tree.files("chest_xray_images/covid19"):
        if not p.lower().endswith(XRAY_EXT):
            continue
        row = by_file.get(Path(p).name, {})
        c = Candidate("cxnet", p, b, ok, "gray", f"xr_cxnet_{safe_stem(Path(p).stem)}.png",
                      patient=row.get("patient_id", ""))
        if row in marked:
            c.drop = ("eval_source", f"its metadata row mentions {eval_source!r}")
        elif c.patient in patients:
            c.drop = ("eval_source", f"patient {c.patient} has an image whose row mentions {eval_source!r}")
        out.append(c)
    return out


def _metadata(tree: GitTree) -> list[dict]:
    listed = {p: b for p, b, ok in tree.files("metadata.csv") if ok}
    if "metadata.csv" not in listed:
        raise InvalidArgumentError(f"{str(tree.git_dir)!r} has no metadata.csv (expected COVID-CXNet's layout)")
    text = tree.read(listed["metadata.csv"]).decode("utf-8-sig")
    return list(csv.DictReader(io.StringIO(text)))


def unique_names(cands: list[Candidate]) -> None:
    """Output names made unique where two sources' names coincide after sanitising (a counter added)."""
    seen: set[str] = set()
    for c in cands:
        stem, ext = c.name.rsplit(".", 1)
        name, k = c.name, 2
        while name in seen:
            name, k = f"{stem}_{k}.{ext}", k + 1
        seen.add(name)
        c.name = name


# ------------------------------------------------------------------------------------------ hashes
def perceptual_hash(gray: np.ndarray) -> np.ndarray:
    """255 bits: the 16x16 lowest DCT coefficients but DC of a 64x64 area-averaged thumbnail, above
    their median (pHash with a larger block than the usual 8x8)."""
    thumb = cv2.resize(gray.astype(np.float32), (64, 64), interpolation=cv2.INTER_AREA)
    coeffs = cv2.dct(thumb)[:16, :16].ravel()[1:]
    return coeffs > np.median(coeffs)


def distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamming distances between the rows of two bit matrices."""
    a, b = a.astype(np.float32), b.astype(np.float32)
    return np.rint(a @ (1 - b).T + (1 - a) @ b.T).astype(np.int32)


def folder_hashes(files: list[Path], root: Path, rotations: bool) -> tuple[list[str], np.ndarray]:
    """Hashes of image files (and of their 90/180/270-degree rotations), named relative to root."""
    names, bits = [], []
    with ThreadPoolExecutor(2) as pool:
        for f, img in zip(files, pool.map(lambda f: cv2.imread(str(f), cv2.IMREAD_GRAYSCALE), files)):
            if img is None:
                raise InvalidArgumentError(f"cannot read the image {str(f)!r}")
            for k in range(4 if rotations else 1):
                names.append(f.relative_to(root).as_posix())
                bits.append(perceptual_hash(np.rot90(img, k)))
    return names, np.array(bits, bool).reshape(-1, 255)


def image_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in READ_EXT
                  and not p.name.startswith("."))


# ---------------------------------------------------------------------------------------- pixels
def decode(data: bytes, kind: str) -> tuple[np.ndarray | None, str]:
    """A file's pixels as 8-bit BGR (rgb) or 8-bit gray, and how it was converted."""
    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    if img is None:
        return None, ""
    note = []
    if img.dtype == np.uint16:
        lo, hi = int(img.min()), int(img.max())
        img = ((img.astype(np.float64) - lo) * (255.0 / max(hi - lo, 1))).round().astype(np.uint8)
        note.append("16-bit stretched")
    elif img.dtype != np.uint8:
        return None, ""
    channels = 1 if img.ndim == 2 else img.shape[2]
    if channels not in (1, 3, 4):
        return None, ""
    to = {("gray", 3): cv2.COLOR_BGR2GRAY, ("gray", 4): cv2.COLOR_BGRA2GRAY,
          ("rgb", 1): cv2.COLOR_GRAY2BGR, ("rgb", 4): cv2.COLOR_BGRA2BGR}.get((kind, channels))
    if to is not None:
        img = cv2.cvtColor(img, to)
        note.append(f"{channels} channels to {kind}")
    return img, ", ".join(note)


def resize_for_training(img: np.ndarray, kind: str, scale: float, max_side: int) -> np.ndarray:
    """Photos scaled by ``scale``; gray X-rays kept, or reduced to a longest side of ``max_side``."""
    h, w = img.shape[:2]
    f = scale if kind == "rgb" else min(1.0, max_side / max(h, w))
    if f == 1.0:
        return img
    size = (max(1, round(w * f)), max(1, round(h * f)))
    return cv2.resize(img, size, interpolation=cv2.INTER_AREA)


def encode(img: np.ndarray, kind: str) -> bytes:
    ok, buf = cv2.imencode(".webp" if kind == "rgb" else ".png", img, WEBP_LOSSLESS if kind == "rgb" else PNG_SMALLEST)
    if not ok:
        raise InvalidArgumentError(f"OpenCV could not encode a {img.shape} image")
    return buf.tobytes()


def prepare(c: Candidate, data: bytes | None, staging: Path, args) -> np.ndarray | None:
    """Decode, hash, resize and write one candidate to staging; its hash, or None with c.drop set."""
    if data is None:
        c.drop = ("absent", "the git directory lacks this blob")
        return None
    if data.startswith(LFS_MAGIC):
        c.drop = ("lfs_pointer", "a Git LFS pointer, not the image")
        return None
    img, note = decode(data, c.kind)
    if img is None:
        c.drop = ("undecodable", "OpenCV cannot decode it as an 8- or 16-bit image")
        return None
    out = resize_for_training(img, c.kind, args.scale, args.xray_max_side)
    if min(out.shape[:2]) < args.min_side:
        c.drop = ("too_small", f"{out.shape[1]}x{out.shape[0]} resized, under --min-side {args.min_side}")
        return None
    bits = perceptual_hash(img if img.ndim == 2 else cv2.cvtColor(img, cv2.COLOR_BGR2GRAY))
    blob = encode(out, c.kind)
    (staging / c.kind / c.name).write_bytes(blob)
    c.info = {"from_size": [img.shape[1], img.shape[0]], "size": [out.shape[1], out.shape[0]], "bytes": len(blob)}
    if note:
        c.info["converted"] = note
    return bits


def prepare_all(trees: dict[str, GitTree], cands: list[Candidate], staging: Path, args) -> dict[int, np.ndarray]:
    """Every candidate not dropped yet, prepared on --workers threads (OpenCV releases the GIL); the
    blobs are read in this thread, a bounded number ahead."""
    hashes: dict[int, np.ndarray] = {}
    todo = [i for i, c in enumerate(cands) if c.drop is None]
    with ThreadPoolExecutor(args.workers) as pool:
        pending: deque = deque()
        for i in todo:
            c = cands[i]
            data = trees[c.source].read(c.blob) if c.present else None
            pending.append((i, pool.submit(prepare, c, data, staging, args)))
            while len(pending) > 4 * args.workers:
                _collect(pending.popleft(), hashes)
        while pending:
            _collect(pending.popleft(), hashes)
    return hashes


def _collect(item, hashes: dict[int, np.ndarray]) -> None:
    i, future = item
    bits = future.result()
    if bits is not None:
        hashes[i] = bits


# ------------------------------------------------------------------------------------ duplicates
def drop_near_duplicates(cands: list[Candidate], hashes: dict[int, np.ndarray], eval_ref, train_ref,
                         limit: int) -> None:
    """Apply eval_duplicate, in_training and duplicate (in that order) to the prepared candidates;
    record each kept one's nearest evaluation image."""
    idx = sorted(hashes)
    if not idx:
        return
    bits = np.array([hashes[i] for i in idx])
    eval_names, eval_bits = eval_ref
    d_eval = distances(bits, eval_bits)
    d_train = distances(bits, train_ref[1]) if len(train_ref[1]) else np.full((len(idx), 1), 10**6)
    d_self = distances(bits, bits)
    kept: list[int] = []
    for row, i in enumerate(idx):
        c, near = cands[i], int(np.argmin(d_eval[row]))
        c.info["nearest_eval"] = {"image": eval_names[near], "distance": int(d_eval[row, near])}
        t = int(np.argmin(d_train[row]))
        twins = [kept[k] for k in np.flatnonzero(d_self[row, kept] <= limit)]
        if d_eval[row, near] <= limit:
            c.drop = ("eval_duplicate", f"{eval_names[near]} within {d_eval[row, near]} bits")
        elif d_train[row, t] <= limit:
            c.drop = ("in_training", f"{train_ref[0][t]} within {d_train[row, t]} bits")
        elif twins:
            c.drop = ("duplicate", f"{cands[idx[twins[0]]].name} within {d_self[row, twins[0]]} bits")
        else:
            kept.append(row)


# -------------------------------------------------------------------------------------- chunking
def assign_chunks(sizes: list[int], sources: list[str], limit: int) -> list[int]:
    """A chunk number per item: the fewest chunks of at most ``limit`` bytes that a greedy fill
    finds, each source dealt out over all of them (largest first, to the emptiest chunk)."""
    if not sizes:
        return []
    too_big = max(sizes)
    if too_big > limit:
        raise InvalidArgumentError(f"an image of {too_big} bytes exceeds the chunk limit of {limit} bytes")
    n = max(1, math.ceil(sum(sizes) / limit))
    while True:
        fill, chunk = [0] * n, [0] * len(sizes)
        for src in sorted(set(sources)):
            for i in sorted((i for i in range(len(sizes)) if sources[i] == src), key=lambda i: -sizes[i]):
                k = min(range(n), key=lambda j: (fill[j], j))
                chunk[i], fill[k] = k, fill[k] + sizes[i]
        if max(fill) <= limit:
            return chunk
        n += 1


def place_in_chunks(cands: list[Candidate], staging: Path, limit: int) -> dict[str, dict]:
    """Move the kept images from staging/<kind>/ into staging/train3/<kind>/chunk_NN/; per chunk its
    image count and bytes."""
    report = {}
    for kind in ("rgb", "gray"):
        kept = [c for c in cands if c.drop is None and c.kind == kind]
        for c, k in zip(kept, assign_chunks([c.info["bytes"] for c in kept], [c.source for c in kept], limit)):
            folder = f"{kind}/chunk_{k:02d}"
            (staging / "train3" / folder).mkdir(parents=True, exist_ok=True)
            os.replace(staging / kind / c.name, staging / "train3" / folder / c.name)
            c.info["file"] = f"{folder}/{c.name}"
            entry = report.setdefault(folder, {"images": 0, "bytes": 0})
            entry["images"] += 1
            entry["bytes"] += c.info["bytes"]
    return dict(sorted(report.items()))


# -------------------------------------------------------------------------------------- manifest
def manifest(cands: list[Candidate], trees: dict[str, GitTree], chunks: dict, args) -> dict:
    sources = {}
    for name, tree in trees.items():
        mine = [c for c in cands if c.source == name]
        reasons: dict[str, int] = {}
        for c in mine:
            if c.drop:
                reasons[c.drop[0]] = reasons.get(c.drop[0], 0) + 1
        sources[name] = {"repository": REPOSITORIES[name], "commit": tree.commit, "files": len(mine),
                         "kept": sum(c.drop is None for c in mine), "dropped": dict(sorted(reasons.items()))}
    kept = [dict(c.info, source=c.source, path=c.path, blob=c.blob, **({"patient": c.patient} if c.patient else {}))
            for c in cands if c.drop is None]
    dropped = [{"source": c.source, "path": c.path, "blob": c.blob, "reason": c.drop[0], "detail": c.drop[1],
                **({"nearest_eval": c.info["nearest_eval"]} if "nearest_eval" in c.info else {})}
               for c in cands if c.drop is not None]
    settings = {"scale": args.scale, "photo_filter": "cv2.INTER_AREA", "xray_max_side": args.xray_max_side,
                "min_side": args.min_side, "chunk_bytes": chunk_limit(args),
                "hash": "255-bit DCT hash of a 64x64 gray thumbnail", "hash_distance": args.hash_distance,
                "eval_source": args.eval_source}
    return {"settings": settings, "sources": sources, "chunks": chunks, "kept": kept, "dropped": dropped}


def chunk_limit(args) -> int:
    return int(args.chunk_mb * 1_000_000)


# ------------------------------------------------------------------------------------------ main
def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--imagenet", type=Path, required=True, help="git directory of EliSchwartz/imagenet-sample-images")
    ap.add_argument("--bsds", type=Path, required=True, help="git directory of BIDS/BSDS500")
    ap.add_argument("--cxnet", type=Path, required=True, help="git directory of armiro/COVID-CXNet")
    ap.add_argument("--train-data", type=Path, required=True,
                    help="the current training data (train/, train2/): CBSD68 ids and images already trained on")
    ap.add_argument("--eval", type=Path, required=True, help="the evaluation images (e.g. DATA/eval): kept out")
    ap.add_argument("--out", type=Path, required=True, help="OUT/train3 is written (it must not exist)")
    ap.add_argument("--scale", type=float, default=0.75, help="photos' downscaling factor")
    ap.add_argument("--xray-max-side", type=int, default=1024, help="X-rays larger than this are reduced to it")
    ap.add_argument("--min-side", type=int, default=128,
                    help="images whose shorter side, resized, is smaller are dropped")
    ap.add_argument("--chunk-mb", type=float, default=22.0, help="largest chunk, in MB (10^6 bytes)")
    ap.add_argument("--hash-distance", type=int, default=48, help="near-duplicate: hashes within this many of 255 bits")
    ap.add_argument("--eval-source", default="actualmed",
                    help="text in an X-ray's metadata row that marks the evaluation X-rays' source ('': none)")
    ap.add_argument("--workers", type=int, default=2)
    return ap.parse_args(argv)


def check_args(args) -> None:
    """Every argument checked before any work."""
    if not 0.05 <= args.scale <= 1.0:
        raise InvalidArgumentError(f"--scale {args.scale}: expected a factor in [0.05, 1]")
    if args.xray_max_side < 64:
        raise InvalidArgumentError(f"--xray-max-side {args.xray_max_side}: expected at least 64")
    if args.min_side < 0:
        raise InvalidArgumentError(f"--min-side {args.min_side}: expected 0 or more pixels")
    if not args.chunk_mb > 0:
        raise InvalidArgumentError(f"--chunk-mb {args.chunk_mb}: expected a positive size")
    if not 0 <= args.hash_distance < 128:
        raise InvalidArgumentError(f"--hash-distance {args.hash_distance}: expected 0..127 of 255 bits")
    if args.workers < 1:
        raise InvalidArgumentError(f"--workers {args.workers}: expected at least 1")
    for flag, folder in (("--train-data", args.train_data), ("--eval", args.eval)):
        if not folder.is_dir():
            raise InvalidArgumentError(f"{flag} {str(folder)!r} is not a folder")
    if not image_files(args.eval):
        raise InvalidArgumentError(f"--eval {str(args.eval)!r} holds no images")
    if (args.out / "train3").exists():
        raise InvalidArgumentError(f"{str(args.out / 'train3')!r} exists already: give another --out")


def training_files(data: Path) -> list[Path]:
    return [f for sub in ("train/rgb", "train/gray", "train2/rgb", "train2/gray") for f in image_files(data / sub)]


def cbsd68_ids(data: Path) -> set[str]:
    return {f.stem[len("bsd68_"):] for f in image_files(data / "train2" / "rgb") if f.stem.startswith("bsd68_")}


def run(args) -> dict:
    """Build OUT/train3; returns its manifest."""
    check_args(args)
    trees = {name: GitTree(getattr(args, name)) for name in REPOSITORIES}
    try:
        cands = (imagenet_candidates(trees["imagenet"]) + bsds_candidates(trees["bsds"], cbsd68_ids(args.train_data))
                 + cxnet_candidates(trees["cxnet"], args.eval_source))
        for name in REPOSITORIES:
            if not any(c.source == name for c in cands):
                raise InvalidArgumentError(f"--{name} {str(getattr(args, name))!r} holds none of the expected "
                                           f"images (is it {REPOSITORIES[name]}?)")
        unique_names(cands)
        eval_ref = folder_hashes(image_files(args.eval), args.eval, rotations=True)
        train_ref = folder_hashes(training_files(args.train_data), args.train_data, rotations=False)
        args.out.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".train3-partial-", dir=args.out))
        try:
            for kind in ("rgb", "gray"):
                (staging / kind).mkdir()
            hashes = prepare_all(trees, cands, staging, args)
            drop_near_duplicates(cands, hashes, eval_ref, train_ref, args.hash_distance)
            chunks = place_in_chunks(cands, staging, chunk_limit(args))
            result = manifest(cands, trees, chunks, args)
            write_atomic(staging / "train3" / "manifest.json", (json.dumps(result, indent=1) + "\n").encode())
            os.rename(staging / "train3", args.out / "train3")
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # our own temporary folder, whatever happened
    finally:
        for tree in trees.values():
            tree.close()
    return result


def summary(result: dict) -> str:
    lines = []
    for name, s in result["sources"].items():
        lines.append(f"{name} ({s['repository']} {s['commit'][:12]}): {s['files']} files, {s['kept']} kept, "
                     f"dropped {s['dropped'] or 'none'}")
    for folder, c in result["chunks"].items():
        lines.append(f"  {folder}: {c['images']} images, {c['bytes'] / 1e6:.1f} MB")
    return "\n".join(lines)


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        result = run(args)
    except VisemzError as e:
        raise SystemExit(f"prepare_training_data: {e}") from None
    print(summary(result))


if __name__ == "__main__":
    main()
