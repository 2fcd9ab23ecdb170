"""scripts/bench_tiles.py: the seams part's figures (PSNR at equal bpp), tiny --seams and --pipeline runs on the CPU."""

import json
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from skimage import data

import visemz

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import bench_tiles  # noqa: E402


def test_psnr_at_equal_bpp_reads_the_untiled_curve_at_the_tiled_rate():
    # untiled points (bpp, PSNR) on PSNR = 30 + 10 log10(bpp): a tiled file at 1.1x the bits and the same PSNR
    # lies 10 log10(1.1) = 0.414 dB below the untiled curve
    curve = {q: (b, 30 + 10 * np.log10(b), 1.1 * b, 30 + 10 * np.log10(b))
             for q, b in ((1, 0.25), (2, 0.5), (3, 1.0), (4, 2.0))}
    assert bench_tiles._psnr_at_equal_bpp(curve, 2) == pytest.approx(-10 * np.log10(1.1), abs=1e-9)
    assert bench_tiles._psnr_at_equal_bpp(curve, 4) is None  # 2.2 bpp: beyond the untiled curve
    row = bench_tiles._seam_row(2, [curve, curve], 256)
    assert row["psnr_tiled_minus_untiled_db"] == 0 and row["bpp_tiled_over_untiled"] == pytest.approx(1.1)
    assert row["psnr_diff_at_equal_bpp_db"] == pytest.approx(-0.4139, abs=1e-4) and row["images_at_equal_bpp"] == 2


def test_seams_mode_runs_only_the_seams(tmp_path, model_weights):
    kodak = tmp_path / "kodak"
    kodak.mkdir()
    cv2.imwrite(str(kodak / "a.png"), np.ascontiguousarray(data.astronaut()[:64, :128, ::-1]))
    out = tmp_path / "seams.json"
    bench_tiles.main(["--seams", "--device", "cpu", "--kodak", str(kodak), "--data", str(tmp_path / "none"),
                      "--seam-tile", "64", "--qualities", "2", "6", "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["sizes"] == [] and not {"untiled", "kodak", "region"} & set(report)
    seams = report["seams"]
    assert (seams["tile"], seams["images"], seams["shapes"]) == (64, 1, ["64x128"])
    assert [r["quality"] for r in seams["rows"]] == [2, 6]
    for r in seams["rows"]:
        assert r["bpp_tiled"] > 0 and r["psnr_tiled"] > 20 and abs(r["psnr_tiled_minus_untiled_db"]) < 1
    assert isinstance(seams["within_0_05_db"], bool) and "bd_psnr_db" in seams


def test_pipeline_mode_runs_tiled_mosaics_and_kodak_through_the_lanes(tmp_path, model_weights):
    sources, kodak = tmp_path / "xray", tmp_path / "kodak"
    sources.mkdir()
    kodak.mkdir()
    cv2.imwrite(str(sources / "a.png"), data.camera()[:100, :120])
    cv2.imwrite(str(sources / "b.png"), data.moon()[:90, :80])
    cv2.imwrite(str(kodak / "k.png"), np.ascontiguousarray(data.astronaut()[:64, :96, ::-1]))
    out, work = tmp_path / "pipe.json", tmp_path / "work"
    bench_tiles.main(["--pipeline", "--device", "cpu", "--data", str(sources), "--kodak", str(kodak), "--tile", "64",
                      "--pipeline-sizes", "128", "--pipeline-images", "2", "--lanes", "2", "--repeats", "1",
                      "--work", str(work), "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["sizes"] == [] and not {"untiled", "kodak", "region", "seams"} & set(report)
    part = report["pipeline"]
    assert (part["lanes"], part["images"], part["work"]) == ([1, 2], 2, str(work / "pipeline"))
    # Kodak repeated to at least the mosaics' pixels: 2 x 128 x 128 over 64 x 96 a file, 6 files
    for rows, files, pixels in ((part["kodak"]["runs"], 6, 6 * 64 * 96), (part["sizes"][0]["runs"], 2, 2 * 128 * 128)):
        assert [r["lanes"] for r in rows] == [1, 2]
        for r in rows:
            assert (r["images"], r["pixels"], r["loaders"]) == (files, pixels, {"cpu": files})
            assert r["seconds"] > 0 and r["bytes"] > 0 and r["bpp"] > 0 and r["memory_mib"] is None
        assert rows[0]["bytes"] == rows[1]["bytes"]  # the lanes write the same files
    size = part["sizes"][0]
    assert (size["size"], size["grid"]) == (128, [2, 2])
    assert set(size["lanes_over_one_lane"]) == {"2"} and isinstance(size["lanes_overlap"], bool)
    assert set(size["over_kodak_per_pixel"]) == set(size["at_least_0_9_of_kodak"]) == {"1", "2"}
    assert size["decoded"]["matches_source_shape"] and size["decoded"]["psnr"] > 20
    # the last timed run's files stay under --work: every one decodes to its source's shape
    outputs = sorted((work / "pipeline" / "out").rglob("*.vsz"))
    assert len(outputs) == 2 * (6 + 2)
    for f in outputs:
        img = visemz.decompress(f.read_bytes(), device="cpu")
        assert img.dtype == np.uint16 and img.shape == ((128, 128) if f.name.startswith("mosaic") else (64, 96))
