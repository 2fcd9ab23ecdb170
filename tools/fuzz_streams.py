"""Fuzz every stream kind visemz decodes, in one process, and report what the decoders did.

    python tools/fuzz_streams.py OUT VARIANTS [--seed S] [--report-every N]

Seeds: small valid streams of every kind, made at start: block streams, ints streams, conditional rANS
streams (versions 1-3: version 1 from the committed golden streams), image files of formats 2-5
(container versions 1 and 2; each residual mode; both models), a page stack, the collectives' float
streams (error-bounded, lossless) and the numcodecs float chunks, each in its current version and
(unprotected by a checksum, reported apart) its older ones.

Each variant mutates one seed, either

- ``resealed``: every checksum recomputed after the mutation, so that it reaches the parsers: bytes
  changed in place anywhere (each nested stream's checksum then the outer ones recomputed, from the
  seed's layout), a container's JSON header edited (values, types, keys, overlong numbers, nesting), a
  section or tile part replaced, or an ints stream's block stream itself mutated behind a fresh entropy
  stage; or
- ``raw``: bytes changed, inserted, deleted or cut, no checksum touched, so the checksums must catch it.

and decodes it (``visemz.decompress`` on the CPU for files, the kind's own decoder otherwise), timing it
and tracing its memory (tracemalloc: Python and NumPy allocations, reset per case; torch's CPU tensors
are not traced, the process's peak RSS is reported beside).  It reports: variants run; the errors raised
(visemz's by type); every exception that is not a visemz error, with a reproducer; every silent wrong
output (a raw variant of a checksummed kind that decodes to other values than its seed); the slowest case;
the largest memory against its allowance, twice what a valid stream of its kind needs for the values the
variant declares (the most traced bytes a value over the kind's seeds); and the cases over 2 s of CPU time
(the process runs one compute thread; wall time, which counts what else the machine runs, is counted beside)
or over that allowance.  Reproducers (the bytes and a JSON of how
to decode them) go to OUT/reproducers/, the report to OUT/report.json (rewritten as it goes).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import resource
import signal
import struct
import sys
import time
import traceback
import tracemalloc
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

import visemz
from make_format_fixtures import resampled_image, smooth_image  # a script beside this one, as tools are run
from visemz import container, defaults
from visemz.encoders import decode_ints, encode_ints, entropy, rans, reference, stream
from visemz.encoders import layout as L
from visemz.encoders.cdf_tables import CdfTables, default_scale_table, gaussian_scale_tables
from visemz.errors import VisemzError
from visemz.floats import ErrorBounded, Lossless
from visemz.framing import read_varints, write_varints, xxh64
from visemz.image import image_header, pages
from visemz.io.writers import write_atomic
from visemz.zarr_codecs import VisemzErrorBounded, VisemzLossless

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "fixtures" / "rans"  # the committed conditional rANS streams (version 1 among them)
TIME_AIM, MEMORY_AIM = 2.0, 2.0  # seconds a case; times the memory its declared values need
HANG = 60  # a case still running after this many seconds is stopped and reported as a hang
KEEP = 50  # reproducers kept per finding


# ------------------------------------------------------------------ seeds
@dataclass
class Seed:
    kind: str
    name: str
    data: bytes
    decode: Callable[[bytes], object]
    how: str  # how a reproducer decodes (for its JSON)
    checksummed: bool = True  # every byte under a checksum: a raw variant must never decode to other values
    out: bytes = b""  # the seed's decoded values (dtype, shape and bytes)
    values: int = 0  # values the seed declares
    peak: int = 0  # traced bytes at the peak of decoding the seed
    need: float = 0.0  # traced bytes a value that a valid stream of this kind needs: the most over the kind's seeds
    nodes: list = field(default_factory=list)  # the seed's nested streams, innermost first: (start, end, resealer)


def _as_bytes(out) -> bytes:
    a = np.asarray(out)
    return f"{a.dtype.str}{a.shape}".encode() + a.tobytes()


def _ints(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    v = np.round(rng.laplace(0, 0.8, n)).astype(np.int64)
    v[rng.choice(n, 8, replace=False)] = [300, -70000, 2**24 + 5, -(2**31), 2**31 - 1, 129, -3000, 5]
    return v.astype(np.int32)


def _floats(n: int) -> np.ndarray:
    return (np.sin(np.linspace(0, 12, n)) * 3 + np.random.default_rng(n).normal(0, 0.05, n)).astype(np.float32)


def seeds() -> list[Seed]:
    out: list[Seed] = []

    def add(kind, name, data, decode, how, checksummed=True):
        out.append(Seed(kind, name, bytes(data), decode, how, checksummed))

    for policy in L.POLICIES:
        for shuffle in (True, False):
            add("block", f"block-{policy}-{int(shuffle)}",
                reference.encode(_ints(3000, 1), L.POLICIES[policy], shuffle), reference.decode,
                "visemz.encoders.reference.decode(buf)", checksummed=False)
    for ent, policy in (("none", "global"), ("zstd", "block"), ("zstd", "global")):
        add("ints", f"ints-{ent}-{policy}", encode_ints(_ints(3000, 2), policy=policy, entropy=ent), decode_ints,
            "visemz.encoders.decode_ints(buf)")
    _rans_seeds(add)
    _image_seeds(add)
    _float_seeds(add)
    return out


def _rans_seeds(add) -> None:
    tables = gaussian_scale_tables(default_scale_table())
    rng = np.random.default_rng(3)
    idx = rng.integers(0, 64, 2000).astype(np.int32)
    sym = np.round(rng.normal(0, 1, 2000) * default_scale_table()[idx] * 2).astype(np.int32)
    how = "visemz.encoders.rans.decode_conditional(buf, indexes, tables) with the seed's"
    for skip in (0, 65531):
        buf = rans.encode_conditional(sym, idx, tables, lane_bytes=8, lane_symbols=64, skip_freq=skip)
        add("rans", f"rans-v{buf[4]}", buf, lambda b, i=idx, t=tables: rans.decode_conditional(b, i, t), how)
    if (GOLDEN / "golden_v1.npz").is_file():
        with np.load(GOLDEN / "golden_v1.npz", allow_pickle=False) as d:
            gidx, gtables = d["indexes"].astype(np.int32), CdfTables.from_dict(d)
        for path in sorted(GOLDEN.glob("groups_v1.vzrc")):  # many groups of lanes (one_group's 2500 steps are slow)
            add("rans", f"rans-{path.stem}", path.read_bytes(),
                lambda b, i=gidx, t=gtables: rans.decode_conditional(b, i, t), how + " (tests/fixtures/rans)")


def _many_lanes():
    """Image seeds' rANS sections written with many lanes (8 code bytes a lane): the stream records its plan, and
    the CPU decoder's sequential steps, most of a small file's decode, fall from thousands to tens."""
    return defaults.set(rans_lane_bytes=8, rans_lane_symbols=64)


def _image_seeds(add) -> None:
    with _many_lanes():
        _image_files(add)


def _image_files(add) -> None:
    codec = visemz.ImageCodec("cpu")
    how = "visemz.decompress(buf, device='cpu')"
    decode = lambda b: visemz.decompress(b, device="cpu")  # noqa: E731
    gray, rgb = smooth_image("uint8", (64, 64), 1), smooth_image("uint8", (48, 64, 3), 2)
    now = f"image-v{image_header.FORMAT}"  # what the codec writes by default (the learned residual on gray)
    sparse = smooth_image("uint16", (64, 48), 8) // 16 * 16  # lossless through a palette of its values
    files = {
        f"{now}-u8-e2": codec.compress(gray, max_error=2),
        f"{now}-u8-e0": codec.compress(gray, max_error=0),
        f"{now}-u16-e0-palette": codec.compress(sparse, model="mbt2018-mean", max_error=0),
        f"{now}-f32-float": codec.compress(smooth_image("float32", (40, 64), 3), max_error=0.05),
        f"{now}-f32-bits": codec.compress(smooth_image("float32", (40, 64), 3), max_error=0),
        f"{now}-rgb-lossy": codec.compress(rgb),
        f"{now}-mbt-u16-e3": codec.compress(smooth_image("uint16", (64, 48), 4), model="mbt2018-mean", max_error=3),
        f"{now}-tiled-e1": codec.compress(smooth_image("uint8", (96, 64), 5), max_error=1, tile=64),
        f"{now}-u8-e1-scales": codec.compress(smooth_image("uint8", (64, 64), 2), quality=1, max_error=1),  # calibrated
        f"{now}-u16-e0-differences": codec.compress(resampled_image("uint16", (48, 64), 2), model="mbt2018-mean",
                                                    quality=1, max_error=0),  # coded as neighbours' differences
        "image-v8-u8-e1-scales": codec.compress(smooth_image("uint8", (64, 64), 2), quality=1, max_error=1,
                                                image_format=8),  # the float prior without differences
        "image-v9-u8-e1-integer": codec.compress(smooth_image("uint8", (64, 64), 2), quality=1, max_error=1,
                                                 image_format=9),  # the integer prior
        "image-v6-u8-e2": codec.compress(gray, max_error=2, image_format=6),
        "image-v5-tiled-e1": codec.compress(smooth_image("uint8", (96, 64), 5), max_error=1, tile=64, image_format=5),
        "image-v4-tiled-mbt": codec.compress(smooth_image("uint8", (64, 96), 6), model="mbt2018-mean", tile=64,
                                             image_format=4),
        "image-v3-u8-e1": codec.compress(gray, max_error=1, image_format=3),
        "image-v2-f32-e0": codec.compress(smooth_image("float32", (40, 64), 7), max_error=0, image_format=2),
    }
    c = container.unpack(files["image-v3-u8-e1"])
    files["image-v3-container1"] = container.pack(c.kind, c.meta, {k: bytes(v) for k, v in c.sections.items()}, 1)
    for name, buf in files.items():
        add(name.split("-")[0] + "-" + name.split("-")[1], name, buf, decode, how)
    stack = np.stack([smooth_image("uint8", (32, 40), k) for k in range(2)])
    add("pages", "pages-u8-e1", pages.encode(stack, lambda p: codec.compress(p, max_error=1)), decode, how)


def _float_seeds(add) -> None:
    x = _floats(1000)
    for predictor in ("none", "lorenzo", "lorenzo2d"):
        codec = ErrorBounded(1e-3, predictor)
        add("eb", f"eb-v3-{predictor}", codec.encode(x.reshape(25, 40) if predictor == "lorenzo2d" else x),
            lambda b: ErrorBounded(1e-3).decode(b), "visemz.floats.ErrorBounded(1e-3).decode(buf)")
    add("eb", "eb-v3-float16", ErrorBounded(1e-3).encode(x.astype(np.float16)), lambda b: ErrorBounded(1e-3).decode(b),
        "visemz.floats.ErrorBounded(1e-3).decode(buf)")
    for x_ in (x, x.astype(np.float16), torch.from_numpy(x).to(torch.bfloat16)):
        buf = Lossless().encode(x_)
        add("ll", f"ll-v2-{buf[5]}", buf, Lossless().decode, "visemz.floats.Lossless().decode(buf)")
    eb, ll = VisemzErrorBounded(1e-3), VisemzLossless()
    chunk = x[:600].reshape(2, 3, 100)
    add("zarr", "zarr-v2-eb", eb.encode(chunk), eb.decode, "visemz.zarr_codecs.VisemzErrorBounded(1e-3).decode(buf)")
    add("zarr", "zarr-v2-ll", ll.encode(chunk.astype(np.float16)), ll.decode,
        "visemz.zarr_codecs.VisemzLossless().decode(buf)")
    # older versions, written before their checksums: read as ever, reported apart (nothing covers their headers)
    v3 = ErrorBounded(1e-3, "lorenzo").encode(x)
    add("legacy", "eb-v2", v3[:4] + b"\x02" + v3[5:24] + v3[32:], lambda b: ErrorBounded(1e-3).decode(b),
        "visemz.floats.ErrorBounded(1e-3).decode(buf)", checksummed=False)
    v3 = ErrorBounded(1e-3, "none").encode(x)
    add("legacy", "eb-v1", struct.pack("<4sBBHd", b"VZEB", 1, 0, 0, 1e-3) + v3[32:],
        lambda b: ErrorBounded(1e-3).decode(b),
        "visemz.floats.ErrorBounded(1e-3).decode(buf)", checksummed=False)
    v2 = Lossless().encode(x)
    add("legacy", "ll-v1", v2[:4] + b"\x01" + v2[5:21] + v2[29:], Lossless().decode,
        "visemz.floats.Lossless().decode(buf)", checksummed=False)
    v2 = ll.encode(chunk.astype(np.float16))
    add("legacy", "zarr-v1-ll", v2[:4] + b"\x01" + v2[5:30] + v2[38:], ll.decode,
        "visemz.zarr_codecs.VisemzLossless().decode(buf)", checksummed=False)


# ------------------------------------------------------------------ nested streams and their checksums
def _seal_at(at: int):
    """A stream whose u64 xxh64 at ``at`` covers all its other bytes (ints, rANS 2-3, error-bounded 3, lossless 2,
    container 2)."""
    def seal(b: bytearray, s: int, e: int) -> None:
        if e - s >= at + 8:
            b[s + at:s + at + 8] = struct.pack("<Q", xxh64(b[s:s + at], b[s + at + 8:e]))
    return seal


def _seal_container1(entries: list[tuple[int, int]], hlen: int):
    def seal(b: bytearray, s: int, e: int) -> None:
        table = container.HEAD
        for k, (a, z) in enumerate(entries):
            b[s + table + 16 * k + 8:s + table + 16 * k + 16] = struct.pack("<Q", xxh64(b[a:z]))
        end = table + 16 * len(entries) + hlen
        b[s + 32:s + 40] = struct.pack("<Q", xxh64(b[s:s + 32], b[s + container.HEAD:s + end]))
    return seal


def _seal_zarr(b: bytearray, s: int, e: int) -> None:
    ndim = b[s + 5]
    at = 6 + 8 * ndim
    if b[s + 4] == 2 and ndim <= 32 and e - s >= at + 8:
        b[s + at:s + at + 8] = struct.pack("<Q", xxh64(b[s:s + at], b[s + at + 8:e]))


def nodes(b: bytes, s: int = 0, e: int | None = None) -> list:
    """The nested streams of ``b[s:e]`` whose checksums a reseal recomputes, innermost first: (start, end,
    resealer).  Best effort: a part that does not parse is left as it is."""
    e = len(b) if e is None else e
    magic, out = bytes(b[s:s + 4]), []
    try:
        if magic == b"VZIS":
            out.append((s, e, _seal_at(24)))
        elif magic == b"VZRC":
            out.append((s, e, _seal_at(24 if b[s + 4] == 1 else 10)))
        elif magic == b"VZEB":
            head = {1: 16, 2: 24, 3: 32}.get(b[s + 4], 32)
            out += nodes(b, s + head, e)
            if b[s + 4] == 3:
                out.append((s, e, _seal_at(24)))
        elif magic == b"VZLL":
            v2 = b[s + 4] == 2
            table = s + 21 + 8 * v2
            sizes = struct.unpack_from("<4Q", b, table)
            gaps = table + 32 + sizes[0] + sizes[1]
            out += nodes(b, gaps, gaps + sizes[2])
            if v2:
                out.append((s, e, _seal_at(21)))
        elif magic == b"VZNA":
            inner = s + 6 + 8 * b[s + 5] + 8 * (b[s + 4] == 2)
            out += nodes(b, inner, e)
            out.append((s, e, _seal_zarr))
        elif magic == container.MAGIC[:4]:
            out += _container_nodes(b, s, e)
    except (struct.error, IndexError, VisemzError, ValueError, KeyError, TypeError):
        pass
    return out


def _container_nodes(b: bytes, s: int, e: int) -> list:
    c = container.unpack(memoryview(b)[s:e])  # the seed is valid: its own layout
    lengths = [len(v) for v in c.sections.values()]
    starts = (e - sum(lengths) + np.cumsum([0, *lengths[:-1]])).tolist()  # both versions end with the sections
    out = []
    for (name, v), a in zip(c.sections.items(), starts):
        if c.kind == "pages" and name == "pages":
            for start, end in _splits(np.frombuffer(c.sections["index"], "<u8"), a):
                out += nodes(b, start, end)
        elif c.kind == "image" and name == "tiles":
            out += _tile_nodes(b, c, a)
        else:
            out += nodes(b, a, a + len(v))
    if c.version == 2:
        out.append((s, e, _seal_at(12)))
    else:
        out.append((s, e, _seal_container1([(a, a + n) for a, n in zip(starts, lengths)], c.header_bytes)))
    return out


def _splits(lengths, start: int) -> list[tuple[int, int]]:
    ends = start + np.cumsum(lengths.astype(np.int64))
    return list(zip([start, *ends[:-1].tolist()], ends.tolist()))


def _tile_nodes(b: bytes, c: container.Container, start: int) -> list:
    t = c.meta["tiles"]
    n, p = t["grid"][0] * t["grid"][1], len(t["parts"])
    index = c.sections["tile_index"]
    lengths = read_varints(index, 0, n * p, "index")[0] if c.meta["format"] >= 5 else np.frombuffer(index, "<u8", n * p)
    out = []
    for a, z in _splits(lengths, start):
        out += nodes(b, a, z)
    return out


def reseal(b: bytearray, tree: list) -> bytes:
    for s, e, seal in tree:  # innermost first: an outer checksum covers the inner ones
        seal(b, s, e)
    return bytes(b)


# ------------------------------------------------------------------ mutations
INTERESTING = [0, 1, 2, 7, 8, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0x8000, 0xFFFF, 1 << 16, 1 << 24, 1 << 29, (1 << 29) + 1,
               (1 << 31) - 1, 1 << 31, (1 << 32) - 1, 1 << 32, 1 << 40, 1 << 63, (1 << 64) - 1]


def mutate_bytes(b: bytearray, rng, start: int, end: int, in_place: bool) -> str:
    """One byte-level mutation of ``b[start:end]``; returns what it did."""
    if end <= start:
        return "none"
    ops = ["flip", "set", "int"] + ([] if in_place else ["insert", "delete", "truncate", "duplicate"])
    op = ops[rng.integers(len(ops))]
    at = int(rng.integers(start, end))
    if op == "flip":
        for _ in range(int(rng.integers(1, 4))):
            pos = int(rng.integers(start, end))
            b[pos] ^= 1 << int(rng.integers(8))
        return "flip"
    if op == "set":
        b[at] = int(rng.choice([0, 0xFF, 0x7F, 0x80, int(rng.integers(256))]))
        return f"set@{at}"
    if op == "int":
        width = int(rng.choice([1, 2, 4, 8]))
        v = int(rng.choice(INTERESTING + [end - start, end - start + 1, max(0, end - start - 1)])) % (1 << (8 * width))
        raw = v.to_bytes(width, "little")[: end - at]
        b[at:at + len(raw)] = raw
        return f"int{width}={v}@{at}"
    k = int(rng.integers(1, 17))
    if op == "insert":
        b[at:at] = rng.integers(0, 256, k, dtype=np.uint8).tobytes()
    elif op == "delete":
        del b[at:min(end, at + k)]
    elif op == "truncate":
        del b[at:]
    else:
        b[at:at] = b[at:min(end, at + k)]
    return f"{op}@{at}"


JSON_VALUES = [0, -1, 1, 2, 3, 5, 8, 64, 65, 255, 256, 4096, 65535, 65536, 2**31 - 1, 2**31, 2**32, 2**53 + 1,
               2**63, 2**64, 0.5, -0.0, 1e-320, 1e308, 36.5, True, False, None,
               "", "x", "zstd", "none", "ans", "rans", "ints", "int",
               "bits", "float", "uint8", "uint16", "float32", "float64", "balle2016-rgb", "balle2016-gray",
               "mbt2018-mean-rgb", "mbt2018-mean-gray", "balle2016-rgb-q1", "0123456789abcdef", "f14f2366b618726b",
               [], [1], [0, 0], [0, 255], [64, 64], [64, 64, 3], [1, 1], [2, 2], [32, 16], {}, {"y": [1, 192, 4, 4]},
               ["y"], ["y", "z"], ["mask", "residual", "y"]]
JSON_LITERALS = ["1e400", "-1e400", "1" * 30, "1" * 4400, "-" + "9" * 25, "NaN", "Infinity", "[" * 200 + "]" * 200,
                 "[" * 5000 + "]" * 5000, '"\\ud800"', "1.0e-400", "123456789012345678901"]
HOLE = "\u0000hole\u0000"


def mutate_json(text: str, rng) -> tuple[str, str]:
    """One edit of a container's JSON header (valid JSON in, any text out); returns (text, what it did)."""
    obj = json.loads(text)
    paths = _paths(obj, ())
    path = paths[int(rng.integers(len(paths)))]
    op = ["value", "literal", "delete", "add", "duplicate", "text"][int(rng.integers(6))]
    if op == "text":
        b = bytearray(text.encode())
        cut = bytes(b[:int(rng.integers(len(b)))] + b[int(rng.integers(len(b))):])
        return cut.decode("utf-8", "replace"), "json-cut"
    parent, key = _at(obj, path[:-1]), path[-1] if path else None
    if op == "delete" and isinstance(parent, dict) and key is not None:
        del parent[key]
        return json.dumps(obj), f"json-delete {'.'.join(map(str, path))}"
    if op == "add" and isinstance(parent, dict):
        parent["extra"] = 1
        return json.dumps(obj), f"json-add in {'.'.join(map(str, path[:-1]))}"
    if op == "duplicate" and isinstance(parent, dict) and key is not None:
        dumped = json.dumps(obj)
        k = json.dumps(key)
        return dumped.replace(k + ":", f"{k}: 0, {k}:", 1), f"json-duplicate {key}"
    if key is None:
        return json.dumps(obj), "none"
    if op == "literal":
        parent[key] = HOLE
        lit = JSON_LITERALS[int(rng.integers(len(JSON_LITERALS)))]
        return json.dumps(obj).replace(json.dumps(HOLE), lit, 1), f"json {'.'.join(map(str, path))}={lit[:24]}"
    value = JSON_VALUES[int(rng.integers(len(JSON_VALUES)))]
    parent[key] = value
    return json.dumps(obj), f"json {'.'.join(map(str, path))}={json.dumps(value)[:24]}"


