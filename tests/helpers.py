"""Shared inputs (images, integer arrays), crafted files, error measures, round-trip checks, optional packages and
CPU-GPU parity for the tests."""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import json
import math
import struct
import types
import weakref
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from skimage import data

from visemz import container, defaults
from visemz.device import as_numpy
from visemz.encoders import decode_ints, encode_ints
from visemz.framing import write_varints, xxh64
from visemz.image import codec as codec_module
from visemz.image import tile_index, tiling
from visemz.image.codec import ImageCodec

EDGE_SIZES = (0, 1, 31, 32, 33, 63, 64, 65, 127, 129, 16383, 16384, 16385, 32769)
DISTRIBUTIONS = ("zeros", "latent", "heavy", "extremes", "uniform", "dense")
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def trained(folder: Path, model: str) -> bool:
    """Whether ``folder`` (the tests' weights) holds trained weights of ``model``, not the seeded random
    ones the tests make where the shipped files are missing: rate-distortion checks need trained ones."""
    card = folder / f"{model}.json"
    return card.is_file() and "random weights" not in json.loads(card.read_text()).get("note", "")


def resampled(h: int = 40, w: int = 48) -> np.ndarray:
    """16-bit data stretched from 32 levels, then resampled: the format fixtures' and the fuzzer's image of that kind
    (``tools/make_format_fixtures.resampled_image``)."""
    return _fixtures_tool().resampled_image("uint16", (h, w), 0)


@functools.cache
def _fixtures_tool():
    return load_tool("make_format_fixtures")


def make_ints(dist: str, n: int, seed: int, scale: float = 0.5) -> np.ndarray:
    """Integer arrays shaped like what the encoder meets in practice, plus its worst cases."""
    rng = np.random.default_rng(seed)
    if dist == "zeros":
        return np.zeros(n, np.int32)
    if dist == "latent":  # rounded Laplacian: most values 0, a few +-1, rare larger ones
        return np.round(rng.laplace(0.0, scale, n)).astype(np.int32)
    if dist == "heavy":  # Cauchy tails reach far into int32
        return np.clip(rng.standard_cauchy(n) * 50 * scale, INT32_MIN, INT32_MAX).astype(np.int32)
    if dist == "extremes":
        pool = np.array([INT32_MIN, INT32_MAX, INT32_MIN + 1, INT32_MAX - 1, 0, 1, -1], np.int32)
        return rng.choice(pool, n)
    if dist == "uniform":
        return rng.integers(INT32_MIN, INT32_MAX, n, dtype=np.int32, endpoint=True)
    if dist == "dense":  # smooth-field residuals: every value non-zero, moderate widths
        return rng.integers(-5000, 5000, n, dtype=np.int32)
    raise ValueError(dist)


def check_roundtrip(v: np.ndarray, **kwargs) -> bytes:
    buf = encode_ints(v, **kwargs)
    out = decode_ints(buf)
    assert out.dtype == np.int32 and out.shape == (v.size,)
    np.testing.assert_array_equal(out, v.reshape(-1).astype(np.int32))
    return buf


def damaged_copies(raw: bytes, seed: int):
    """Every byte of ``raw`` changed once to another random value: yields (position, damaged bytes)."""
    data = bytearray(raw)
    rng = np.random.default_rng(seed)
    for i in range(len(data)):
        old = data[i]
        data[i] = (old + int(rng.integers(1, 256))) % 256
        yield i, bytes(data)
        data[i] = old


def symbols_of(buf: bytes, device: str = "cpu") -> dict[str, torch.Tensor]:
    """The latent symbols an image file holds, decoded on ``device`` (any format the codec reads)."""
    return ImageCodec(device).decode_symbols(buf)


def repack(buf: bytes, meta=None, **sections) -> bytes:
    """A container re-packed (valid checksums) with ``meta`` for its header and ``sections`` replaced."""
    c = container.unpack(buf)
    body = {k: bytes(v) for k, v in c.sections.items()}
    body.update(sections)
    return container.pack(c.kind, meta or c.meta, body)


