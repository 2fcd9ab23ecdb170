"""Lossless and near-lossless tables: bits at a guaranteed maximum error E, from the points CSV.

The error-bounded codecs' rows (kind "bound": visemz's ``max_error`` ladder, PNG, JPEG-LS,
JPEG 2000 reversible, JPEG XL lossless, WebP lossless, SZ3, ZFP) are grouped per dataset, codec
and E, with E in levels of the image's own dtype.  Each image's measured maximum error is
checked against E: a (codec, E) whose output breaks its bound on any image is reported with
those images and left out of every mean, ratio and curve.  Ratios are of mean bits per pixel
over the images both codecs coded (JPEG XL lossless's and JPEG-LS's at the same E).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from .. import markdown
from .codecs import LOSSLESS_NAMES, describe

LOSSLESS_ANCHORS = ("jpegxl-lossless", "jpegls")  # the ratios' denominators in the lossless table
NEAR_LOSSLESS_ANCHOR = "jpegls"  # the only classical coder with a maximum error above 0
PER_IMAGE = ("bpp", "bits_per_subpixel", "max_error", "encode_s", "decode_s")


def breaks_bound(row: dict) -> bool:
    """Whether an error-bounded codec's row shows a maximum error above its setting."""
    return row["kind"] == "bound" and float(row["max_abs_error"]) > float(row["value"])


@dataclass
class BoundPoint:
    """One codec at one maximum error E on one dataset: per-image measurements, and the images that broke E."""

    codec: str
    bound: float
    device: str
    per_image: dict[str, dict[str, float]] = field(default_factory=dict)  # image -> PER_IMAGE values
    broken: dict[str, float] = field(default_factory=dict)  # image -> its maximum error, above E

    @property
    def images(self) -> int:
        return len(self.per_image)

    def mean(self, key: str, images=None) -> float:
        return float(np.mean([self.per_image[i][key] for i in (self.per_image if images is None else images)]))

    def ratio(self, anchor: "BoundPoint | None") -> tuple[float, int] | None:
        """(mean bpp / the anchor's mean bpp over the images both coded, how many), None when either broke
        its bound or they share no image."""
        if anchor is None or self.broken or anchor.broken:
            return None
        common = sorted(set(self.per_image) & set(anchor.per_image))
        if not common:
            return None
        return self.mean("bpp", common) / anchor.mean("bpp", common), len(common)


def bound_points(rows: list[dict]) -> dict[str, dict[str, dict[float, BoundPoint]]]:
    """{dataset: {codec: {E: point}}} of the error-bounded rows.

    As for the mean curves, an E enters only when every image of its dataset that the codec
    coded has it, so a half-finished run never compares different image sets.
    """
    images: dict[tuple, set] = defaultdict(set)
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r["kind"] != "bound":
            continue
        images[(r["dataset"], r["codec"])].add(r["image"])
        groups[(r["dataset"], r["codec"], float(r["value"]))].append(r)
    out: dict[str, dict[str, dict[float, BoundPoint]]] = defaultdict(lambda: defaultdict(dict))
    for (ds, codec, bound), rs in groups.items():
        if len(rs) != len(images[(ds, codec)]):
            continue
        p = BoundPoint(codec, bound, ", ".join(sorted({r["device"] for r in rs})))
        for r in rs:
            bpp = float(r["bpp"])
            p.per_image[r["image"]] = {"bpp": bpp, "bits_per_subpixel": bpp / int(r["channels"]),
                                       "max_error": float(r["max_abs_error"]), "encode_s": float(r["encode_s"]),
                                       "decode_s": float(r["decode_s"])}
            if breaks_bound(r):
                p.broken[r["image"]] = float(r["max_abs_error"])
        out[ds][codec][bound] = p
    return {ds: {c: dict(sorted(by[c].items())) for c in sorted(by, key=_table_order)} for ds, by in out.items()}


def _table_order(codec: str) -> tuple:
    """visemz's codecs first, then the classical coders in a fixed order, then the others by name."""
    if codec.startswith("visemz-"):
        return (0, codec)
    return (1, LOSSLESS_NAMES.index(codec), codec) if codec in LOSSLESS_NAMES else (2, codec)


def violations(rows: list[dict]) -> list[str]:
    """Every row whose measured maximum error is above its codec's bound, as a line for the report."""
    return [f"{r['dataset']}/{r['image']} {r['codec']} {r['setting']}: maximum error {float(r['max_abs_error']):g} "
            f"> {float(r['value']):g}" for r in rows if breaks_bound(r)]


def _ratio_cell(p: BoundPoint, anchor: BoundPoint | None) -> str:
    if anchor is not None and p.codec == anchor.codec:
        return "1 (anchor)"
    r = p.ratio(anchor)
    if r is None:
        return "-"
    value, common = r
    return f"{value:.3f}x" + ("" if common == p.images == anchor.images else f" ({common} image{'s' * (common > 1)})")