def _paths(obj, prefix: tuple) -> list[tuple]:
    out = [prefix] if prefix else []
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        out += _paths(v, prefix + (k,))
    return out


def _at(obj, path: tuple):
    for k in path:
        obj = obj[k]
    return obj


def pack_raw(kind_header: str, sections: list[bytes], version: int) -> bytes:
    """A container with a raw JSON header text and its sections, every checksum right (versions 1 and 2)."""
    head = kind_header.encode("utf-8", "surrogatepass")
    if version == 2:
        lengths = write_varints([len(head), *map(len, sections)])
        prefix = container.MAGIC + struct.pack("<HBB", 2, len(sections), 0)
        return prefix + struct.pack("<Q", xxh64(prefix, lengths, head, *sections)) + lengths + head + b"".join(sections)
    table = b"".join(struct.pack("<QQ", len(s), xxh64(s)) for s in sections)
    total = container.HEAD + len(table) + len(head) + sum(map(len, sections))
    fixed = container.FIXED.pack(container.MAGIC, 1, 0, len(head), len(sections), 0, total)
    return fixed + struct.pack("<Q", xxh64(fixed, table, head)) + table + head + b"".join(sections)


def deep_ints(buf: bytes, rng) -> tuple[bytes, str]:
    """An ints stream whose block stream itself is mutated, behind a fresh entropy stage and checksum."""
    parsed = stream.parse(buf)
    raw = bytes(parsed.frames[0]) if parsed.entropy == 0 else entropy.decompress_cpu(parsed.frames, parsed.entropy,
                                                                                      parsed.sizes)
    b = bytearray(raw)
    what = mutate_bytes(b, rng, 0, len(b), in_place=False)
    frames = [bytes(b)] if parsed.entropy == 0 else \
        entropy.compress_cpu(bytes(b), parsed.entropy, max(parsed.chunk, 4096))
    return stream.pack(len(b), parsed.entropy, parsed.chunk or 4096, frames), "block-stream " + what