def with_meta(buf: bytes, **meta) -> bytes:
    """A container re-packed (valid checksums) with the fields ``meta`` set in its header, the rest kept."""
    return repack(buf, dict(container.unpack(buf).meta, **meta))


def with_tile_part(buf: bytes, name: str, body: bytes) -> bytes:
    """A one-tile image file with one part's bytes replaced (tile index and checksums rewritten)."""
    c = container.unpack(buf)
    t = c.meta["tiles"]
    index = tile_index.TileIndex(c.sections, 1, t["parts"], t["symbols"], c.meta["format"])
    parts = {k: bytes(v) for k, v in index.sections(0).items()}
    parts[name] = body
    return repack(buf, **tile_index.pack(t["parts"], t["symbols"], [(parts, index.coding(0))], c.meta["format"]))


def repack_header(buf: bytes, edit=lambda s: s, sections: dict | None = None) -> bytes:
    """A container (version 2) rebuilt from ``buf`` with its raw JSON header edited (``edit``: text to text) and
    ``sections`` replaced, every checksum recomputed: what a crafted file looks like to a reader."""
    c = container.unpack(buf)
    secs = {k: bytes(v) for k, v in c.sections.items()}
    secs.update(sections or {})
    head = edit(json.dumps({"kind": c.kind, "sections": list(secs), "meta": c.meta}, separators=(",", ":"))).encode()
    lengths = write_varints([len(head), *map(len, secs.values())])
    prefix = container.MAGIC + struct.pack("<HBB", 2, len(secs), 0)
    checksum = struct.pack("<Q", xxh64(prefix, lengths, head, *secs.values()))
    return prefix + checksum + lengths + head + b"".join(secs.values())


def count_checksums(monkeypatch) -> dict:
    """Counts, from now on, container unpacks and the bytes the container's checksums read."""
    seen = {"unpacks": 0, "hashed": 0}
    real_unpack, real_hash = container.unpack, container.xxh64

    def unpack(buf):
        seen["unpacks"] += 1
        return real_unpack(buf)

    def xxh64(*parts):
        seen["hashed"] += sum(memoryview(p).nbytes for p in parts)
        return real_hash(*parts)

    monkeypatch.setattr(container, "unpack", unpack)
    monkeypatch.setattr(container, "xxh64", xxh64)
    return seen


def max_abs_error(a, b) -> float:
    """The largest ``|a - b|``, exact: in int64 for two integer arrays (an int), in float64 otherwise."""
    if np.issubdtype(np.result_type(a, b), np.integer):
        return int(np.abs(a.astype(np.int64) - b.astype(np.int64)).max())
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max())


def astronaut_image(dtype: str, shape: tuple, seed: int = 0) -> np.ndarray:
    """scikit-image's astronaut, its top-left ``shape`` crop (2-d: the channels' mean; 3-d: the first ``shape[2]``
    channels), with noise of 1% of the range: uint8, uint16 (12-bit levels) or float32 (about [-1, 2])."""
    rng = np.random.default_rng(seed)
    photo = data.astronaut()[: shape[0], : shape[1]].astype(np.float64) / 255.0
    photo = photo[..., : shape[2]] if len(shape) == 3 else photo.mean(axis=2)
    if dtype == "float32":
        return (photo * 3 - 1 + rng.normal(0, 0.01, photo.shape)).astype(np.float32)
    top = 255 if dtype == "uint8" else 4095
    return np.clip(photo * top + rng.normal(0, top / 100, photo.shape), 0, top).astype(dtype)


