"""Write the format fixtures that tests/test_format_fixtures.py checks: small encoded files with their inputs.

    python tools/make_format_fixtures.py [--out tests/fixtures]

One fixture per stream kind and format version, as the current code writes it: block streams
(both policies, with and without bitshuffle, one empty), ints streams (entropy none and zstd),
.vsz image files (each residual mode, each model; format 7 where the channel-context weights are
installed), a pages file, the error-bound residual on
its own (model-free inputs), the collectives' float codecs (error-bounded and lossless, fp32,
fp16, bf16), and the numcodecs float chunks (their shape header around those codecs).  Existing
fixtures are never rewritten: a fixture is a file some user already has.  When a format's version
changes, this script adds fixtures named with the new version beside the old ones (the test demands
one for every current version), and the old ones keep being decoded.

Image fixtures are written with whatever weights are installed, and store the image, each section's
integers and the reconstruction the writing install decoded.  The test decodes them to pixels (with
the weights the file names: installed ones or the archive, ``visemz/models/weights/archive/``; when
weights are updated, the old file goes into the archive under its id) and holds the result to the
file's promise and to that reconstruction.
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import cv2
import numpy as np
import torch
import zstandard
from skimage import data

import visemz
from visemz import container, defaults
from visemz.device import as_numpy
from visemz.encoders import decode_ints, encode_ints, reference, stream
from visemz.encoders import layout as L
from visemz.encoders import rans_layout as RL
from visemz.floats import ErrorBounded, Lossless
from visemz.floats.lossless import LL_VERSION
from visemz.floats.prediction import PREDICTORS
from visemz.image import codec as image_codec
from visemz.image import differences, latents, pages, residual, residual_coder, tile_index
from visemz.image.pixels import ImageMeta
from visemz.io.writers import write_atomic
from visemz.models import all_specs, parse
from visemz.models import weights as W

MANIFEST = "fixtures.json"
ROOT = Path(__file__).resolve().parents[1]


def _ints(n: int, seed: int) -> np.ndarray:
    """Sparse latents with every outlier width and the int32 extremes: all of a block stream's parts."""
    rng = np.random.default_rng(seed)
    v = np.round(rng.laplace(0.0, 0.6, n)).astype(np.int64)
    spots = rng.choice(n, 40, replace=False)
    v[spots] = rng.choice([300, -70000, 2**24 + 5, -(2**31), 2**31 - 1, 129, -3000], 40)
    return v.astype(np.int32)