def structured(seed: Seed, rng) -> tuple[bytes, str]:
    """A resealed variant that changes lengths: a container's header edited or a section (or a tile's part, or
    a page) replaced by a mutated one; an ints stream's block stream mutated."""
    if seed.data[:4] == b"VZIS":
        return deep_ints(seed.data, rng)
    if seed.data[:8] != container.MAGIC:
        return b"", ""
    c = container.unpack(seed.data)
    text = json.dumps({"kind": c.kind, "sections": list(c.sections), "meta": c.meta}, separators=(",", ":"))
    secs = {k: bytes(v) for k, v in c.sections.items()}
    if rng.random() < 0.5:
        text, what = mutate_json(text, rng)
    else:
        what = _replace_section(c, secs, rng)
    return pack_raw(text, list(secs.values()), c.version), what


def _replace_section(c: container.Container, secs: dict, rng) -> str:
    if c.kind == "pages":
        lengths = np.frombuffer(secs["index"], "<u8")
        bufs = [secs["pages"][a - 0:z] for a, z in _splits(lengths, 0)]
        k = int(rng.integers(len(bufs)))
        bufs[k], what = structured(Seed("image", "", bufs[k], None, ""), rng)
        secs["index"] = np.array([len(x) for x in bufs], "<u8").tobytes()
        secs["pages"] = b"".join(bufs)
        return f"page {k}: {what}"
    if c.kind == "image" and "tiles" in secs:
        t = c.meta["tiles"]
        n, p = t["grid"][0] * t["grid"][1], len(t["parts"])
        fmt = c.meta["format"]
        index = secs["tile_index"]
        lengths, pos = read_varints(index, 0, n * p, "index") if fmt >= 5 else \
            (np.frombuffer(index, "<u8", n * p), 8 * n * p)
        parts = [secs["tiles"][a:z] for a, z in _splits(lengths, 0)]
        k = int(rng.integers(len(parts)))
        parts[k], what = _mutated_part(parts[k], rng)
        sizes = [len(x) for x in parts]
        secs["tile_index"] = (write_varints(sizes) if fmt >= 5 else np.array(sizes, "<u8").tobytes()) + index[pos:]
        secs["tiles"] = b"".join(parts)
        return f"tile part {k} ({t['parts'][k % p]}): {what}"
    name = list(secs)[int(rng.integers(len(secs)))]
    secs[name], what = _mutated_part(secs[name], rng)
    return f"section {name}: {what}"