def cross_device_images(astronaut: tuple | None, camera: tuple | None, noise: tuple,
                        floats: tuple) -> dict[str, np.ndarray]:
    """The images the codec's cross-device tests run, by label: scikit-image's astronaut (RGB) and camera (gray),
    each its top-left ``(rows, columns)`` crop (None: the whole photo), then uint16 noise of 12-bit levels shaped
    ``noise`` and float32 noise shaped ``floats`` (one generator, seed 0)."""
    rng = np.random.default_rng(0)
    rgb, gray = data.astronaut(), data.camera()
    return {"astronaut": rgb if astronaut is None else rgb[: astronaut[0], : astronaut[1]],
            "camera": gray if camera is None else gray[: camera[0], : camera[1]],
            "uint16 noise": rng.integers(0, 4096, noise, dtype=np.uint16),
            "float32 2-channel": (rng.standard_normal(floats) * 3).astype(np.float32)}


def folder_digests(folder: Path, links: bool = True, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """SHA-256 of every file under ``folder`` by its relative path; ``links`` False: symlinked files left out;
    files named in ``skip`` left out."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*"))
            if p.is_file() and (links or not p.is_symlink()) and p.name not in skip}


def cross_device_tolerance(img: np.ndarray) -> float:
    """How far GPU and CPU decodes of one file may differ (float rounding, then integer levels):
    one level for uint8, 1e-3 of the image's range for uint16 and float32 (README, codec docs)."""
    return 1.0 if img.dtype == np.uint8 else 1e-3 * max(1.0, float(np.ptp(img)))


def load_tool(name: str):
    """tools/NAME.py as a module (the tools are not a package)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[1] / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def optional(module: str):
    """Import an optional package, or skip the test that needs it (absent, or built for another CUDA)."""
    try:
        return importlib.import_module(module)
    except Exception as e:  # ImportError, but also a library that fails to load its CUDA runtime
        pytest.skip(f"{module} cannot be imported: {type(e).__name__}: {e}")


def _host(x) -> np.ndarray:
    """A NumPy copy of a NumPy, cupy or torch array (bf16 tensors, which NumPy lacks, as their bit patterns)."""
    if isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16:
        return x.detach().cpu().view(torch.int16).numpy().view(np.uint16)
    return as_numpy(x)


class Parity:
    """Every mismatch between two implementations (CPU and GPU) in one test, reported together.

    A loop over sizes, dtypes and distributions records each case (``same_bytes``, ``same_array``,
    ``same``) instead of stopping at the first; leaving the ``parity()`` block fails the test with
    the list of every case that differed and how."""

    def __init__(self):
        self.cases = 0
        self.mismatches: list[str] = []

    def same(self, label: str, ok: bool, detail: str = "") -> bool:
        self.cases += 1
        if not ok:
            self.mismatches.append(f"{label}: {detail}" if detail else label)
        return ok

    def same_bytes(self, label: str, got: bytes, want: bytes) -> bool:
        if got == want:
            return self.same(label, True)
        n = min(len(got), len(want))
        first = next((i for i in range(n) if got[i] != want[i]), n)
        return self.same(label, False, f"{len(got)} bytes against {len(want)}, first difference at byte {first}")

    def same_array(self, label: str, got, want, atol: float = 0.0) -> bool:
        g, w = _host(got), _host(want)
        if g.shape != w.shape:
            return self.same(label, False, f"shape {g.shape} against {w.shape}")
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        both_nan = np.isnan(g64) & np.isnan(w64)
        bad = ~both_nan & ~(np.abs(g64 - w64) <= atol) if atol else ~both_nan & (g != w)
        if not bad.any():
            return self.same(label, True)
        first = int(np.flatnonzero(bad.reshape(-1))[0])
        return self.same(label, False, f"{int(bad.sum())} of {bad.size} values differ (first at flat index {first}: "
                                       f"{g.reshape(-1)[first]!r} against {w.reshape(-1)[first]!r})")


@contextmanager
def parity():
    """``with parity() as p: ...``: fails once at the end, naming every mismatch ``p`` recorded."""
    p = Parity()
    yield p
    assert p.cases, "the parity block compared nothing"
    if p.mismatches:
        shown = "\n  ".join(p.mismatches[:50])
        more = f"\n  ... and {len(p.mismatches) - 50} more" if len(p.mismatches) > 50 else ""
        pytest.fail(f"{len(p.mismatches)} of {p.cases} cases differ:\n  {shown}{more}", pytrace=False)


class _RecordingSynthesis(torch.nn.Module):
    """g_s, counting before each call the tile latents still alive where they were computed."""

    def __init__(self, g_s: torch.nn.Module, alive):
        super().__init__()
        self.inner, self.alive, self.counts = g_s, alive, []

    def forward(self, y):
        self.counts.append(self.alive())
        return self.inner(y)

    def __getitem__(self, i):  # its layers, as g_s's (the synthesis sizes its blocks from the last one)
        return self.inner[i]


def tiled_synthesis(codec: ImageCodec, buf: bytes, park) -> tuple[list, list[int]]:
    """Every tile's reconstruction of a lossy tiled file through ``tiling.synthesise`` with ``park``, and,
    at each g_s call, how many of the latents it computed were still alive as computed (not dropped or
    parked elsewhere): what the device holds besides the batch's own window."""
    f = codec._open(buf)
    refs = []
    dequantise = codec_module._dequantiser(f.net, f.symbols, f.header["quality"], torch.float32)

    def latent_of(i):
        t = dequantise(i)
        refs.append(weakref.ref(t))
        return t

    g_s = _RecordingSynthesis(f.net.g_s, lambda: sum(r() is not None for r in refs))
    net = types.SimpleNamespace(g_s=g_s)
    # eager passes: a CUDA graph's replay would not call the recording g_s
    with defaults.set(graphs=0), codec_module.network_math():
        parts = [(i, as_numpy(x)) for i, x in tiling.synthesise(net, f.grid, list(range(f.grid.count)), latent_of,
                                                                1, park)]
    return parts, g_s.counts


def check_switch_setting(monkeypatch, env: str, field: str) -> None:
    """A 0/1 VISEMZ_* switch: both values read into ``config.Defaults.field``, anything else refused naming it."""
    from visemz import config
    from visemz.errors import InvalidArgumentError

    for value, want in (("0", 0), ("1", 1)):
        monkeypatch.setenv(env, value)
        assert getattr(config.from_env(), field) == want
    for bad in ("2", "-1", "yes"):
        monkeypatch.setenv(env, bad)
        with pytest.raises(InvalidArgumentError, match=env):
            config.from_env()


def integer_prior_bits(net, reduced: torch.Tensor, x01: torch.Tensor, x: torch.Tensor, e: int) -> float:
    """The bits of coding 8-bit ``x`` (1, C, H, W) with bound ``e`` under the integer prior's layers ``net``, its passes
    in coding order (the reduced features and the prediction rounded as coding rounds them): the ideal code length
    the coder's streams should be near."""
    from visemz.models import integer_prior as IP
    from visemz.models.residual_prior import MIN_LOG_PROB, _log_bin_prob, head_channels, space_to_depth, steps

    b = 2 * e + 1
    r = IP.round_half_up(reduced.double()).clamp(-IP.IN_MAX, IP.IN_MAX).to(torch.int64)
    pred = space_to_depth(x01.double().clamp(0, 1) * 255)
    p16 = IP.round_half_up(IP.SUB * pred).to(torch.int64)
    trunk = net.condition(r, IP.recon_steps(p16, 0, 255), IP.side_steps(255, b))
    known, bits, xs = torch.zeros_like(p16), 0.0, space_to_depth(x.double())
    for k, sl in steps(net.channels):
        own = head_channels(k, sl, net.channels)
        offset, log_scale = (t[:, own] for t in net.head(k, trunk, known))
        mu, s = pred[:, sl] + offset, torch.exp(log_scale)
        m0 = torch.floor(mu + 0.5)
        centre = m0 + torch.floor((xs[:, sl] - m0 + e) / b) * b
        logp = _log_bin_prob((centre - e - 0.5 - mu) / s, (centre + e + 0.5 - mu) / s).clamp_min(MIN_LOG_PROB)
        bits -= float(logp.sum()) / math.log(2.0)
        known[:, sl] = IP.context_steps(centre.clamp(0, 255), p16[:, sl], 255)
    return bits