def _cells(p: BoundPoint, colour: bool, ratios: list[str]) -> list[str]:
    if p.broken:
        return [str(p.images), f"bound broken on {len(p.broken)} of {p.images} images: not averaged",
                *([""] if colour else []), *[""] * len(ratios), f"{max(p.broken.values()):g}", "", "", p.device]
    return [str(p.images), f"{p.mean('bpp'):.4f}", *([f"{p.mean('bits_per_subpixel'):.4f}"] if colour else []),
            *ratios, f"{max(v['max_error'] for v in p.per_image.values()):g}", f"{p.mean('encode_s'):.4g}",
            f"{p.mean('decode_s'):.4g}", p.device]


def lossless_table(points: dict[str, dict[float, BoundPoint]], colour: bool) -> list[str]:
    """Markdown rows: every codec at E = 0 with its ratios to JPEG XL lossless and JPEG-LS."""
    at0 = {c: b[0.0] for c, b in points.items() if 0.0 in b}
    if not at0:
        return []
    anchors = {a: at0.get(a) for a in LOSSLESS_ANCHORS}
    head = ["codec", "images", "bpp", *(["bits per sub-pixel"] if colour else []), "x JPEG XL lossless",
            "x JPEG-LS", "max error seen", "encode s", "decode s", "device"]
    return markdown.table(head, ([codec, *_cells(p, colour, [_ratio_cell(p, anchors[a]) for a in LOSSLESS_ANCHORS])]
                                 for codec, p in at0.items()))


def near_lossless_table(points: dict[str, dict[float, BoundPoint]], colour: bool) -> list[str]:
    """Markdown rows: every codec at each E > 0, with its ratio to JPEG-LS at the same E."""
    bounds = sorted({b for by in points.values() for b in by if b > 0})
    if not bounds:
        return []
    head = ["E", "codec", "images", "bpp", *(["bits per sub-pixel"] if colour else []), "x JPEG-LS (same E)",
            "max error seen", "encode s", "decode s", "device"]
    rows = []
    for b in bounds:
        anchor = points.get(NEAR_LOSSLESS_ANCHOR, {}).get(b)
        rows += [[f"{b:g}", codec, *_cells(by[b], colour, [_ratio_cell(by[b], anchor)])]
                 for codec, by in points.items() if b in by]
    return markdown.table(head, rows)


def notes(points: dict[str, dict[float, BoundPoint]]) -> list[str]:
    return [f"- {codec}: {describe(codec)}" for codec in points]


def section(dataset: str, points: dict[str, dict[float, BoundPoint]], colour: bool) -> list[str]:
    """The dataset's lossless and near-lossless tables with what each codec is, for summary.md."""
    out = []
    lt, nt = lossless_table(points, colour), near_lossless_table(points, colour)
    if lt:
        out += ["Lossless (E = 0): mean bits per pixel" + (" (and per sub-pixel: bpp / channels)" if colour else "")
                + "; ratios of mean bpp over the images both codecs coded; seconds per image.", "", *lt, ""]
    if nt:
        out += ["Near-lossless: bits at the same guaranteed maximum error E, in levels of the image's own dtype "
                "(16-bit levels on a 16-bit image); the measured maximum error is checked against E.", "", *nt, ""]
    if out:
        out += ["Codecs:", "", *notes(points), ""]
    return out


def results_json(dataset: str, points: dict[str, dict[float, BoundPoint]], lossless: bool) -> dict:
    """CompressAI-style results of one dataset: per codec, lists aligned on ``max_error`` (E = 0 only, or
    every E > 0).  A (codec, E) that broke its bound is left out of the lists and listed under ``broken``."""
    keep = (lambda b: b == 0) if lossless else (lambda b: b > 0)
    anchors = LOSSLESS_ANCHORS if lossless else (NEAR_LOSSLESS_ANCHOR,)
    codecs, broken = {}, []
    for codec, by in points.items():
        results: dict[str, list] = defaultdict(list)
        for b, p in by.items():
            if not keep(b):
                continue
            if p.broken:
                broken.append({"codec": codec, "max_error": b, "images": p.images, "broken_images": p.broken})
                continue
            results["max_error"].append(b)
            results["images"].append(p.images)
            results["bpp"].append(p.mean("bpp"))
            results["bits_per_subpixel"].append(p.mean("bits_per_subpixel"))
            results["measured_max_error"].append(max(v["max_error"] for v in p.per_image.values()))
            results["encoding_time"].append(p.mean("encode_s"))
            results["decoding_time"].append(p.mean("decode_s"))
            for a in anchors:
                r = p.ratio(points.get(a, {}).get(b))
                results[f"bpp_ratio_to_{a}"].append(None if r is None else r[0])
        if results:
            codecs[codec] = {"name": codec, "description": describe(codec),
                             "device": by[results["max_error"][0]].device, "results": dict(results)}
    what = "lossless (max error 0)" if lossless else "near-lossless (maximum error E > 0 in the image's own levels)"
    return {"name": dataset, "description": f"{what}: means over the dataset's images; times in seconds per image; "
            "ratios of mean bpp over the images both codecs coded", "codecs": codecs, "broken": broken}
