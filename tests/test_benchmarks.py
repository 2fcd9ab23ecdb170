"""visemz.benchmarks: each benchmark's ``main`` on the tiniest inputs, in a temporary folder, and the keys of
the report it writes (smoke tests of the benchmarks, not measurements; the GPU-only ones on a GPU), with the
figures some of them compute checked on known inputs."""

from __future__ import annotations

import importlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from skimage import data

import visemz
from visemz.benchmarks import common
from visemz.benchmarks import pipeline as bench_pipeline
from visemz.benchmarks import tiles as bench_tiles

from .helpers import optional

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ("collectives", "encoder", "float64_layers", "lossless", "network", "pipeline", "profile_codec",
              "profile_collectives", "rans", "refine", "tiles", "vs_compressai", "zarr_chunks")
IMAGECODECS_ROWS = ("jpeg2k_lossless", "jpegxl_lossless", "jpeg2k_lossy", "jpegxl_lossy")


def _smooth(shape, dtype=np.uint8, seed: int = 0, sigma: float = 2) -> np.ndarray:
    """A blurred random image: compressible, but not trivially."""
    top = np.iinfo(dtype).max + 1
    return cv2.GaussianBlur(np.random.default_rng(seed).integers(0, top, shape, dtype=dtype), (0, 0), sigma)


def _report(path: Path) -> dict:
    return json.loads(path.read_text())


# ------------------------------------------------------------------ the package
def test_import_visemz_does_not_import_the_benchmarks():
    code = "import sys, visemz; print(any(m.startswith('visemz.benchmarks') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["False"]


def test_the_package_lists_every_benchmark():
    found = sorted(p.stem for p in (ROOT / "visemz" / "benchmarks").glob("*.py") if p.stem not in ("__init__",
                                                                                                   "common"))
    assert found == sorted(BENCHMARKS)
    doc = importlib.import_module("visemz.benchmarks").__doc__
    assert all(f"``{name}``" in doc for name in BENCHMARKS)


@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_benchmark_answers_help(name, capsys):
    if name == "zarr_chunks":  # the 'zarr' extra's libraries
        pytest.importorskip("zarr")
        pytest.importorskip("numcodecs")
    module = importlib.import_module(f"visemz.benchmarks.{name}")
    with pytest.raises(SystemExit) as e:
        module.main(["--help"])
    assert e.value.code == 0 and "usage:" in capsys.readouterr().out


# ------------------------------------------------------------------ collectives
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_collectives_runs_every_op_on_two_cpu_ranks(tmp_path):
    """Under torchrun on CPU tensors over Gloo (2 processes): every op's rows, nccl-tests' formulas, the report."""
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "visemz.benchmarks.collectives",
           "--device", "cpu", "--kinds", "smooth", "--label", "cpu", "--out", str(out),
           "--ops", "all_reduce,all_to_all,scatter", "--sizes-mb", "0.0625", "--ebs", "1e-2", "--reps", "1",
           "--predictors", "none,lorenzo", "--api", "functional,plan"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=200, cwd=tmp_path, env=env, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    report = _report(out)
    assert report["world"] == 2 and report["device"] == "cpu" and report["rows"] == lines  # each row as it came
    variants = {(x["algorithm"], x.get("predictor"), x.get("api")) for x in report["rows"] if x["op"] == "all_reduce"}
    assert {(a, p, api) for a in ("ring", "recursive_doubling", "auto") for p in ("none", "lorenzo")
            for api in ("functional", "plan")} <= variants  # every predictor through both APIs
    rows = {(x["op"], x["algorithm"]): x for x in report["rows"]}
    assert set(rows) == {("all_reduce", a) for a in ("nccl", "plain", "ring", "recursive_doubling", "auto")} | {
        (op, a) for op in ("all_to_all", "scatter") for a in ("nccl", "plain", "compressed")}
    auto = rows[("all_reduce", "auto")]
    assert auto["auto_choice"] in ("plain", "ring", "recursive_doubling") and set(auto["auto_estimates_ms"]) == {
        "plain", "ring", "recursive_doubling"} and auto["auto_calibration_s"] > 0
    for x in report["rows"]:
        factor = 2 * (2 - 1) / 2 if x["op"] == "all_reduce" else (2 - 1) / 2  # nccl-tests' busbw factors, W = 2
        assert x["busbw_GBps"] == pytest.approx(x["algbw_GBps"] * factor)
        assert x["algbw_GBps"] == pytest.approx(x["bytes"] / x["seconds"] / 1e9)
        if x["algorithm"] != "nccl":
            assert x["speedup_over_nccl"] > 0  # against NCCL's (here Gloo's) row of the same run
    assert rows[("scatter", "compressed")]["psnr_db"] > 40 and rows[("all_to_all", "compressed")]["psnr_db"] > 40