def _mutated_part(part: bytes, rng) -> tuple[bytes, str]:
    if part[:4] == b"VZIS" and rng.random() < 0.5:
        return deep_ints(part, rng)
    b = bytearray(part)
    what = mutate_bytes(b, rng, 0, len(b), in_place=bool(rng.random() < 0.5))
    return reseal(b, nodes(bytes(b))) if b[:4] in (b"VZIS", b"VZRC") else bytes(b), what


def variant(seed: Seed, rng) -> tuple[bytes, str, str]:
    """(bytes, mode, what was done) of one variant of ``seed``."""
    b = bytearray(seed.data)
    if rng.random() < 0.5 or not seed.nodes:
        what = mutate_bytes(b, rng, 0, len(b), in_place=False)
        return bytes(b), "raw", what
    r = rng.random()
    if r < 0.3:
        data, what = structured(seed, rng)
        if data:
            return data, "resealed", what
    s, e, _ = seed.nodes[int(rng.integers(len(seed.nodes)))]  # a nested stream, in place, every checksum recomputed
    what = mutate_bytes(b, rng, s, e, in_place=True)
    return reseal(b, seed.nodes), "resealed", what


# ------------------------------------------------------------------ running
def declared_values(kind: str, data: bytes) -> int | None:
    """The values a variant declares (its image's, its stream's), where its header still parses."""
    try:
        if kind.startswith("image") or kind == "pages":
            meta = container.unpack(data).meta
            return math.prod(meta["shape"]) if all(type(v) is int for v in meta["shape"]) else None
        if kind in ("ints", "block"):
            raw = data if kind == "block" else None
            if raw is None:
                return stream.declared_count(stream.parse(data))
            return L.HEADER.unpack_from(raw, 0)[5]
    except Exception:  # noqa: BLE001  (best effort: the decoder reports the damage)
        return None
    return None


class CaseTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise CaseTimeout(f"still running after {HANG} s")


@dataclass
class Case:
    out: object
    err: BaseException | None
    seconds: float  # wall time
    cpu: float  # this process's CPU time (torch runs one thread: the case's own work, whatever else the machine runs)
    traced: int | None  # tracemalloc's peak over the case, None when not traced
    rss_rise: int  # how far the case raised the process's peak RSS (bytes; 0 below an earlier peak)


def run_case(decode, data: bytes, trace: bool) -> Case:
    if trace:
        tracemalloc.start()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    signal.setitimer(signal.ITIMER_REAL, HANG)
    t0, c0 = time.perf_counter(), time.process_time()
    out, err = None, None
    try:
        out = decode(data)
    except Exception as e:  # noqa: BLE001  (what the fuzzer is here to see)
        err = e
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    traced = None
    if trace:
        traced = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    rise = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) * 1024
    return Case(out, err, seconds, cpu, traced, rise)


class Report:
    def __init__(self, out: Path, variants: int, seed: int):
        self.out, self.started = out, time.time()
        self.data = {"variants_asked": variants, "seed": seed, "variants_run": 0, "by_kind": Counter(),
                     "by_mode": Counter(), "outcomes": Counter(), "visemz_errors": Counter(),
                     "non_visemz_exceptions": 0, "silent_wrong_outputs": 0, "unprotected_changed_outputs": 0,
                     "hangs": 0, "over_time": 0, "over_time_wall": 0, "over_memory": 0, "traced": 0, "slowest": None,
                     "slowest_cpu": None, "largest_memory": None, "largest_rss_rise": None,
                     "seconds_by_kind": Counter(), "error_sites": Counter(), "findings": []}
        self.kept = Counter()
        (out / "reproducers").mkdir(parents=True, exist_ok=True)

    def finding(self, what: str, i: int, seed: Seed, mode: str, how: str, data: bytes, detail: str) -> None:
        self.kept[what] += 1
        if self.kept[what] > KEEP:
            return
        path = self.out / "reproducers" / f"{i:08d}-{seed.name}.bin"
        write_atomic(path, data)
        entry = {"finding": what, "variant": i, "seed": seed.name, "kind": seed.kind, "mode": mode, "mutation": how,
                 "file": str(path.relative_to(self.out)), "decode": seed.how, "detail": detail}
        write_atomic(path.with_suffix(".json"), (json.dumps(entry, indent=1) + "\n").encode())
        self.data["findings"].append(entry)

    def save(self) -> dict:
        d = dict(self.data, error_sites=dict(self.data["error_sites"].most_common(60)),
                 wall_seconds=round(time.time() - self.started, 1),
                 max_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1))
        write_atomic(self.out / "report.json", (json.dumps(d, indent=1, default=dict) + "\n").encode())
        return d


