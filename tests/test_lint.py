"""The code passes ruff with the rules in pyproject.toml ([tool.ruff]), so style faults fail here, not in review."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    pytest.importorskip("ruff")
    # run from the root: ruff reads pyproject.toml there, and its messages name files as a reader finds them
    p = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "visemz", "tests", "tools"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