@pytest.mark.gpu
def test_collectives_measures_the_codecs_on_one_gpu(tmp_path):
    from visemz.benchmarks import collectives

    out = tmp_path / "codecs.json"
    collectives.main(["--codecs-only", "--kinds", "smooth", "--codec-mb", "1", "--ebs", "1e-2", "--reps", "1",
                      "--label", "gpu", "--out", str(out)])
    codecs = _report(out)["codecs"]
    assert {"smooth/copy", "smooth/eb=0.01/none", "smooth/eb=0.01/lorenzo", "lossless_bf16_normal"} <= set(codecs)
    assert codecs["smooth/eb=0.01/none"]["ratio"] > 1 and codecs["smooth/eb=0.01/none"]["homomorphic_speedup"] > 0


# ------------------------------------------------------------------ vs_compressai
def test_compressai_against_visemz_with_the_same_weights(tmp_path, model_weights, capsys):
    optional("piq")  # MS-SSIM of images too small for five scales
    from visemz.benchmarks import vs_compressai

    (tmp_path / "eval" / "xray").mkdir(parents=True)
    (tmp_path / "eval" / "kodak").mkdir()
    cv2.imwrite(str(tmp_path / "eval" / "xray" / "a.png"), _smooth((64, 96)))
    cv2.imwrite(str(tmp_path / "eval" / "kodak" / "k.png"), _smooth((64, 96, 3)))
    out = tmp_path / "compare.json"
    vs_compressai.main(["--data", str(tmp_path), "--out", str(out), "--models", "balle2016-gray", "--qualities", "4",
                     "--repeat", "1"])
    report = _report(out)
    assert report["device"] in capsys.readouterr().out
    rows = {r["coder"]: r for r in report["rows"]}
    assert set(rows) >= {"compressai-rans", "visemz-cpu"} and {r["set"] for r in report["rows"]} == {"xray"}
    for r in rows.values():
        assert (r["model"], r["quality"], r["images"]) == ("balle2016-gray", 4.0, 1)
        assert r["bpp"] > 0 and r["ms_per_image"] > 0 and 0 < r["ms_ssim"] <= 1
    # same weights, same symbols: CompressAI's reconstruction is visemz's
    assert rows["compressai-rans"]["psnr"] == pytest.approx(rows["visemz-cpu"]["psnr"], abs=0.01)
    (pair,) = [p for p in report["summary"]["pairs"] if p["coder"] == "visemz-cpu"]
    assert pair["bpp_ratio"] > 0 and pair["speedup"] > 0 and abs(pair["psnr_delta_db"]) < 0.01


# ------------------------------------------------------------------ encoder, network (GPU only)
@pytest.mark.gpu
def test_encoder_against_a_device_copy(tmp_path):
    optional("cupy")
    optional("nvidia.nvcomp")  # zstd on the GPU
    from visemz.benchmarks import encoder

    out = tmp_path / "encoder.json"
    encoder.main(["--sizes-mb", "1", "--repeat", "2", "--no-nvcomp", "--reference-mb", "1", "--out", str(out)])
    report = _report(out)
    gpu_rows = [r for r in report["rows"] if "copy_GBps" in r]
    assert report["device"] and {r["codec"] for r in gpu_rows} == {"visemz-global", "visemz-block"}
    assert {r["data"] for r in gpu_rows} == {"latent", "laplace", "dense"}
    assert all(r["ratio"] > 0 and r["enc_GBps"] > 0 and r["enc_vs_copy"] > 0 for r in gpu_rows)


@pytest.mark.gpu
def test_network_math_settings(tmp_path, model_weights):
    from visemz.benchmarks import network

    image = tmp_path / "a.png"
    cv2.imwrite(str(image), _smooth((64, 64)))
    out = tmp_path / "network.json"
    network.main(["--images", str(image), "--repeat", "1", "--out", str(out)])
    rows = _report(out)["rows"]
    settings = [r for r in rows if "analysis_ms" in r]
    assert [r["setting"] for r in settings] == list(network.SETTINGS)
    assert settings[0]["analysis_speedup"] == 1 and all(r["synthesis_max_levels"] >= 0 for r in settings)


