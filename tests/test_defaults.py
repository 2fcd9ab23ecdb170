"""Runtime settings (visemz/defaults.py over visemz/config.py's table): get and set, scoped and restored,
checked as their environment variables are, read by the code at call time, and documented in one table."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import visemz
from visemz import config, cuda, defaults
from visemz.encoders import decode_ints, encode_ints, stream
from visemz.errors import InvalidArgumentError
from visemz.pipeline import processes

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import settings_table  # noqa: E402  (tools/, on the path above)

# (setting, a value its rule refuses): each refused by set and, as text, by its environment variable
REFUSED = [("device", "gpu"), ("entropy_chunk", 4095), ("entropy_chunk", (16 << 20) + 1), ("entropy_batch", 2),
           ("zstd_level", 23), ("threads", -1), ("streams", -1), ("processes", 65), ("loader", "nvjpeg"),
           ("queue_depth", -1), ("dali_batch", 0), ("collective_calibration_kib", "32768,1024"),
           ("collective_inband_kib", -1), ("rans_lane_bytes", 0), ("rans_lane_symbols", (1 << 20) + 1),
           ("rans_hyper_lane_symbols", 0), ("rans_skip_freq", 65537), ("tile_batch", 0),
           ("refine", config.MAX_REFINE + 1), ("tf32", 2), ("graphs", -1), ("graph_pixels", -1),
           ("max_pixels", 0)]


def _ints_of_two_frames() -> np.ndarray:
    return np.arange(50_000, dtype=np.int32) % 7  # about 19 KB of block stream: two 16 KiB frames


def _level_in_a_worker(*, rank: int, world: int) -> int:
    return defaults.get("zstd_level")


# ---------------------------------------------------------------- get, set, scopes
def test_set_changes_a_setting_until_set_again():
    before = defaults.get("zstd_level")
    try:
        defaults.set(zstd_level=before + 1)
        assert defaults.get("zstd_level") == before + 1 == defaults.current().zstd_level
    finally:
        defaults.set(zstd_level=before)
    assert defaults.get("zstd_level") == before


def test_a_block_restores_what_it_set_and_only_that():
    level, chunk, threads = defaults.get("zstd_level"), defaults.get("entropy_chunk"), defaults.get("threads")
    with defaults.set(zstd_level=9, entropy_chunk=1 << 16) as entered:
        assert entered is None
        assert (defaults.get("zstd_level"), defaults.get("entropy_chunk")) == (9, 1 << 16)
        assert defaults.get("threads") == threads
    assert (defaults.get("zstd_level"), defaults.get("entropy_chunk")) == (level, chunk)


def test_blocks_nest():
    level = defaults.get("zstd_level")
    with defaults.set(zstd_level=5):
        with defaults.set(zstd_level=7, tf32=0):
            assert (defaults.get("zstd_level"), defaults.get("tf32")) == (7, 0)
        assert (defaults.get("zstd_level"), defaults.get("tf32")) == (5, 1)
    assert defaults.get("zstd_level") == level


def test_a_block_that_raises_restores_its_values():
    level = defaults.get("zstd_level")
    with pytest.raises(RuntimeError, match="inside"):
        with defaults.set(zstd_level=level + 2):
            raise RuntimeError("inside the block")
    assert defaults.get("zstd_level") == level


def test_changes_from_many_threads_are_none_lost():
    """Each change builds on the one before (a lock): threads that set different settings at once keep all."""
    names = ["streams", "queue_depth", "graphs", "refine"]
    before = {n: defaults.get(n) for n in names}

    def churn(name):
        for k in range(60):  # within every one's range
            defaults.set(**{name: k})

    try:
        threads = [threading.Thread(target=churn, args=(n,)) for n in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert {n: defaults.get(n) for n in names} == dict.fromkeys(names, 59)
    finally:
        defaults.set(**before)


# ---------------------------------------------------------------- checked as the environment is
@pytest.mark.parametrize("name,bad", REFUSED, ids=[f"{n}={v}" for n, v in REFUSED])
def test_a_bad_value_is_refused_naming_it_and_changes_nothing(name, bad, monkeypatch):
    before = defaults.current()
    values = {"zstd_level": before.zstd_level + 1, name: bad}  # a good value beside the bad one
    with pytest.raises(InvalidArgumentError, match=f"^{name}="):
        defaults.set(**values)
    assert defaults.current() == before  # not even the good value
    monkeypatch.setenv(config.ENV[name], str(bad))
    with pytest.raises(InvalidArgumentError, match=f"^{config.ENV[name]}="):
        config.from_env()


@pytest.mark.parametrize("bad", [True, 1.0, "16384", None])
def test_an_integer_setting_takes_integers_only(bad):
    with pytest.raises(InvalidArgumentError, match="entropy_chunk=.*integer"):
        defaults.set(entropy_chunk=bad)
    defaults.set(entropy_chunk=np.int64(defaults.get("entropy_chunk")))  # NumPy's integers are integers
    assert type(defaults.get("entropy_chunk")) is int


def test_the_tile_is_held_to_the_tile_rule():
    with pytest.raises(InvalidArgumentError, match="tile=100"):
        defaults.set(tile=100)
    with defaults.set(tile=512):
        assert defaults.get("tile") == 512


def test_an_unknown_setting_is_refused_naming_it():
    with pytest.raises(InvalidArgumentError, match="'zstd_levle'"):
        defaults.set(zstd_levle=3)
    with pytest.raises(InvalidArgumentError, match="'chunk'"):
        defaults.get("chunk")


def test_the_environment_gives_the_first_values(monkeypatch):
    monkeypatch.setenv("VISEMZ_ZSTD_LEVEL", "7")
    monkeypatch.setenv("VISEMZ_LOADER", "cpu")
    monkeypatch.setenv("VISEMZ_THREADS", "nope")
    with pytest.raises(InvalidArgumentError, match="VISEMZ_THREADS='nope' is not a valid int"):
        config.from_env()
    monkeypatch.delenv("VISEMZ_THREADS")
    assert (config.from_env().zstd_level, config.from_env().loader) == (7, "cpu")


# ---------------------------------------------------------------- read at call time
def test_the_zstd_level_in_force_writes_the_bytes():
    a = _ints_of_two_frames()
    plain = encode_ints(a, policy="global", entropy="zstd")
    with defaults.set(zstd_level=19):
        strong = encode_ints(a, policy="global", entropy="zstd")
    assert strong != plain and encode_ints(a, policy="global", entropy="zstd") == plain
    np.testing.assert_array_equal(decode_ints(strong), a)


def test_the_frame_size_in_force_is_written_and_read_back():
    a = _ints_of_two_frames()
    with defaults.set(entropy_chunk=4096):
        small = encode_ints(a, policy="global", entropy="zstd")
    parsed = stream.parse(small)
    assert parsed.chunk == 4096 and len(parsed.frames) > 2
    assert stream.parse(encode_ints(a, policy="global", entropy="zstd")).chunk == defaults.get("entropy_chunk")
    np.testing.assert_array_equal(decode_ints(small), a)


def test_the_thread_count_follows_the_setting():
    with defaults.set(threads=3):
        assert defaults.cpu_threads() == 3
    with defaults.set(threads=0):
        assert defaults.cpu_threads() >= 1


def test_worker_processes_start_with_the_values_in_force():
    with defaults.set(zstd_level=defaults.get("zstd_level") + 4):
        assert processes.run(2, _level_in_a_worker) == defaults.get("zstd_level")


# ---------------------------------------------------------------- the package and the document
def test_visemz_defaults_is_the_module_and_import_visemz_leaves_it_unloaded():
    assert visemz.defaults is defaults and "defaults" in dir(visemz)
    code = "import sys, visemz; print('visemz.defaults' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_the_settings_document_is_the_table():
    """docs/settings.md is what tools/settings_table.py writes from config.py: every setting, once."""
    text = (ROOT / "docs" / "settings.md").read_text()
    assert text == settings_table.render(), "docs/settings.md is out of date: run python tools/settings_table.py"
    for name, var in config.ENV.items():
        assert text.count(f"| `{name}` | `{var}` |") == 1, name


@pytest.mark.parametrize("gpu, nvcomp, chosen", [(True, True, "cuda"), (True, False, "cpu"), (False, True, "cpu")])
def test_auto_takes_the_gpu_only_with_the_gpu_extra(monkeypatch, gpu, nvcomp, chosen):
    """A GPU with cupy but no nvCOMP (the gpu extra half installed) works on the CPU rather than failing later."""
    monkeypatch.setattr(cuda, "cuda_available", lambda: gpu)
    monkeypatch.setattr(cuda, "nvcomp_installed", lambda: nvcomp)
    assert cuda.resolve("auto") == chosen


def test_host_arrays_leave_cupys_stream_alone():
    """``cuda.after_torch`` follows torch's stream only for torch CUDA tensors: host arrays and CPU tensors need no
    GPU and no cupy."""
    import torch

    with cuda.after_torch(np.zeros(2), torch.zeros(2), None):
        pass
