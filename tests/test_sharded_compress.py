"""Folder compression split over ranks (as under torchrun): each file once, one manifest for the run."""

import json
import os
from datetime import timedelta

import cv2
import numpy as np
import pytest
import torch.distributed as dist

from visemz.pipeline.jobs import CompressConfig, compress_folder

from .collective_checks import run_ranks


def _worker(rank, world, init, src, dst, weights, queue):
    os.environ["VISEMZ_WEIGHTS_DIR"] = str(weights)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    try:
        s = compress_folder(src, dst, CompressConfig(device="cpu", max_error=0, streams=1), rank=rank, world=world)
        queue.put((rank, [r.rel for r in s.results]))
    except BaseException as e:  # noqa: BLE001 (any failure goes back to the parent as a result)
        queue.put((rank, repr(e)))
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(180)
def test_three_ranks_share_the_folder(tmp_path, model_weights):
    src, dst = tmp_path / "src", tmp_path / "dst"
    for i in range(10):
        (src / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(src / f"d{i % 3}/im{i}.png"), np.random.default_rng(i).integers(0, 256, (40, 50), np.uint8))
    done = dict(run_ranks(_worker, 3, lambda r, q: (r, 3, tmp_path / "init", src, dst, model_weights, q), timeout=150))
    assert all(isinstance(v, list) for v in done.values()), done
    every = sorted(p.relative_to(src).as_posix() for p in src.rglob("*.png"))
    assert sorted(done[0]) == every  # rank 0 reports the whole run
    manifest = json.loads((dst / "visemz-manifest.json").read_text())
    assert manifest["ranks"] == 3 and manifest["summary"]["done"] == 10
    owner = {f["rel"]: f["rank"] for f in manifest["files"]}
    assert sorted(owner) == every and len(manifest["files"]) == 10  # each file handled once
    for r in (1, 2):  # the other ranks report their own shard
        assert sorted(done[r]) == sorted(rel for rel, o in owner.items() if o == r)