# ------------------------------------------------------------------ lossless
def test_lossless_beside_the_cpu_codecs(tmp_path, model_weights, capsys):
    optional("imagecodecs")
    from visemz.benchmarks import lossless

    cv2.imwrite(str(tmp_path / "a8.png"), _smooth((40, 48)))
    cv2.imwrite(str(tmp_path / "a16.png"), _smooth((48, 40), np.uint16, sigma=3))
    out = tmp_path / "lossless.json"
    lossless.main(["--image8", str(tmp_path / "a8.png"), "--image16", str(tmp_path / "a16.png"), "--size", "64",
                   "--device", "cpu", "--bounds", "0", "--reps", "1", "--warmup", "0", "--out", str(out)])
    report = _report(out)
    assert f"device: {report['device']}" in capsys.readouterr().out
    assert (report["size"], report["reps"], report["visemz"]) == (64, 1, visemz.__version__)
    rows = report["rows"]
    assert [(r["image"], r["dtype"]) for r in rows if r["codec"].startswith("visemz")] == [("a8.png", "uint8"),
                                                                                             ("a16.png", "uint16")]
    assert {r["codec"].split(" ")[0] for r in rows} == {"visemz", "jpeg-ls", "jpeg-xl-e7"}
    assert all(r["bound_held"] and r["measured_max_error"] == 0 and r["bpp"] > 0 and r["encode_mp_s"] > 0
               for r in rows)


# ------------------------------------------------------------------ pipeline
def test_pipeline_arguments():
    quick = bench_pipeline.parse_args(["--data", "DATA", "--quick"])
    assert (quick.repeat, quick.streams, quick.repeat_to) == (1, [4], 200)
    full = bench_pipeline.parse_args(["--data", "DATA", "--streams", "2,8", "--repeat-to", "600"])
    assert (full.repeat, full.streams, full.repeat_to) == (3, [2, 8], 600)
    assert bench_pipeline.parse_args(["--data", "DATA", "--no-dali"]).loader == "cpu"
    lossless = bench_pipeline.parse_args(["--data", "DATA", "--max-error", "0"])
    assert (lossless.max_error, lossless.no_compressai, lossless.no_jpeg) == (0, True, True)
    for bad in (["--streams", "2,x"], ["--streams", "0"], ["--torchrun"], ["--repeat", "0"], ["--max-error", "-1"]):
        with pytest.raises(SystemExit) as e:
            bench_pipeline.parse_args(["--data", "DATA", *bad])
        assert e.value.code == 2


def test_pipeline_names_the_runs_whose_bytes_differ_from_one_stream(tmp_path):
    one, other = tmp_path / "one", tmp_path / "other"
    for folder, byte in ((one, b"a"), (other, b"b")):
        (folder / "sub").mkdir(parents=True)
        (folder / "sub/x.png.vsz").write_bytes(b"same")
        (folder / "y.png.vsz").write_bytes(byte)
        (folder / "visemz-manifest.json").write_bytes(byte)  # not an output file: left out
    assert list(bench_pipeline.vsz_digests(one)) == ["sub/x.png.vsz", "y.png.vsz"]
    same = bench_pipeline.vsz_digests(other) == bench_pipeline.vsz_digests(one)
    runs = [{"label": "b"}, {"label": "c2", "same_bytes_as_one_stream": True},
            {"label": "c4", "same_bytes_as_one_stream": same}]
    assert bench_pipeline.differing_runs({"runs": runs}) == ["c4"]