def measure_seeds(all_seeds: list[Seed]) -> None:
    for s in all_seeds:
        s.nodes = nodes(s.data)
        first = run_case(s.decode, s.data, False)  # the first decode loads weights and fills caches
        if first.err is not None:
            raise RuntimeError(f"seed {s.name} does not decode: {first.err!r}")
        s.peak = run_case(s.decode, s.data, True).traced
        s.out, s.values = _as_bytes(first.out), int(np.asarray(first.out).size)
    for s in all_seeds:  # a valid variant may take another path of its kind (a block stream without bitshuffle)
        s.need = max(t.peak / max(t.values, 1) for t in all_seeds if t.kind == s.kind)


HEAVY = ("image", "pages")  # kinds whose decodes run the networks: tracemalloc slows them about 3x
LIGHT_TURNS = 4  # each seed of another kind comes this many times per round to a file seed's once


def schedule(all_seeds: list[Seed]) -> list[Seed]:
    """One round of seeds, in a fixed order: a file seed's decode runs the networks (about 100 ms on this
    project's CPU machine, against about 1 ms for a stream), so the files get about a tenth of the variants."""
    return [s for _ in range(LIGHT_TURNS) for s in all_seeds if not s.kind.startswith(HEAVY)] + \
        [s for s in all_seeds if s.kind.startswith(HEAVY)]

