"""The evaluation's lossless and near-lossless side: the classical lossless coders, bounds in the image's
own levels (16-bit levels on 16-bit images), gray crops, the tables, the results files."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest

from visemz.errors import InvalidArgumentError, UnsupportedFormatError
from visemz.evaluation import bound_tables, report
from visemz.evaluation.codecs import LOSSLESS_NAMES, NAMES, Layout, build, describe, parse_bounded
from visemz.evaluation.datasets import View, find_datasets, model_sets, to_gray
from visemz.evaluation.runner import EvalConfig, evaluate, read_points, run_points

from .helpers import max_abs_error
from .test_evaluation import tiny

pytestmark = pytest.mark.usefixtures("eval_extra")


def tiny16(channels: int, seed: int = 0, side: int = 64) -> np.ndarray:
    """A 16-bit image using the whole range: smooth structure, then noise of some hundred 16-bit levels."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:side, 0:side]
    base = 30000 + 20000 * np.sin(x / 7.0) * np.cos(y / 11.0) + rng.normal(0, 300, (side, side))
    planes = [np.clip(base + 4000 * c, 0, 65535) for c in range(channels)]
    return np.round(np.stack(planes, -1) if channels == 3 else planes[0]).astype(np.uint16)


def _roundtrip(codec, image, setting):
    data = codec.encode(image, setting)
    rec = codec.decode(data, setting, Layout.of(image))
    assert rec.shape == image.shape and rec.dtype == image.dtype and len(data) > 0
    return data, rec


# ------------------------------------------------------------------ codecs and bounds
SIXTEEN_BIT = ["jpeg2000", "jpegxl", "sz3", "zfp", "png", "jpegls", "jpeg2000-lossless", "jpegxl-lossless",
               "visemz-balle2016-maxerr"]


@pytest.mark.parametrize("name", SIXTEEN_BIT)
def test_16_bit_images_get_curves_and_bounds_in_16_bit_levels(name, model_weights):
    """Every setting E of an error-bounded codec is E 16-bit levels on a 16-bit image (not E x 257), and the
    bound holds; the lossy JPEG 2000 and JPEG XL curves apply to 16-bit images too."""
    codec = build(name, "cpu")
    for channels in (1, 3):
        image = tiny16(channels, seed=channels)
        why_not = codec.supports(Layout.of(image))
        if name == "jpeg2000" and channels == 3:
            assert why_not and "8-bit" in why_not  # Pillow has no 16-bit RGB
            continue
        assert why_not is None
        for s in codec.ladder:
            _, rec = _roundtrip(codec, image, s)
            if codec.kind == "bound":
                assert max_abs_error(image, rec) <= s, (name, s)
    if codec.kind == "bound" and codec.ladder != (0,):
        assert min(s for s in codec.ladder if s > 0) == 1  # the smallest bound is one 16-bit level


def test_visemz_near_lossless_uses_its_bound_on_16_bit_images(model_weights):
    """E = 4 on a noisy 16-bit image leaves errors up to 4 levels and costs fewer bits than lossless: the bound
    is spent, in 16-bit levels; lossless is exact."""
    codec = build("visemz-mbt2018-mean-maxerr", "cpu")
    image = tiny16(1, seed=3)
    sizes = {}
    for e in (0, 4):
        data, rec = _roundtrip(codec, image, e)
        sizes[e] = len(data)
        assert max_abs_error(image, rec) == e
    assert sizes[4] < sizes[0]


@pytest.mark.parametrize("name", LOSSLESS_NAMES)
def test_lossless_coders_are_exact_on_8_bit_gray_and_rgb(name):
    codec = build(name, "cpu")
    assert codec.kind == "bound" and 0 in codec.ladder
    for channels in (1, 3):
        image = tiny(channels, seed=channels)
        _, rec = _roundtrip(codec, image, 0)
        assert np.array_equal(rec, image), name


