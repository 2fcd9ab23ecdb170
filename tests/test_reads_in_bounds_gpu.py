"""The GPU encoders read nothing past the arrays they are given: each case runs in a subprocess
(``tests/edge_reads.py``) over inputs (float tensors, integer arrays, images) whose last byte is the
last byte of mapped memory, so a read beyond them stops that process with an illegal address instead
of passing unnoticed."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .edge_reads import CASES
from .helpers import optional

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(CASES))
def test_encoders_read_only_their_input(case, request):
    optional("cupy")
    env = dict(os.environ)
    if case.startswith("image-"):  # the tests' weights: the shipped ones, or seeded ones where those are missing
        env["VISEMZ_WEIGHTS_DIR"] = str(request.getfixturevalue("model_weights"))
        optional("nvidia.nvcomp")
    r = subprocess.run([sys.executable, "-m", "tests.edge_reads", case], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env=env, check=False)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-2000:] + r.stderr[-4000:]