def _npz(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return buf.getvalue()


class Writer:
    """Adds fixtures to a folder and its manifest; an existing fixture is left as it is."""

    def __init__(self, out: Path):
        self.out = out
        path = out / MANIFEST
        self.manifest = json.loads(path.read_text()) if path.is_file() else {"fixtures": []}
        self.known = {f["name"] for f in self.manifest["fixtures"]}
        self.added: list[str] = []

    def add(self, name: str, kind: str, version: int, encoded: bytes, suffix: str, inputs: dict, **settings) -> None:
        if name in self.known:
            return
        write_atomic(self.out / f"{name}{suffix}", encoded)
        write_atomic(self.out / f"{name}.npz", _npz(**inputs))
        self.manifest["fixtures"].append({"name": name, "kind": kind, "version": version, "file": f"{name}{suffix}",
                                          "inputs": f"{name}.npz", "settings": settings})
        self.known.add(name)
        self.added.append(name)

    def save(self) -> None:
        self.manifest["written_with"] = {"zstandard": zstandard.__version__, "zstd_level": defaults.get("zstd_level"),
                                         "entropy_chunk": defaults.get("entropy_chunk")}
        self.manifest["fixtures"].sort(key=lambda f: f["name"])
        write_atomic(self.out / MANIFEST, (json.dumps(self.manifest, indent=1) + "\n").encode())


def block_streams(w: Writer) -> None:
    for policy in L.POLICIES:
        for bitshuffle in (True, False):
            v = _ints(8200, seed=len(w.added))  # two tiles: the tile table has two entries
            raw = reference.encode(v, L.POLICIES[policy], bitshuffle)
            name = f"block-v{L.VERSION}-{policy}-{'bitshuffle' if bitshuffle else 'plain'}"
            w.add(name, "block", L.VERSION, raw, ".bin", {"values": v}, policy=policy, bitshuffle=bitshuffle)
        empty = np.zeros(0, np.int32)
        w.add(f"block-v{L.VERSION}-{policy}-empty", "block", L.VERSION,
              reference.encode(empty, L.POLICIES[policy], True),
              ".bin", {"values": empty}, policy=policy, bitshuffle=True)


def ints_streams(w: Writer) -> None:
    for entropy, policy in (("none", "global"), ("zstd", "global"), ("zstd", "block")):
        v = _ints(3000, seed=100 + len(w.added))
        buf = encode_ints(v, policy=policy, entropy=entropy)
        w.add(f"ints-v{stream.VERSION}-{entropy}-{policy}", "ints", stream.VERSION, buf, ".bin", {"values": v},
              policy=policy, bitshuffle=True, entropy=entropy)


def smooth_image(dtype: str, shape: tuple, seed: int) -> np.ndarray:
    """A smooth pattern plus seeded noise, of any dtype the codec takes: the fixtures' images (also the seeds
    the fuzzer mutates)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[: shape[0], : shape[1]]
    smooth = np.sin(xx / 5.0) * np.cos(yy / 7.0)
    if len(shape) == 3:
        smooth = np.stack([smooth * (c + 1) / shape[2] for c in range(shape[2])], -1)
    if dtype == "uint8":
        return np.clip(128 + 90 * smooth + rng.normal(0, 8, shape), 0, 255).astype(np.uint8)
    if dtype == "uint16":
        return np.clip(2000 + 1500 * smooth + rng.normal(0, 60, shape), 0, 65535).astype(np.uint16)
    return (3.0 * smooth + rng.normal(0, 0.2, shape)).astype(np.float32)


def _sections(buf: bytes, prefix: str = "") -> dict:
    """Each section of an image container as its integers, what the fixture holds it to: ints streams
    decoded (an empty section as no values); format 3's rANS symbol sections as the symbols the
    current weights' tables decode them to (the test checks those streams' layout only: decoding
    them needs the very weights, which change)."""
    c = container.unpack(buf)
    if c.meta["format"] in image_codec.TILED_FORMATS:
        return _tile_sections(buf, c, prefix)
    rans = latents.rans_sections(c.meta)
    symbols = image_codec.ImageCodec("cpu").decode_symbols(buf) if rans else {}
    return {f"{prefix}section_{k}": symbols[k].numpy().reshape(-1) if k in rans
            else decode_ints(v) if len(v) else np.zeros(0, np.int32) for k, v in c.sections.items()}


def _tile_sections(buf: bytes, c: container.Container, prefix: str) -> dict:
    """A tiled image's parts, per tile, as ``_sections`` holds a section (``{prefix}tile{i}_section_{part}``)."""
    t = c.meta["tiles"]
    grid, symbols = image_codec.ImageCodec("cpu").decode_tile_symbols(buf)
    index = tile_index.TileIndex(c.sections, grid.count, t["parts"], t["symbols"], c.meta["format"])
    out = {}
    for i in range(grid.count):
        coding, held = index.coding(i), _by_section(symbols[i], c.meta["model"])
        for name in t["parts"]:
            body = index.part(i, name)
            out[f"{prefix}tile{i}_section_{name}"] = held[name].numpy().reshape(-1) if coding.get(name) == "rans" \
                else _pass_symbols(body) if name in residual_coder.STEP_SECTIONS or name == differences.DIFFS \
                else residual_coder.unpack_scales(body) if name == residual_coder.SCALES \
                else decode_ints(body) if len(body) else np.zeros(0, np.int32)
    return out


def _pass_symbols(body) -> np.ndarray:
    """A learned residual's pass section (or its differences' stream) as the symbol count its conditional rANS stream
    declares (a pass's symbols need the residual prior's float64 distributions; the pixel decode checks them)."""
    return np.array([RL.parse(bytes(body), None, None).plan.n] if len(body) else [], np.int64)


