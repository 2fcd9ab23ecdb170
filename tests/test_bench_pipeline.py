"""scripts/bench_pipeline.py: its arguments, and a tiny run of every part on the CPU."""

import json
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import bench_pipeline  # noqa: E402


def test_arguments():
    quick = bench_pipeline.parse_args(["--data", "DATA", "--quick"])
    assert (quick.repeat, quick.streams, quick.repeat_to) == (1, [4], 200)
    full = bench_pipeline.parse_args(["--data", "DATA", "--streams", "2,8", "--repeat-to", "600"])
    assert (full.repeat, full.streams, full.repeat_to) == (3, [2, 8], 600)
    assert bench_pipeline.parse_args(["--data", "DATA", "--no-dali"]).loader == "cpu"
    for bad in (["--streams", "2,x"], ["--streams", "0"], ["--torchrun"], ["--repeat", "0"]):
        with pytest.raises(SystemExit) as e:
            bench_pipeline.parse_args(["--data", "DATA", *bad])
        assert e.value.code == 2


def test_tiny_cpu_run(tmp_path, model_weights):
    rng = np.random.default_rng(0)
    data = tmp_path / "data"
    (data / "kodak").mkdir(parents=True)
    (data / "xray").mkdir()
    for i in range(2):
        cv2.imwrite(str(data / f"kodak/{i}.png"), cv2.GaussianBlur(rng.integers(0, 256, (64, 96, 3), dtype=np.uint8),
                                                                   (0, 0), 2))
    cv2.imwrite(str(data / "xray/0.png"), cv2.GaussianBlur(rng.integers(0, 256, (80, 64), dtype=np.uint8), (0, 0), 2))
    out = tmp_path / "bench.json"
    bench_pipeline.main(["--data", str(data), "--work", str(tmp_path / "work"), "--out", str(out), "--device", "cpu",
                         "--quick", "--repeat-to", "5", "--streams", "2"])
    report = json.loads(out.read_text())
    assert report["device"] == "CPU only" and report["folder"] == {"distinct": 3, "files": 6}
    labels = [r["label"] for r in report["runs"]]
    assert labels[:4] == ["b: visemz 1 stream", "c: visemz 2 streams", "b: decompress 1 stream",
                          "c: decompress 2 streams"]
    assert "a: compressai-loop" in labels and any(lbl.startswith("d: nvjpeg q") for lbl in labels)
    assert all(r["failed"] == 0 and r["done"] == r["files"] and r["images_per_s"] > 0 for r in report["runs"])
    q = report["quality"]
    # same weights, same symbols: CompressAI's reconstruction is visemz's
    assert abs(q["compressai"]["psnr"] - q["visemz"]["psnr"]) < 0.01
    assert q["nvjpeg"]["psnr"] >= q["visemz"]["psnr"] or q["nvjpeg"]["jpeg_quality"] == 100
    assert set(report["ratios"]) >= {"multi_over_single", "compress_over_decompress", "multi_over_compressai",
                                     "multi_over_nvjpeg", "bits_saved_vs_jpeg"}