def test_jpegls_near_lossless_spends_its_bound():
    codec = build("jpegls", "cpu")
    assert codec.ladder == (0, 1, 2, 4, 8)
    image = tiny(1)
    sizes = []
    for e in codec.ladder:
        data, rec = _roundtrip(codec, image, e)
        assert max_abs_error(image, rec) == e
        sizes.append(len(data))
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] < sizes[0]


def test_which_codecs_take_which_images():
    gray16, rgb16 = Layout((8, 8), "uint16"), Layout((8, 8, 3), "uint16")
    for name in ("jpeg", "webp", "webp-lossless"):
        assert "8" in build(name, "cpu").supports(gray16)
    assert build("jpeg2000", "cpu").supports(gray16) is None and build("jpeg2000", "cpu").supports(rgb16)
    for name in ("jpegxl", "png", "jpegls", "jpeg2000-lossless", "jpegxl-lossless"):
        assert build(name, "cpu").supports(rgb16) is None
        assert "gray or RGB" in build(name, "cpu").supports(Layout((8, 8, 2), "uint8"))
    assert set(LOSSLESS_NAMES) <= set(NAMES)


def test_visemz_bounded_quality_is_a_setting_of_its_name(model_weights):
    default = build("visemz-balle2016-maxerr", "cpu")
    assert (default.name, default.quality, default.ladder) == ("visemz-balle2016-maxerr", 4.0, (0, 1, 2, 4, 8))
    other = build("visemz-balle2016-maxerr-q6.5", "cpu")
    assert (other.name, other.quality, other.arch) == ("visemz-balle2016-maxerr-q6.5", 6.5, "balle2016")
    assert build("visemz-balle2016-maxerr-q4", "cpu").name == "visemz-balle2016-maxerr"  # the default's own name
    assert parse_bounded("visemz-mbt2018-mean-maxerr-q2") == ("mbt2018-mean", 2.0)
    assert parse_bounded("visemz-other-maxerr-q2") is None and parse_bounded("visemz-balle2016-maxerr") is None
    for bad in ("visemz-balle2016-maxerr-q9", "visemz-balle2016-maxerr-qbest"):
        with pytest.raises(InvalidArgumentError, match=bad):
            build(bad, "cpu")
    assert "model quality 6.5" in describe("visemz-balle2016-maxerr-q6.5")
    assert "model quality 4" in describe("visemz-mbt2018-mean-maxerr")
    assert "effort 7" in describe("jpegxl-lossless") and "5/3" in describe("jpeg2000-lossless")


# ------------------------------------------------------------------ views: gray crops
def test_view_crops_the_centre_and_converts_to_gray():
    img = np.arange(10 * 12 * 3, dtype=np.uint16).reshape(10, 12, 3)
    out = View(crop=4).apply(img)
    assert np.array_equal(out, img[3:7, 4:8])
    assert View(crop=50).apply(img).shape == img.shape  # a short side is kept whole
    g = View(crop=4, gray=True).apply(img)
    assert g.shape == (4, 4) and g.dtype == np.uint16
    assert np.array_equal(g, cv2.cvtColor(np.ascontiguousarray(img), cv2.COLOR_RGB2GRAY)[3:7, 4:8])
    assert np.array_equal(to_gray(img[..., 0]), img[..., 0]) and np.array_equal(to_gray(img[..., :1]), img[..., 0])
    with pytest.raises(UnsupportedFormatError, match=r"\(10, 12, 2\)"):
        to_gray(img[..., :2])
    for bad in (0, -3, True, 2.5):
        with pytest.raises(InvalidArgumentError, match=f"crop={bad!r}"):
            EvalConfig(crop=bad)
    assert View(crop=512, gray=True).suffix == "-gray-crop512" and View().suffix == ""