def _by_section(symbols: dict, model: str) -> dict:
    """A tile's symbols by section name: a channel-context model's y as its slices ``y0``, ``y1``, ..."""
    spec = parse(model)
    if not spec.context:
        return symbols
    slices = torch.split(symbols["y"], spec.slices, 1)
    return {"z": symbols["z"], **{latents.slice_name(k): v for k, v in enumerate(slices)}}


def _container_suffix() -> str:
    """Image and page files are named by their container version too, from version 2 on (version 1 files
    were named before there was a second)."""
    return "" if container.VERSION == 1 else f"-c{container.VERSION}"


IMAGES = (  # (model, dtype, shape, max_error): no residual, each residual mode, both models, 1 and 3 channels
    ("balle2016", "uint8", (20, 30, 3), None),
    ("mbt2018-mean", "uint16", (24, 18), 3),
    ("balle2016", "float32", (16, 20), 0),
    ("mbt2018-mean", "float32", (16, 20, 2), 0.01),
    # the learned residual (format 6): gray lossless, near-lossless, and a sparse 16-bit tile through a palette
    ("mbt2018-mean", "uint8", (40, 52), 0),
    ("mbt2018-mean", "uint8", (40, 52), 2),
    ("mbt2018-mean", "uint16", (32, 40), 0),
    # from format 8, a tile whose scale calibration moves groups (the smaller ones above calibrate nothing)
    ("mbt2018-mean", "uint8", (64, 64), 1),
)


TILED_IMAGES = (  # (model, dtype, shape, max_error, tile): several tiles, edge tiles shorter
    ("mbt2018-mean", "uint16", (150, 70), 3, 64),
    ("balle2016", "uint8", (70, 130, 3), None, 64),
)


CONTEXT_IMAGES = (  # image format 7: (model, dtype, shape, max_error, tile); two tiles, and one with a residual
    ("minnen2020", "uint8", (60, 100, 3), None, 64),
    ("minnen2020", "uint16", (40, 30), 3, None),
)


INTEGER_IMAGES = (  # image format 9, on request: the learned residual under the integer prior (model, dtype, shape,
    # max_error, tile): gray lossless and near-lossless, a sparse 16-bit tile, a calibrated one, tiles, RGB
    ("mbt2018-mean", "uint8", (40, 52), 0, None),
    ("mbt2018-mean", "uint8", (40, 52), 2, None),
    ("mbt2018-mean", "uint16", (32, 40), 0, None),
    ("mbt2018-mean", "uint8", (64, 64), 1, None),
    ("mbt2018-mean", "uint16", (150, 70), 3, 64),
    ("mbt2018-mean", "uint8", (24, 30, 3), 0, None),
)
RESAMPLED_IMAGES = (  # from image format 10: a sparse 16-bit tile coded as its neighbours' differences
    ("mbt2018-mean", "uint16", (40, 48), 0, None),
)
SKIPPED_IMAGES = ("mbt2018-mean",)  # also written with skipped symbols (conditional rANS stream version 3)
SKIP_FREQ = 65531


def _rans_skip(freq: int):
    """Write conditional rANS sections with this skip threshold, whatever VISEMZ_RANS_SKIP_FREQ says."""
    return defaults.set(rans_skip_freq=freq)


def images(w: Writer) -> None:
    _write_images(w, [(*i, None) for i in IMAGES] + list(TILED_IMAGES))


def context_images(w: Writer) -> None:
    """Format 7, written when the channel-context model's weights are installed.  While none ship, they are
    written with the seeded weights tests/conftest.py gives such a model (``VISEMZ_WEIGHTS_DIR`` at a folder
    holding those beside links to the shipped files), which the pixel test decodes them with."""
    if not all(W.weights_path(s).is_file() for s in all_specs() if s.context):
        print("no weights of the channel-context models installed: no format 7 fixture written")
        return
    _write_images(w, list(CONTEXT_IMAGES))