def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="folder for report.json and reproducers/")
    ap.add_argument("variants", type=int)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--report-every", type=int, default=10_000)
    ap.add_argument("--trace-every", type=int, default=10,
                    help="trace the memory of every Nth variant of a file kind (image, pages); other kinds: all")
    args = ap.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one process, one compute thread: a case's CPU time is its own work
    old_handler = signal.signal(signal.SIGALRM, _alarm)
    try:
        return _run(args)
    finally:
        signal.signal(signal.SIGALRM, old_handler)
        torch.set_num_threads(threads)


def _run(args) -> dict:
    all_seeds = seeds()
    measure_seeds(all_seeds)
    order = schedule(all_seeds)
    report = Report(args.out, args.variants, args.seed)
    d = report.data
    for i in range(args.variants):
        seed = order[i % len(order)]
        rng = np.random.default_rng([args.seed, i])
        try:
            data, mode, how = variant(seed, rng)
        except Exception:  # noqa: BLE001  (a mutation the layout helpers could not make: count it, move on)
            d["outcomes"]["not made"] += 1
            continue
        if data == seed.data:
            d["outcomes"]["unchanged"] += 1
            continue
        trace = not seed.kind.startswith(HEAVY) or i // len(order) % args.trace_every == 0
        case = run_case(seed.decode, data, trace)
        d["variants_run"] += 1
        d["by_kind"][seed.kind] += 1
        d["by_mode"][mode] += 1
        d["seconds_by_kind"][seed.kind] += case.seconds
        _account(report, i, seed, mode, how, data, case)
        if (i + 1) % args.report_every == 0:
            report.save()
            print(f"{i + 1} variants: {dict(d['outcomes'])}", flush=True)
    final = report.save()
    print(json.dumps({k: final[k] for k in ("variants_run", "non_visemz_exceptions", "silent_wrong_outputs",
                                             "unprotected_changed_outputs", "hangs", "over_time", "over_time_wall",
                                             "over_memory",
                                             "slowest", "slowest_cpu", "largest_memory", "largest_rss_rise",
                                             "wall_seconds", "max_rss_mb")}, default=dict))
    return final