@pytest.fixture
def sets(tmp_path):
    """Three datasets of one image each: 8-bit RGB, 8-bit gray and 16-bit gray."""
    root = tmp_path / "sets"
    for d in ("rgb", "gray", "gray16"):
        (root / d).mkdir(parents=True)
    cv2.imwrite(str(root / "rgb/a.png"), cv2.cvtColor(tiny(3, 1, side=80), cv2.COLOR_RGB2BGR))
    cv2.imwrite(str(root / "gray/b.png"), tiny(1, 2, side=80))
    cv2.imwrite(str(root / "gray16/c.png"), tiny16(1, 3, side=80))
    return root


def test_model_sets_are_kodak_for_rgb_and_the_xrays_with_kodaks_luma_for_gray(tmp_path):
    """The sets a model card and the CompressAI comparison report, under DATA/eval, by file name."""
    (tmp_path / "eval" / "kodak").mkdir(parents=True)
    (tmp_path / "eval" / "xray").mkdir()
    rgb = [tiny(3, k) for k in range(3)]
    for k, img in enumerate(rgb):
        cv2.imwrite(str(tmp_path / f"eval/kodak/k{k}.png"), cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
    cv2.imwrite(str(tmp_path / "eval/xray/x.png"), tiny(1, 5))
    color = model_sets(tmp_path, "rgb", limit=2)
    assert list(color) == ["kodak"] and [n for n, _ in color["kodak"]] == ["k0.png", "k1.png"]
    assert all(np.array_equal(got, want) for (_, got), want in zip(color["kodak"], rgb))
    gray = model_sets(tmp_path, "gray")
    assert list(gray) == ["xray", "kodak-gray"] and np.array_equal(gray["xray"][0][1], tiny(1, 5))
    assert [n for n, _ in gray["kodak-gray"]] == ["k0.png", "k1.png", "k2.png"]
    assert all(np.array_equal(got, to_gray(want)) for (_, got), want in zip(gray["kodak-gray"], rgb))


def test_gray_crops_run_as_their_own_datasets(sets, tmp_path):
    names = find_datasets(sets, ("rgb",), None, View(crop=48, gray=True))
    assert list(names) == ["rgb-gray-crop48"]
    cfg = EvalConfig(codecs=("png",), crop=48, gray=True)
    run_points(sets, tmp_path / "out", cfg, log=lambda m: None)
    rows = read_points(tmp_path / "out/points.csv")
    assert {r["dataset"] for r in rows} == {"rgb-gray-crop48", "gray-gray-crop48", "gray16-gray-crop48"}
    assert all((r["height"], r["width"], r["channels"]) == ("48", "48", "1") for r in rows)
    # the whole images are other datasets: a run without the view computes its own points
    again = run_points(sets, tmp_path / "out", EvalConfig(codecs=("png",)), log=lambda m: None)
    assert again.computed == 3 and again.skipped == 0


# ------------------------------------------------------------------ tables
def _row(ds, image, codec, e, bpp, err, channels=1, enc=0.5, dec=0.25):
    return {"dataset": ds, "image": image, "codec": codec, "setting": f"e={e:g}", "value": str(float(e)),
            "kind": "bound", "device": "cpu", "height": "8", "width": "8", "channels": str(channels), "bytes": "8",
            "bpp": str(bpp), "psnr": "inf" if err == 0 else "50", "ssim": "1", "ms_ssim": "1", "gmsd": "0",
            "max_abs_error": str(err), "encode_s": str(enc), "decode_s": str(dec)}


ROWS = [
    _row("s", "i1", "jpegxl-lossless", 0, 4.0, 0), _row("s", "i2", "jpegxl-lossless", 0, 6.0, 0),
    _row("s", "i1", "jpegls", 0, 5.0, 0), _row("s", "i2", "jpegls", 0, 5.0, 0),
    _row("s", "i1", "jpegls", 2, 2.0, 2), _row("s", "i2", "jpegls", 2, 3.0, 1),
    _row("s", "i1", "visemz-x-maxerr", 0, 4.5, 0, enc=1.0), _row("s", "i2", "visemz-x-maxerr", 0, 7.5, 0, enc=3.0),
    _row("s", "i1", "visemz-x-maxerr", 2, 2.0, 2), _row("s", "i2", "visemz-x-maxerr", 2, 2.0, 2),
    _row("s", "i1", "png", 0, 7.0, 0), _row("s", "i2", "png", 0, 9.0, 3),  # png "broke" lossless on i2
    _row("s", "i1", "webp-lossless", 0, 3.0, 0),  # only one image: ratios over the images both coded
]


def test_tables_check_bounds_and_give_ratios_over_common_images():
    points = bound_tables.bound_points(ROWS)["s"]
    v = points["visemz-x-maxerr"][0.0]
    assert v.mean("bpp") == 6.0 and v.mean("encode_s") == 2.0
    assert v.ratio(points["jpegxl-lossless"][0.0]) == (6.0 / 5.0, 2)
    assert v.ratio(points["jpegls"][0.0]) == (6.0 / 5.0, 2)
    assert points["visemz-x-maxerr"][2.0].ratio(points["jpegls"][2.0]) == (2.0 / 2.5, 2)
    assert points["webp-lossless"][0.0].ratio(points["jpegxl-lossless"][0.0]) == (3.0 / 4.0, 1)
    png = points["png"][0.0]
    assert png.broken == {"i2": 3.0} and png.ratio(points["jpegls"][0.0]) is None
    md = "\n".join(bound_tables.section("s", points, colour=False))
    assert "| visemz-x-maxerr | 2 | 6.0000 | 1.200x | 1.200x | 0 | 2 | 0.25 | cpu |" in md
    assert "| png | 2 | bound broken on 1 of 2 images: not averaged |" in md
    assert "| webp-lossless | 1 | 3.0000 | 0.750x (1 image) |" in md
    assert "| 2 | visemz-x-maxerr | 2 | 2.0000 | 0.800x | 2 |" in md and \
        "| 2 | jpegls | 2 | 2.5000 | 1 (anchor) | 2 |" in md
    assert bound_tables.violations(ROWS) == ["s/i2 png e=0: maximum error 3 > 0"]
    # the broken point is in no curve either, and the summary lists it
    curves = report.mean_curves(ROWS)
    assert "png" not in curves["s"] and [p["setting"] for p in curves["s"]["jpegls"]] == ["e=2", "e=0"]
    md = report.summary_markdown(curves, [], "test", rows=ROWS)
    assert "## Broken bounds" in md and "- s/i2 png e=0: maximum error 3 > 0" in md


def test_results_json_is_compressai_style():
    points = bound_tables.bound_points(ROWS)["s"]
    lossless = bound_tables.results_json("s", points, lossless=True)
    v = lossless["codecs"]["visemz-x-maxerr"]["results"]
    assert v["max_error"] == [0.0] and v["bpp"] == [6.0] and v["bpp_ratio_to_jpegxl-lossless"] == [1.2]
    assert v["encoding_time"] == [2.0] and v["measured_max_error"] == [0.0]
    assert "png" not in lossless["codecs"]
    assert lossless["broken"] == [{"codec": "png", "max_error": 0.0, "images": 2, "broken_images": {"i2": 3.0}}]
    near = bound_tables.results_json("s", points, lossless=False)
    assert set(near["codecs"]) == {"jpegls", "visemz-x-maxerr"}
    assert near["codecs"]["visemz-x-maxerr"]["results"]["bpp_ratio_to_jpegls"] == [0.8]
    json.dumps(lossless), json.dumps(near)  # plain JSON


# ------------------------------------------------------------------ whole runs
CODECS = ("jpeg2000", "jpegxl", "png", "jpegls", "jpeg2000-lossless", "jpegxl-lossless", "webp-lossless",
          "visemz-balle2016-maxerr")
LADDERS = (("jpeg2000", (0.5, 2.0)), ("jpegxl", (4.0, 1.0)), ("jpegls", (0, 2)), ("visemz-balle2016-maxerr", (0, 2)))


def test_lossless_run_writes_tables_and_results_files(sets, tmp_path, model_weights):
    out = tmp_path / "out"
    evaluate(sets, out, EvalConfig(codecs=CODECS, ladders=LADDERS, crops=False), log=lambda m: None)
    rows = read_points(out / "points.csv")
    by = {(r["dataset"], r["codec"], r["setting"]): r for r in rows}
    # 16-bit: every classical lossless coder but WebP, lossy JPEG 2000 and JPEG XL curves
    assert {c for d, c, _ in by if d == "gray16"} == set(CODECS) - {"webp-lossless"}
    assert all(float(r["max_abs_error"]) <= float(r["value"]) for r in rows if r["kind"] == "bound")
    for ds in ("rgb", "gray", "gray16"):
        doc = json.loads((out / "lossless" / f"{ds}.json").read_text())
        for codec, c in doc["codecs"].items():
            assert c["results"]["bpp"] == [pytest.approx(float(by[(ds, codec, "e=0")]["bpp"]))]
            assert c["results"]["measured_max_error"] == [0.0]
        jxl = float(by[(ds, "jpegxl-lossless", "e=0")]["bpp"])
        v = doc["codecs"]["visemz-balle2016-maxerr"]["results"]
        assert v["bpp_ratio_to_jpegxl-lossless"] == [pytest.approx(v["bpp"][0] / jxl)]
        near = json.loads((out / "near-lossless" / f"{ds}.json").read_text())
        assert set(near["codecs"]) == {"jpegls", "visemz-balle2016-maxerr"}
        assert near["codecs"]["jpegls"]["results"]["max_error"] == [2.0]
        rd = json.loads((out / "rd" / f"{ds}.json").read_text())
        assert {"jpeg2000", "jpegxl"} <= set(rd["codecs"]) and "png" not in rd["codecs"]
    rgb = json.loads((out / "lossless/rgb.json").read_text())["codecs"]["png"]["results"]
    assert rgb["bits_per_subpixel"] == [pytest.approx(rgb["bpp"][0] / 3)]
    md = (out / "summary.md").read_text()
    assert md.count("Lossless (E = 0)") == 3 and md.count("| 2 | visemz-balle2016-maxerr |") == 3
    assert "| jpeg2000 | 0 (anchor) |" in md.split("## gray16")[1]  # the 16-bit set's BD table
    assert "bits per sub-pixel" in md.split("## rgb")[1] and "bits per sub-pixel" not in md.split("## rgb")[0]
    assert "Plots: rd_gray16.png." in md and "crops_" not in md  # the figures written, and only them


def test_cli_eval_ladder_of_bounds_on_gray_crops(sets, tmp_path, cli):
    r = cli("eval", sets, "--out", tmp_path / "o", "--device", "cpu", "--codecs", "png,jpegls",
            "--ladder", "jpegls=0,1", "--crop", "40", "--gray", "--datasets", "rgb", "--no-crops")
    assert r.exit_code == 0, r.stderr
    rows = read_points(tmp_path / "o/points.csv")
    assert sorted((r["dataset"], r["codec"], r["setting"], r["height"]) for r in rows) == [
        ("rgb-gray-crop40", "jpegls", "e=0", "40"), ("rgb-gray-crop40", "jpegls", "e=1", "40"),
        ("rgb-gray-crop40", "png", "e=0", "40")]
    assert (tmp_path / "o/lossless/rgb-gray-crop40.json").is_file()


def test_cli_eval_takes_gray_crops(sets, tmp_path, cli):
    out = tmp_path / "report"
    r = cli("eval", sets, "--codecs", "png", "--out", out, "--device", "cpu", "--crop", "32", "--gray",
            "--datasets", "gray16")
    assert r.exit_code == 0, r.stderr
    rows = read_points(out / "points.csv")
    assert [(r["dataset"], r["height"], r["bpp"] != "") for r in rows] == [("gray16-gray-crop32", "32", True)]
    r = cli("eval", sets, "--out", tmp_path / "o2", "--device", "cpu", "--crop", "0")
    assert r.exit_code == 2 and "crop=0" in r.stderr