def integer_images(w: Writer) -> None:
    """Format 9 (the integer residual prior), written on request beside the current format."""
    _write_images(w, list(INTEGER_IMAGES), image_codec.image_header.INTEGER)


def resampled_images(w: Writer) -> None:
    """Resampled stretched data, which the current format codes as differences (``image/differences.py``)."""
    _write_images(w, list(RESAMPLED_IMAGES), image_of=resampled_image, tag="-resampled")


def resampled_image(dtype: str, shape: tuple, seed: int) -> np.ndarray:
    """A photo stretched from 32 levels to 16 bits, then resampled to twice its size (linear): values on no lattice
    whose neighbours' differences take few values."""
    coarse = (data.camera()[100 + seed:100 + seed + shape[0], 150:150 + shape[1]] // 8).astype(np.float64) * 2113
    fine = cv2.resize(coarse, None, fx=2, fy=2, interpolation=cv2.INTER_LINEAR)
    return np.ascontiguousarray(fine[:shape[0], :shape[1]].round().astype(np.dtype(dtype)))


def _write_images(w: Writer, cases: list, image_format: int | None = None, image_of=None, tag: str = "") -> None:
    codec = image_codec.ImageCodec("cpu")
    for model, dtype, shape, e, tile in cases:
        img = (image_of or smooth_image)(dtype, shape, seed=len(shape))
        for skip in (0, SKIP_FREQ) if model in SKIPPED_IMAGES else (0,):
            with _rans_skip(skip):
                buf = codec.compress(img, model=model, quality=1, max_error=e, tile=tile, image_format=image_format)
            fmt = container.unpack(buf).meta["format"]
            name = f"image-v{fmt}-{model}-{dtype}-{'x'.join(map(str, shape))}{tag}-e{e}" \
                + (f"-tile{tile}" if tile else "") \
                + _container_suffix() + (f"-skip{skip}" if skip else "")
            decoded = visemz.decompress(buf, device="cpu")
            w.add(name, "image", fmt, buf, ".vsz", {"image": img, "decoded": decoded, **_sections(buf)}, model=model,
                  quality=1, max_error=e, container=container.VERSION, **({"tile": tile} if tile else {}),
                  **({"rans_skip_freq": skip} if skip else {}))


def page_stack(w: Writer) -> None:
    stack = np.stack([smooth_image("uint8", (20, 24), seed=k) for k in range(2)])
    buf = pages.encode(stack, lambda page: visemz.compress(page, model="balle2016", quality=1, max_error=1,
                                                           device="cpu"))
    page_arrays = {}
    for k, page in enumerate(pages.page_buffers(container.unpack(buf))):
        page_arrays.update(_sections(page, prefix=f"page{k}_"))
    w.add(f"pages-v{pages.FORMAT}-uint8-2x20x24-e1{_container_suffix()}", "pages", pages.FORMAT, buf, ".vsz",
          {"stack": stack, "decoded": visemz.decompress(buf, device="cpu"), **page_arrays},
          model="balle2016", quality=1, max_error=1, container=container.VERSION)


RESIDUALS = (("uint8", (12, 14, 3), 2), ("uint16", (20, 16), 0), ("float32", (16, 20), 0), ("float32", (16, 20), 0.05))


def residuals(w: Writer) -> None:
    """The error-bound residual of an image against a given float64 synthesis: no model involved."""
    for dtype, shape, e in RESIDUALS:
        img = smooth_image(dtype, shape, seed=7)
        t = torch.from_numpy(img)
        lo, hi = (0.0, 255.0) if dtype == "uint8" else (float(img.astype(np.float64).min()),
                                                        float(img.astype(np.float64).max()))
        meta = ImageMeta(dtype, shape, lo, hi)
        rng = np.random.default_rng(8)
        x01 = np.clip((img.astype(np.float64) - lo) / (hi - lo) + rng.normal(0, 0.02, shape), 0, 1)
        # rounding ties: the mask
        x01.reshape(-1)[::11] = (np.arange(x01[..., None].reshape(-1)[::11].size) % 255 + 0.5) / 255
        sections, mode = residual.encode(t, torch.from_numpy(x01), meta, e, entropy="none", bitshuffle=True)
        decoded = residual.decode(sections, torch.from_numpy(x01), meta, e, mode)
        decoded = as_numpy(decoded)
        name = f"residual-v{image_codec.FORMAT}-{mode}-{dtype}-e{e}"
        w.add(name, "residual", image_codec.FORMAT, _npz(**{k: np.frombuffer(v, np.uint8)
                                                            for k, v in sections.items()}),
              ".sections.npz", {"image": img, "x01_hat": x01, "decoded": decoded}, mode=mode, max_error=e,
              dtype=dtype, shape=list(shape), range=[lo, hi], entropy="none", bitshuffle=True)


def _float_input(dtype: torch.dtype, n: int) -> torch.Tensor:
    """A smooth field with noise, ties of the quantiser, and (for lossless) the special values."""
    g = torch.Generator().manual_seed(n)
    t = torch.linspace(0, 12, n, dtype=torch.float64)
    return (torch.sin(t) * 3 + 0.05 * torch.randn(n, generator=g, dtype=torch.float64)).to(dtype)


def _bits(x: torch.Tensor) -> np.ndarray:
    wide = x.element_size() == 4
    return x.view(torch.int32 if wide else torch.int16).numpy().view(np.uint32 if wide else np.uint16)


def float_codecs(w: Writer) -> None:
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        x = _float_input(dtype, 1000)
        for predictor in PREDICTORS:
            codec = ErrorBounded(1e-3, predictor)
            shape = [25, 40] if predictor == "lorenzo2d" else [1000]
            buf = codec.encode(x.reshape(shape))
            version = buf[4]  # the current version (version 1 was written without a predictor, named without one)
            suffix = "" if version == 1 else f"-{predictor}"
            w.add(f"eb-v{version}-{name}{suffix}", "eb", version, buf, ".bin",
                  {"bits": _bits(x), "decoded": codec.decode(buf)},
                  eb=1e-3, dtype=name, predictor=predictor, shape=shape, row=codec.prediction(shape).row)
        finfo = torch.finfo(dtype)
        special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), finfo.max, finfo.min, finfo.tiny,
                                finfo.tiny / 4], dtype=dtype)
        x = torch.cat([special, x, (torch.rand(300, generator=torch.Generator().manual_seed(1)) * 1e-30).to(dtype)])
        w.add(f"ll-v{LL_VERSION}-{name}", "ll", LL_VERSION, Lossless().encode(x),
              ".bin", {"bits": _bits(x)}, dtype=name)