def _account(report: Report, i: int, seed: Seed, mode: str, how: str, data: bytes, c: Case) -> None:
    d = report.data
    case = {"variant": i, "seed": seed.name, "mode": mode, "mutation": how}
    err = c.err
    if err is None:
        same = _as_bytes(c.out) == seed.out
        d["outcomes"]["decoded, same values" if same else "decoded, other values"] += 1
        if not same and mode == "raw":
            if seed.checksummed:
                d["silent_wrong_outputs"] += 1
                report.finding("silent wrong output", i, seed, mode, how, data, "decoded to other values, no error")
            else:
                d["unprotected_changed_outputs"] += 1
    elif isinstance(err, CaseTimeout):
        d["hangs"] += 1
        report.finding("hang", i, seed, mode, how, data, str(err))
    elif isinstance(err, VisemzError):
        d["outcomes"]["visemz error"] += 1
        d["visemz_errors"][type(err).__name__] += 1
        d["error_sites"][f"{mode} {seed.kind}: {re.sub(r'[0-9]+', 'N', str(err))[:70]}"] += 1
    else:
        d["non_visemz_exceptions"] += 1
        d["outcomes"]["other exception"] += 1
        report.finding("non-visemz exception", i, seed, mode, how, data,
                       "".join(traceback.format_exception(type(err), err, err.__traceback__)[-4:]))
    for key, value in (("slowest", c.seconds), ("slowest_cpu", c.cpu)):
        if d[key] is None or value > d[key]["seconds"]:
            d[key] = dict(case, seconds=round(value, 4))
    if c.rss_rise and (d["largest_rss_rise"] is None or c.rss_rise > d["largest_rss_rise"]["bytes"]):
        d["largest_rss_rise"] = dict(case, bytes=c.rss_rise)
    d["over_time_wall"] += int(c.seconds > TIME_AIM)  # counted only: on a shared machine, other processes' time too
    if c.cpu > TIME_AIM:
        d["over_time"] += 1
        report.finding("over 2 s", i, seed, mode, how, data, f"{c.cpu:.2f} s CPU, {c.seconds:.2f} s wall")
    if c.traced is None:
        return
    d["traced"] += 1
    declared = declared_values(seed.kind, data) or seed.values
    allowance = MEMORY_AIM * max(seed.peak, seed.need * max(declared, seed.values))
    if d["largest_memory"] is None or c.traced > d["largest_memory"]["traced_bytes"]:
        d["largest_memory"] = dict(case, traced_bytes=c.traced, allowance=int(allowance), seed_peak=seed.peak)
    if c.traced > allowance:
        d["over_memory"] += 1
        report.finding("over the memory allowance", i, seed, mode, how, data,
                       f"{c.traced} traced bytes, allowance {int(allowance)} (seed {seed.peak}, declared {declared} "
                       "values)")


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