def test_pipeline_runs_every_part_on_the_cpu(tmp_path, model_weights):
    data_dir = tmp_path / "data"
    (data_dir / "kodak").mkdir(parents=True)
    (data_dir / "xray").mkdir()
    for i in range(2):
        cv2.imwrite(str(data_dir / f"kodak/{i}.png"), _smooth((64, 96, 3), seed=i))
    cv2.imwrite(str(data_dir / "xray/0.png"), _smooth((80, 64), seed=2))
    out = tmp_path / "bench.json"
    bench_pipeline.main(["--data", str(data_dir), "--work", str(tmp_path / "work"), "--out", str(out),
                         "--device", "cpu", "--quick", "--repeat-to", "5", "--streams", "2"])
    report = _report(out)
    assert report["device"] == "CPU only" and report["folder"] == {"distinct": 3, "files": 6}
    labels = [r["label"] for r in report["runs"]]
    assert labels[:4] == ["b: visemz 1 stream", "c: visemz 2 streams", "b: decompress 1 stream",
                          "c: decompress 2 streams"]
    assert "a: compressai-loop" in labels and any(lbl.startswith("d: nvjpeg q") for lbl in labels)
    assert all(r["failed"] == 0 and r["done"] == r["files"] and r["images_per_s"] > 0 for r in report["runs"])
    assert report["runs"][1]["same_bytes_as_one_stream"] is True and bench_pipeline.differing_runs(report) == []
    q = report["quality"]
    # same weights, same symbols: CompressAI's reconstruction is visemz's
    assert abs(q["compressai"]["psnr"] - q["visemz"]["psnr"]) < 0.01
    assert q["nvjpeg"]["psnr"] >= q["visemz"]["psnr"] or q["nvjpeg"]["jpeg_quality"] == 100
    assert set(report["ratios"]) >= {"multi_over_single", "compress_over_decompress", "multi_over_compressai",
                                     "multi_over_nvjpeg", "bits_saved_vs_jpeg"}


def test_pipeline_lossless_folder_on_the_cpu(tmp_path, model_weights):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    cv2.imwrite(str(data_dir / "0.png"), _smooth((64, 80), seed=3))
    cv2.imwrite(str(data_dir / "1.png"), _smooth((48, 64, 3), seed=4))
    out = tmp_path / "bench.json"
    bench_pipeline.main(["--data", str(data_dir), "--work", str(tmp_path / "work"), "--out", str(out),
                         "--device", "cpu", "--quick", "--repeat-to", "2", "--streams", "2", "--max-error", "0"])
    report = _report(out)
    labels = [r["label"] for r in report["runs"]]
    assert labels == ["b: visemz 1 stream", "c: visemz 2 streams", "b: decompress 1 stream", "c: decompress 2 streams"]
    assert all(r["done"] == r["files"] == 2 and r["Mpx_per_s"] > 0 for r in report["runs"])
    assert report["quality"]["visemz"]["psnr"] is None and report["quality"]["visemz"]["max_error"] == 0
    assert report["settings"]["max_error"] == 0


# ------------------------------------------------------------------ profile_codec, profile_collectives
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_profile_codec_summary(tmp_path, model_weights, device):
    if device == "cuda":
        optional("nvidia.nvcomp")  # the GPU's entropy stage
    from visemz.benchmarks import profile_codec

    image = tmp_path / "a.png"
    cv2.imwrite(str(image), _smooth((64, 64)))
    profile_codec.main(["--image", str(image), "--out", str(tmp_path / "prof"), "--device", device, "--reps", "1",
                        "--threads", "1,2", "--summary-only"])
    summary = _report(tmp_path / "prof" / "summary.json")
    assert summary["image"] == "a.png" and summary["bytes"] > 0
    assert summary["compress_ms"] > 0 and summary["decompress_ms"] > 0
    assert set(summary["threaded_images_per_s"]) == set(summary["threaded_decompressions_per_s"]) == {"1", "2"}
    assert all(rate > 0 for rate in summary["threaded_decompressions_per_s"].values())
    assert (summary["cuda_calls_per_compress"] == {}) == (device == "cpu")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_profile_codec_stages(tmp_path, model_weights, device):
    """The full profile names where a lossless compress and decompress spend their time, stage by stage."""
    if device == "cuda":
        optional("nvidia.nvcomp")
    from visemz.benchmarks import profile_codec

    image = tmp_path / "a.png"
    cv2.imwrite(str(image), _smooth((48, 48)))
    profile_codec.main(["--image", str(image), "--out", str(tmp_path / "prof"), "--device", device, "--reps", "1",
                        "--threads", "1", "--model", "mbt2018-mean", "--max-error", "0"])
    summary = _report(tmp_path / "prof" / "summary.json")
    for call in ("compress", "decompress"):
        stages = summary[f"stages_ms_per_{call}"]
        assert {"conditional rANS", "residual prior network", "synthesis, float64 (features of the residual prior)",
                "latents"} <= set(stages)
        assert all(v >= 0 for v in stages.values()) and list(stages.values()) == sorted(stages.values(), reverse=True)
        assert (tmp_path / "prof" / f"torch_ops_{call}.txt").stat().st_size > 0
    assert "analysis" in summary["stages_ms_per_compress"] and "analysis" not in summary["stages_ms_per_decompress"]


