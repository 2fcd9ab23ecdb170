"""visemz.benchmarks.zarr_chunks: arguments, the region and rate searches, the stored bytes, and a tiny run
(smoke tests, not measurements); skipped without the 'zarr' extra's libraries."""

from __future__ import annotations

import math
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

zarr = pytest.importorskip("zarr")
numcodecs = pytest.importorskip("numcodecs")

from visemz.benchmarks import common  # noqa: E402
from visemz.benchmarks import zarr_chunks as bench_zarr  # noqa: E402

from .helpers import optional  # noqa: E402
from .test_benchmarks import IMAGECODECS_ROWS, _report, _smooth  # noqa: E402


def _zarr_data(folder: Path) -> Path:
    """Two smooth images of other sizes than the mosaic: a 16-bit one and an 8-bit one."""
    folder.mkdir(parents=True)
    cv2.imwrite(str(folder / "a16.png"), _smooth((80, 90), np.uint16, sigma=3))
    cv2.imwrite(str(folder / "b8.png"), _smooth((50, 100)))
    return folder


def test_zarr_arguments():
    args = bench_zarr.parse_args(["--data", "DATA", "--out", "x.json"])
    assert (args.size, args.chunk, args.quality, args.codecs) == (16384, 4096, 4.0, list(bench_zarr.CODECS))
    assert bench_zarr.parse_args(["--data", "DATA", "--out", "x.json", "--chunk", "2048"]).chunk == 2048
    bad = [["--size", "256", "--chunk", "256"], ["--repeats", "0"], ["--codecs", "jpeg"], ["--calib-steps", "0"],
           ["--calib-tol", "0"], ["--calib-tol", "1"]]
    if not torch.cuda.is_available():
        bad.append(["--device", "cuda"])
    for argv in bad:
        with pytest.raises(SystemExit) as e:
            bench_zarr.parse_args(["--data", "DATA", "--out", "x.json", *argv])
        assert e.value.code == 2


@pytest.mark.parametrize("size,chunk", [(16384, 4096), (16384, 2048), (256, 128), (1000, 300), (600, 256)])
def test_zarr_region_crosses_a_chunk_corner_off_the_grid(size, chunk):
    y0, y1, x0, x1 = bench_zarr.region_window(size, chunk)
    assert (y0, y1) == (x0, x1) and y1 - y0 == min(1024, chunk) and 0 <= y0 < y1 <= size
    assert y0 % chunk and y0 // chunk != (y1 - 1) // chunk  # off the grid, across a chunk edge: four chunks


@pytest.mark.parametrize("name", sorted(bench_zarr.KNOBS))
@pytest.mark.parametrize("target", [0.0215, 0.196, 3.0])
def test_zarr_rate_search_reaches_the_target_within_its_tolerance(name, target):
    """On smooth monotone rate curves of either direction (bpp exponential in a PSNR-like setting, a power of a
    distance) the search ends within 2% of the target in at most 8 trials, from a start on either side."""
    knob = bench_zarr.KNOBS[name]
    curve = (lambda x: 0.01 * math.exp(0.17 * (x - 20))) if knob.increasing else (lambda x: 0.4 * math.exp(-1.1 * x))
    for start in (knob.lo + 0.3 * (knob.hi - knob.lo), knob.lo + 0.7 * (knob.hi - knob.lo)):
        got = bench_zarr.match_rate(curve, target, knob, start, 0.02, 8)
        assert got["within_tol"] and abs(got["bpp"] / target - 1) <= 0.02 and len(got["trials"]) <= 8, got
        assert got["key"] == knob.key and [got["value"], got["bpp"]] in got["trials"]


def test_zarr_rate_search_stops_at_a_bound_it_cannot_pass():
    knob = bench_zarr.KNOBS["jpeg2k_lossy"]
    got = bench_zarr.match_rate(lambda x: 1.0, 0.2, knob, 40.0, 0.02, 8)  # a codec whose rate does not move
    assert not got["within_tol"] and got["bpp_over_target"] == 5.0 and got["trials"][-1][0] == knob.lo


