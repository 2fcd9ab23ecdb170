"""The image-stacking job on Gloo (1-3 ranks) and through the CLI (one process)."""

import json
from datetime import timedelta

import numpy as np
import pytest
import tifffile
import torch.distributed as dist

from visemz.collectives.stacking import StackConfig, stack
from visemz.io import writers

from .collective_checks import run_ranks

FRAMES = 12


def _frames(folder):
    folder.mkdir()
    yy, xx = np.mgrid[:64, :80]
    for i in range(FRAMES):
        rng = np.random.default_rng(i)
        frame = 1500 + 800 * np.sin(xx / 9 + i) * np.cos(yy / 7) + rng.normal(0, 40, (64, 80))
        tifffile.imwrite(folder / f"frame{i:02d}.tif", np.clip(frame, 0, 65535).astype(np.uint16))
    return sum(tifffile.imread(folder / f"frame{i:02d}.tif").astype(np.float64) for i in range(FRAMES))


def _worker(rank, world, init, folder, out, algorithm, queue):
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    try:
        queue.put((rank, stack(folder, out, StackConfig(error_bound=1e-4, algorithm=algorithm))))
    except BaseException as e:  # noqa: BLE001 (any failure goes back to the parent as a result)
        queue.put((rank, repr(e)))
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("world", "algorithm"), [(1, "ring"), (2, "ring"), (3, "ring"), (2, "auto")])
def test_stack_is_within_bound_and_reported(world, algorithm, tmp_path):
    exact = _frames(tmp_path / "frames")
    out = tmp_path / "stacked.tiff"
    results = dict(run_ranks(_worker, world,
                             lambda r, q: (r, world, tmp_path / "init", tmp_path / "frames", out, algorithm, q),
                             timeout=150))
    report = results[0]
    assert isinstance(report, dict), results
    assert all(results[r] is None for r in range(1, world))
    stacked = tifffile.imread(out)
    err = np.abs(stacked.astype(np.float64) - exact)
    assert err.max() <= report["bound_total"] + np.spacing(np.float32(exact.max())) and report["psnr_db"] >= 70
    assert report["within_bound"] and report["bound_total"] >= world * report["error_bound_absolute_per_rank"]
    assert report["frames"] == FRAMES and report["ranks"] == world
    assert report["algorithm"] == ("plain" if world == 1 else algorithm) or (
        algorithm == "auto" and report["algorithm"] in ("plain", "ring", "recursive_doubling"))
    assert set(report["seconds"]) == {"load", "sum", "plan_setup", "compress_communicate_reduce", "plain_allreduce"}
    # strict JSON in the file: an exact stack's PSNR is the string "inf", not Infinity
    assert json.loads((tmp_path / "stacked.tiff.json").read_text())["psnr_db"] == writers.finite(report["psnr_db"])


def test_stack_command_single_process(tmp_path, cli):
    _frames(tmp_path / "frames")
    r = cli("stack", tmp_path / "frames", "--out", tmp_path / "s.tiff", "--device", "cpu")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["frames"] == FRAMES and (tmp_path / "s.tiff").is_file()


def test_exposure_stack_script_writes_noisy_repeats_of_the_first_image(tmp_path):
    """tools/make_exposure_stack.py (the stack bench_scaling.sh measures): float32 frames of the scene's
    shape whose mean is the scene, each a different draw."""
    import subprocess
    import sys
    from pathlib import Path

    import cv2

    src = tmp_path / "src"
    src.mkdir()
    scene = (np.add.outer(np.arange(40), np.arange(56)) * 2).astype(np.uint8)
    cv2.imwrite(str(src / "a.png"), scene)
    cv2.imwrite(str(src / "b.png"), 255 - scene)  # not the first: never used
    script = Path(__file__).parents[1] / "tools" / "make_exposure_stack.py"
    r = subprocess.run([sys.executable, str(script), str(src), str(tmp_path / "frames"), "--frames", "40"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    frames = [tifffile.imread(p) for p in sorted((tmp_path / "frames").glob("frame_*.tif"))]
    assert len(frames) == 40 and all(f.dtype == np.float32 and f.shape == scene.shape for f in frames)
    assert not np.array_equal(frames[0], frames[1])
    assert np.abs(np.mean(frames, axis=0) - scene).mean() < 1.0  # shot noise of 4 photons per unit averages out
    (tmp_path / "empty").mkdir()
    bad = subprocess.run([sys.executable, str(script), str(tmp_path / "empty"), str(tmp_path / "f2")],
                         capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode != 0 and "no images in" in bad.stderr