@pytest.mark.gpu
def test_float64_layers_on_the_gpu(tmp_path):
    optional("triton")
    from visemz.benchmarks import float64_layers

    out = tmp_path / "layers.json"
    float64_layers.main(["--layers", "5", "--scale", "16", "--reps", "1", "--configs", "128,16,64,4,2",
                         "64,16,32,4,2,0", "--layouts", "first", "last", "--out", str(out)])
    rows = _report(out)["rows"]
    assert [r["kernel"] for r in rows[:5]] == [
        "aten", "conv64 128,16,64,4,2 channels first", "conv64 128,16,64,4,2 channels last",
        "conv64 64,16,32,4,2,0 channels first", "conv64 64,16,32,4,2,0 channels last"]
    assert len(rows) == 25 and rows[-1]["layer"].startswith("g_s IGDN 128")
    assert all(r["ms"] > 0 and r["rel_diff"] < 1e-12 for r in rows)


def test_profile_collectives_on_one_cpu_rank(monkeypatch, capsys):
    """A group of one (Gloo, CPU tensors; torchrun's variables set here): every algorithm through both APIs."""
    from visemz.benchmarks import profile_collectives

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(k, v)
    profile_collectives.main(["--device", "cpu", "--mb", "0.0625", "--reps", "2", "--lines", "3"])
    out = capsys.readouterr().out
    assert "rank 0: CPU (Gloo), world 1" in out
    for alg in ("ring", "recursive_doubling"):
        for api in ("functional", "plan"):
            assert f"== {alg} ({api}): median " in out


# ------------------------------------------------------------------ rans
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_rans_against_the_block_encoder_and_compressai(tmp_path, device):
    if device == "cuda":
        optional("cupy")
        optional("nvidia.nvcomp")  # the block encoder's zstd on the GPU
    from visemz.benchmarks import rans

    out = tmp_path / "rans.json"
    rans.main(["--images", "64x64", "--big-mb", "--repeat", "1", "--warmup", "0", "--lane-bytes", "256",
               "--out", str(out)] + (["--no-gpu"] if device == "cpu" else []))
    report = _report(out)
    coders = {r["coder"]: r for r in report["rows"]}
    cpu = {"visemz-rans-cpu", "visemz-block+zstd-cpu", "compressai-rans (coder)",
           "compressai-rans (GaussianConditional)"}
    assert set(coders) == cpu | ({"visemz-rans-gpu", "visemz-block+zstd-gpu"} if device == "cuda" else set())
    assert all(r["input"] == "latent of 64x64" and r["symbols"] == 192 * 4 * 4 and r["bytes"] > 0
               for r in coders.values())
    # CompressAI's coder alone and through GaussianConditional write the same bytes
    assert coders["compressai-rans (coder)"]["bytes"] == coders["compressai-rans (GaussianConditional)"]["bytes"]
    assert report["device"] == ("CPU only" if device == "cpu" else report["device"])
    assert len(report["lane_bytes_sweep"]) == (1 if device == "cuda" else 0)


