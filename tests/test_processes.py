"""Folder compression in several worker processes (pipeline/processes.py, ``visemz compress --processes``)."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest
from skimage import data
from typer.testing import CliRunner

import visemz
from visemz import config
from visemz.cli import app
from visemz.errors import InvalidArgumentError, VisemzError
from visemz.pipeline import processes


def rank_job(base: int, rank: int = 0, world: int = 1):
    """A job for the workers: rank 0's answer, every rank in a group of ``world``."""
    import torch.distributed as dist

    if world > 1:
        assert dist.get_world_size() == world and dist.get_rank() == rank
    return base + world


def failing_job(rank: int = 0, world: int = 1):
    if rank == 1:
        raise InvalidArgumentError(f"rank {rank} refuses")
    import torch.distributed as dist

    dist.barrier()  # rank 0 waits for a rank that never comes: the parent must stop it
    return "never"


def test_processes_are_checked(monkeypatch):
    for bad in (0, 65, 1.5, True):
        with pytest.raises(InvalidArgumentError, match="processes"):
            processes.check_processes(bad)
    monkeypatch.setenv("VISEMZ_PROCESSES", "0")
    with pytest.raises(InvalidArgumentError, match="VISEMZ_PROCESSES"):
        config.from_env()


def test_workers_form_a_group_and_rank_0_answers():
    assert processes.run(1, rank_job, 10) == 11  # one: here, without a group
    assert processes.run(3, rank_job, 10) == 13


def test_a_failing_worker_stops_the_others_and_its_error_is_raised():
    with pytest.raises(InvalidArgumentError, match="rank 1 refuses"):
        processes.run(2, failing_job)


def test_cli_compresses_a_folder_in_two_processes(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    images = {"a.png": data.camera()[:96, :128], "sub/b.png": data.astronaut()[:64, :96],
              "sub/c.png": data.coins()[:80, :80], "d.png": data.moon()[:64, :64]}
    for rel, img in images.items():
        cv2.imwrite(str(src / rel), img if img.ndim == 2 else img[:, :, ::-1])
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["compress", str(src), str(out), "--processes", "2", "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["done"] == 4 and summary["failed"] == 0
    manifest = json.loads((out / "visemz-manifest.json").read_text())
    assert manifest["ranks"] == 2 and {f["rank"] for f in manifest["files"]} == {0, 1}
    for rel, img in images.items():
        back = visemz.decompress((out / (rel + ".vsz")).read_bytes())
        assert back.shape == img.shape and np.abs(back.astype(int) - img).mean() < 20


def test_cli_reports_a_bad_source_from_the_workers(tmp_path):
    result = CliRunner().invoke(app, ["compress", str(tmp_path / "missing"), str(tmp_path / "out"), "--processes", "2",
                                      "--device", "cpu"])
    assert result.exit_code != 0 and "neither a file nor a folder" in result.output
    assert issubclass(processes.WorkerFailedError, VisemzError)