def numcodecs_chunks(w: Writer) -> None:
    """The shape header of ``visemz_eb`` / ``visemz_lossless`` chunks around each codec's stream."""
    x = _float_input(torch.float32, 120).numpy().reshape(2, 3, 4, 5)
    from visemz import zarr_codecs  # here: numcodecs, which a GPU host may lack, only for these chunks

    v = zarr_codecs.SHAPE_VERSION
    eb = zarr_codecs.VisemzErrorBounded(1e-3)
    buf = eb.encode(x)
    w.add(f"nchunk-v{v}-eb-float32", "nchunk", v, buf, ".bin", {"array": x, "decoded": eb.decode(buf)},
          config=eb.get_config())
    x = x[0].astype(np.float16)
    ll = zarr_codecs.VisemzLossless()
    w.add(f"nchunk-v{v}-lossless-float16", "nchunk", v, ll.encode(x), ".bin", {"array": x, "decoded": x},
          config=ll.get_config())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    w = Writer(args.out)
    for part in (block_streams, ints_streams, images, context_images, integer_images, resampled_images, page_stack,
                 residuals,
                 float_codecs, numcodecs_chunks):
        part(w)
    w.save()
    print(f"{len(w.added)} fixtures added to {args.out}: {', '.join(w.added) or 'none'}")


if __name__ == "__main__":
    main()