# ------------------------------------------------------------------ refine
@pytest.mark.slow
def test_refine_curves_and_their_cost(tmp_path, model_weights):
    """Two small gray images of an X-ray set, 8- and 16-bit (the gray model): every point measured, the curves'
    BD-rates against steps 0 and against JPEG 2000 points of the same images (a points.csv in the rd report's
    layout), and the encode seconds that 100 steps add."""
    from visemz.benchmarks import refine

    gray = data.camera()[80:208, 200:328]
    folder = tmp_path / "eval" / "xray"
    folder.mkdir(parents=True)
    cv2.imwrite(str(folder / "a.png"), gray[:64, :96])
    cv2.imwrite(str(folder / "b.png"), gray[64:128, 32:128].astype(np.uint16) * 257 + 5)
    rows = ["dataset,image,codec,setting,bpp,psnr"]
    rows += [f"xray,{im},jpeg2000,bpp={b},{b},{p}" for im in ("a.png", "b.png")
             for b, p in ((0.5, 28), (1, 32), (2, 37))]
    rows += ["xray,other.png,jpeg2000,bpp=0.5,0.5,20", "kodak,a.png,jpeg2000,bpp=4,4,50"]  # other images: left out
    (tmp_path / "points.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "r.json"
    refine.main(["--data", str(tmp_path / "eval"), "--set", "xray", "--models", "balle2016", "--steps", "0", "2",
                 "--qualities", "2", "6", "--device", "cpu", "--points", str(tmp_path / "points.csv"),
                 "--out", str(out)])
    r = _report(out)
    assert r["images"] == ["a.png", "b.png"] and len(r["points"]) == 2 * 2 * 2
    assert r["device"].startswith("CPU")
    assert all(p["bytes"] > 0 and p["bpp"] > 0 and np.isfinite(p["psnr"]) and p["encode_s"] > 0 for p in r["points"])
    s = r["summary"]["balle2016"]
    assert [p["images"] for p in s["2"]["curve"]] == [2, 2]
    assert s["0"]["bd_rate_vs_steps0"] is None and s["2"]["bd_rate_vs_steps0"] is not None
    assert all(s[k]["bd_rate_vs_jpeg2000"] is not None for k in ("0", "2"))
    assert s["0"]["s_per_image_per_100_steps"] is None and s["2"]["per_100_steps_is_upper_bound"] is False
    enc = [np.mean([p["encode_s"] for p in r["points"] if p["steps"] == k]) for k in (0, 2)]
    assert s["2"]["s_per_image_per_100_steps"] == pytest.approx((enc[1] - enc[0]) * 50)


# ------------------------------------------------------------------ tiles
def test_tiles_psnr_at_equal_bpp_reads_the_untiled_curve_at_the_tiled_rate():
    # untiled points (bpp, PSNR) on PSNR = 30 + 10 log10(bpp): a tiled file at 1.1x the bits and the same PSNR
    # lies 10 log10(1.1) = 0.414 dB below the untiled curve
    curve = {q: (b, 30 + 10 * np.log10(b), 1.1 * b, 30 + 10 * np.log10(b))
             for q, b in ((1, 0.25), (2, 0.5), (3, 1.0), (4, 2.0))}
    assert bench_tiles._psnr_at_equal_bpp(curve, 2) == pytest.approx(-10 * np.log10(1.1), abs=1e-9)
    assert bench_tiles._psnr_at_equal_bpp(curve, 4) is None  # 2.2 bpp: beyond the untiled curve
    row = bench_tiles._seam_row(2, [curve, curve], 256)
    assert row["psnr_tiled_minus_untiled_db"] == 0 and row["bpp_tiled_over_untiled"] == pytest.approx(1.1)
    assert row["psnr_diff_at_equal_bpp_db"] == pytest.approx(-0.4139, abs=1e-4) and row["images_at_equal_bpp"] == 2


def test_tiles_seams_mode_runs_only_the_seams(tmp_path, model_weights):
    kodak = tmp_path / "kodak"
    kodak.mkdir()
    cv2.imwrite(str(kodak / "a.png"), np.ascontiguousarray(data.astronaut()[:64, :128, ::-1]))
    out = tmp_path / "seams.json"
    bench_tiles.main(["--seams", "--device", "cpu", "--kodak", str(kodak), "--data", str(tmp_path / "none"),
                      "--seam-tile", "64", "--qualities", "2", "6", "--out", str(out)])
    report = _report(out)
    assert report["sizes"] == [] and not {"untiled", "kodak", "region"} & set(report)
    seams = report["seams"]
    assert (seams["tile"], seams["images"], seams["shapes"]) == (64, 1, ["64x128"])
    assert [r["quality"] for r in seams["rows"]] == [2, 6]
    for r in seams["rows"]:
        assert r["bpp_tiled"] > 0 and r["psnr_tiled"] > 20 and abs(r["psnr_tiled_minus_untiled_db"]) < 1
    assert isinstance(seams["within_0_05_db"], bool) and "bd_psnr_db" in seams


@pytest.mark.slow
def test_tiles_pipeline_mode_runs_tiled_mosaics_and_kodak_through_the_lanes(tmp_path, model_weights):
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
    report = _report(out)
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


def test_mosaic_gaps_are_zero():
    # a row is as tall as its tallest image: under a shorter one the mosaic is 0, never stale memory
    a, b = np.full((3, 5), 7, np.uint16), np.full((2, 4), 9, np.uint16)
    out = common.mosaic([a, b], 8)
    assert out[:3, :5].tolist() == [[7] * 5] * 3 and (out[:2, 5:] == 9).all() and (out[2, 5:] == 0).all()
    assert set(np.unique(out)) <= {0, 7, 9}
