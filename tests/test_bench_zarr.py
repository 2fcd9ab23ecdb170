"""scripts/bench_zarr.py: its arguments, the region it reads, and a tiny run on the CPU through real
Zarr v2 stores (imagecodecs' rows measured where it is installed, skipped with a reason where not)."""

import json
import math
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import zarr

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import bench_zarr  # noqa: E402
import evalkit  # noqa: E402

from .helpers import optional  # noqa: E402

IMAGECODECS_ROWS = ("jpeg2k_lossless", "jpegxl_lossless", "jpeg2k_lossy")


def _data(folder: Path) -> Path:
    """Two smooth images of other sizes than the mosaic: a 16-bit one and an 8-bit one."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    cv2.imwrite(str(folder / "a16.png"), cv2.GaussianBlur(rng.integers(0, 65536, (80, 90), dtype=np.uint16), (0, 0), 3))
    cv2.imwrite(str(folder / "b8.png"), cv2.GaussianBlur(rng.integers(0, 256, (50, 100), dtype=np.uint8), (0, 0), 2))
    return folder


def test_arguments():
    args = bench_zarr.parse_args(["--out", "x.json"])
    assert (args.size, args.chunk, args.quality, args.codecs) == (16384, 4096, 4.0, list(bench_zarr.CODECS))
    assert bench_zarr.parse_args(["--out", "x.json", "--chunk", "2048"]).chunk == 2048
    bad = [["--size", "256", "--chunk", "256"], ["--repeats", "0"], ["--codecs", "jpeg"], ["--calib-steps", "0"]]
    if not torch.cuda.is_available():
        bad.append(["--device", "cuda"])
    for argv in bad:
        with pytest.raises(SystemExit) as e:
            bench_zarr.parse_args(["--out", "x.json", *argv])
        assert e.value.code == 2


@pytest.mark.parametrize("size,chunk", [(16384, 4096), (16384, 2048), (256, 128), (1000, 300), (600, 256)])
def test_region_crosses_a_chunk_corner_off_the_grid(size, chunk):
    y0, y1, x0, x1 = bench_zarr.region_window(size, chunk)
    assert (y0, y1) == (x0, x1) and y1 - y0 == min(1024, chunk) and 0 <= y0 < y1 <= size
    assert y0 % chunk and y0 // chunk != (y1 - 1) // chunk  # off the grid, across a chunk edge: four chunks


def test_calibration_windows_spread_over_the_grid():
    img = np.arange(512 * 512, dtype=np.uint16).reshape(512, 512)
    windows = bench_zarr.calibration_windows(img, 128, 4, 64)
    firsts = [int(w[0, 0]) for w in windows]
    # chunks 0, 5, 10 and 15 of the 4 x 4 grid, each window centred in its chunk
    assert [w.shape for w in windows] == [(64, 64)] * 4
    assert firsts == [int(img[32 + 128 * i, 32 + 128 * i]) for i in range(4)]
    assert len(bench_zarr.calibration_windows(img, 256, 9, 1024)) == 4  # no more windows than chunks


def test_mosaic_gaps_are_zero():
    # a row is as tall as its tallest image: under a shorter one the mosaic is 0, never stale memory
    a, b = np.full((3, 5), 7, np.uint16), np.full((2, 4), 9, np.uint16)
    out = evalkit.mosaic([a, b], 8)
    assert out[:3, :5].tolist() == [[7] * 5] * 3 and (out[:2, 5:] == 9).all() and (out[2, 5:] == 0).all()
    assert set(np.unique(out)) <= {0, 7, 9}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_tiny_run(tmp_path, model_weights, device):
    if device == "cuda":
        optional("nvidia.nvcomp")  # the GPU's entropy stage
    data, work, out = _data(tmp_path / "data"), tmp_path / "work", tmp_path / "bench.json"
    bench_zarr.main(["--data", str(data), "--size", "128", "--chunk", "64", "--device", device, "--repeats", "1",
                     "--calib-steps", "4", "--calib-window", "32", "--work", str(work), "--out", str(out)])
    report = json.loads(out.read_text())
    img = evalkit.mosaic(evalkit.sources(data), 128)
    assert (report["device_kind"], report["size"], report["chunk"], report["raw_bytes"]) == (device, 128, 64, img.nbytes)
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
    stored = sum(f.stat().st_size for f in (work / "visemz_lossless.ome.zarr" / "0").rglob("*") if f.is_file() and not f.name.startswith("."))
    assert stored == rows["visemz_lossless"]["stored_bytes"]

    for name in IMAGECODECS_ROWS:  # measured where imagecodecs is installed, otherwise skipped with the reason
        row = rows[name]
        if "skipped" in row:
            assert "imagecodecs" in row["skipped"]
        elif name.endswith("lossless"):
            assert row["exact"] and row["ratio"] > 1
        else:
            assert not row["exact"] and math.isfinite(row["psnr"])
            assert report["jpeg2k_calibration"]["target_bpp"] == lossy["bpp"]


def test_missing_imagecodecs_rows_are_skipped(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_zarr, "imagecodecs", None)
    monkeypatch.setattr(bench_zarr, "IMAGECODECS_MISSING", "imagecodecs is not installed (test)")
    out = tmp_path / "bench.json"
    bench_zarr.main(["--data", str(_data(tmp_path / "data")), "--size", "256", "--chunk", "128", "--device", "cpu",
                     "--codecs", *IMAGECODECS_ROWS, "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["rows"] == {name: {"skipped": "imagecodecs is not installed (test)"} for name in IMAGECODECS_ROWS}
    assert report["versions"]["imagecodecs"] is None