def test_zarr_array_bpp_counts_every_chunk_as_zarr_stores_it(tmp_path):
    img = (np.arange(200 * 130, dtype=np.uint16) * 37).reshape(200, 130)
    codec = numcodecs.get_codec({"id": "zlib", "level": 5})
    arr = bench_zarr.create(tmp_path / "a.ome.zarr", img.shape, 64, codec)
    arr[...] = img
    stored, files = bench_zarr.chunk_bytes(tmp_path / "a.ome.zarr")
    assert files == 4 * 3 and bench_zarr.array_bpp(img, 64, codec) == pytest.approx(stored * 8 / img.size, abs=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_zarr_tiny_run(tmp_path, model_weights, device):
    if device == "cuda":
        optional("nvidia.nvcomp")  # the GPU's entropy stage
    data_dir, work, out = _zarr_data(tmp_path / "data"), tmp_path / "work", tmp_path / "bench.json"
    bench_zarr.main(["--data", str(data_dir), "--size", "128", "--chunk", "64", "--device", device, "--repeats", "1",
                     "--calib-steps", "6", "--work", str(work), "--out", str(out)])
    report = _report(out)
    img = common.mosaic(common.sources(data_dir), 128)
    assert (report["device_kind"], report["size"], report["chunk"], report["raw_bytes"]) == \
        (device, 128, 64, img.nbytes)
    assert report["distinct_values"] == len(np.unique(img)) and report["versions"]["zarr"] == zarr.__version__
    assert set(report["versions"]) >= {"zarr", "numcodecs", "imagecodecs", "visemz"}
    rows = report["rows"]
    assert list(rows) == list(bench_zarr.CODECS)
    for name in ("visemz_lossless", "visemz_lossy"):
        row = rows[name]
        assert row["chunks"] == 4 and row["ratio"] > 1 and row["config"]["device"] == device
        assert row["write_s"] > 0 and row["read_all_s"] > 0 and row["region_s"] > 0
        if device == "cuda":
            assert row["gpu_peak_mib"] > 0
        else:  # the CPU decodes a chunk the same way every time (on the GPU cuDNN may pick other algorithms)
            assert row["gpu_peak_mib"] is None and row["region_equals_full_window"]
    assert rows["visemz_lossless"]["exact"] and rows["visemz_lossless"]["config"]["max_error"] == 0
    lossy = rows["visemz_lossy"]
    assert not lossy["exact"] and math.isfinite(lossy["psnr"]) and lossy["psnr"] > 0 and lossy["max_abs_error"] > 0

    # the store is an OME-Zarr-shaped group whose level 0 reads back, freshly opened, as the mosaic
    group = zarr.open_group(str(work / "visemz_lossless.ome.zarr"), mode="r")
    (ms,) = group.attrs["multiscales"]
    assert ms["version"] == "0.4" and [a["name"] for a in ms["axes"]] == ["y", "x"] and ms["datasets"][0]["path"] == "0"
    level = group["0"]
    assert level.chunks == (64, 64) and level.compressor.get_config()["id"] == "visemz"
    assert np.array_equal(level[...], img)
    stored = sum(f.stat().st_size for f in (work / "visemz_lossless.ome.zarr" / "0").rglob("*") if f.is_file()
                 and not f.name.startswith("."))
    assert stored == rows["visemz_lossless"]["stored_bytes"]

    for name in IMAGECODECS_ROWS:  # measured where imagecodecs is installed, otherwise skipped with the reason
        row = rows[name]
        if "skipped" in row:
            assert "imagecodecs" in row["skipped"]
        elif name.endswith("lossless"):
            assert row["exact"] and row["ratio"] > 1
        else:
            assert not row["exact"] and math.isfinite(row["psnr"])
            calibration = report["calibration"][name]
            assert calibration["target_bpp"] == pytest.approx(lossy["stored_bytes"] * 8 / img.size)
            # the row stores exactly the bytes its calibration's chosen setting coded
            assert row["bpp_over_target"] == pytest.approx(calibration["bpp_over_target"], abs=1e-3)
            assert row["config"][calibration["key"]] == calibration["value"] and len(calibration["trials"]) <= 6


def test_zarr_missing_imagecodecs_rows_are_skipped(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_zarr, "imagecodecs", None)
    monkeypatch.setattr(bench_zarr, "IMAGECODECS_MISSING", "imagecodecs is not installed (test)")
    out = tmp_path / "bench.json"
    bench_zarr.main(["--data", str(_zarr_data(tmp_path / "data")), "--size", "256", "--chunk", "128", "--device",
                     "cpu", "--codecs", *IMAGECODECS_ROWS, "--out", str(out)])
    report = _report(out)
    assert report["rows"] == {name: {"skipped": "imagecodecs is not installed (test)"} for name in IMAGECODECS_ROWS}
    assert report["versions"]["imagecodecs"] is None
