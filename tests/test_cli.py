"""The visemz command on temporary trees (CPU): exit codes, messages, resume, kills.

Commands run in-process through typer's runner (the ``cli`` fixture); one test starts the real
``python -m visemz`` in a subprocess, because only a real process can be killed part-way.
"""

import json
import os
import signal
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import cv2
import numpy as np
import PIL.Image
import pytest
import tifffile
from skimage import data

import visemz
from visemz import container
from visemz.image import pages
from visemz.image.codec import FORMAT
from visemz.models import registry
from visemz.models import weights as W
from visemz.pipeline import dali_source
from visemz.pipeline.jobs import is_complete

from .helpers import folder_digests, repack_header

GOOD = {
    "a/gray8.png": ("uint8", (40, 52)),
    "a/b/rgb8.png": ("uint8", (33, 47, 3)),
    "a/b/gray16.png": ("uint16", (40, 52)),
    "c/rgb16.tif": ("uint16", (30, 41, 3)),
    "c/gray8.tif": ("uint8", (25, 70)),
    "top.npy": ("float32", (20, 30)),
    "c/stack16.tif": ("uint16", (3, 20, 30)),  # multi-page TIFFs: one file of kind "pages" each
    "c/rgbstack.tif": ("uint8", (2, 18, 25, 3)),
    "ct/slice.tif": ("int16", (30, 40)),  # CT in Hounsfield units
    "ct/volume.npy": ("int16", (3, 20, 30)),
}
BAD = ("bad/corrupt.png", "bad/empty.png", "bad/notes.tif", "bad/mixed_pages.tif")


def _array(dtype, shape, seed):
    rng = np.random.default_rng(seed)
    if dtype == "float32":
        return rng.standard_normal(shape).astype(np.float32)
    if dtype == "int16":
        return rng.integers(-1024, 3072, shape).astype(dtype)
    return rng.integers(0, 4096 if dtype == "uint16" else 256, shape).astype(dtype)


def _write(path: Path, img: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".npy":
        np.save(path, img)
    elif path.suffix == ".tif":
        tifffile.imwrite(path, img, photometric="rgb" if img.shape[-1] == 3 else "minisblack")
    else:
        cv2.imwrite(str(path), cv2.cvtColor(img, cv2.COLOR_RGB2BGR) if img.ndim == 3 else img)


@pytest.fixture
def tree(tmp_path):
    src = tmp_path / "src"
    images = {}
    for i, (rel, (dtype, shape)) in enumerate(GOOD.items()):
        images[rel] = _array(dtype, shape, i)
        _write(src / rel, images[rel])
    (src / "bad").mkdir()
    (src / "bad/corrupt.png").write_bytes(np.random.default_rng(0).integers(0, 256, 500, dtype=np.uint8).tobytes())
    (src / "bad/empty.png").write_bytes(b"")
    (src / "bad/notes.tif").write_text("not an image\n")
    with tifffile.TiffWriter(src / "bad/mixed_pages.tif") as w:  # pages of two shapes: not one stack
        w.write(np.zeros((8, 9), np.uint8))
        w.write(np.zeros((9, 8), np.uint8))
    (src / "README.txt").write_text("ignored: not an image extension\n")
    return src, images


def strict_json(text: str):
    """JSON as any parser reads it: Infinity and NaN are refused."""
    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_compress_resume_decompress_verify(tree, cli, tmp_path):
    src, images = tree
    before = folder_digests(src)
    dst = tmp_path / "dst"
    r = cli("compress", src, dst, "--max-error", "0", "--json", "--device", "cpu")
    assert r.exit_code == 1, r.stderr
    summary = json.loads(r.stdout)
    assert (summary["done"], summary["failed"], summary["skipped"]) == (len(GOOD), len(BAD), 0)
    assert {e["file"] for e in summary["errors"]} == set(BAD)
    assert all(os.path.basename(e["file"]) in e["error"] for e in summary["errors"])
    for rel in GOOD:
        assert is_complete(dst / (rel + ".vsz"))
    assert not any((dst / (b + ".vsz")).exists() for b in BAD)
    assert folder_digests(src) == before  # inputs untouched

    again = json.loads(cli("compress", src, dst, "--max-error", "0", "--json", "--device", "cpu").stdout)
    assert (again["done"], again["skipped"], again["failed"]) == (0, len(GOOD), len(BAD))

    out = tmp_path / "out"
    r = cli("decompress", dst, out, "--format", "tiff", "--json", "--device", "cpu")
    assert r.exit_code == 0, r.stdout + r.stderr
    restored = json.loads(r.stdout)  # ratio and bpp are the .vsz files' either way
    assert restored["bpp"] == summary["bpp"] and restored["bytes_in"] == summary["bytes_out"]
    assert restored["ratio"] == round(restored["bytes_out"] / restored["bytes_in"], 3)
    for rel, img in images.items():
        back = tifffile.imread(out / (rel + ".tif" if not rel.endswith(".tif") else rel))
        assert back.dtype == img.dtype and back.shape == img.shape
        np.testing.assert_array_equal(back, img)
    r = cli("decompress", dst, tmp_path / "png", "--format", "png", "--json", "--device", "cpu")
    assert r.exit_code == 1 and "top.npy.vsz" in r.stdout and "--format tiff" in r.stdout

    r = cli("verify", src, dst, "--device", "cpu", "--json")
    rows = {row["file"]: row for row in strict_json(r.stdout)}  # lossless: PSNR "inf", never Infinity
    assert r.exit_code == 1 and all(rows[rel]["max_error"] == 0 and rows[rel]["psnr"] == "inf" for rel in GOOD)
    assert all("error" in rows[b] for b in BAD)
    assert r.stderr.strip().endswith(f"{len(GOOD)} verified, {len(BAD)} failed; lowest PSNR inf dB, "
                                     "largest max error 0")

    info = strict_json(cli("info", dst / "a/b/rgb8.png.vsz", "--json").stdout)
    assert info["kind"] == "image" and info["meta"]["shape"] == [33, 47, 3] and info["bpp"] > 0
    info = strict_json(cli("info", dst / "c/stack16.tif.vsz", "--json").stdout)
    assert info["kind"] == "pages" and info["meta"]["shape"] == [3, 20, 30] and info["bpp"] > 0


def test_unwritable_destination_is_a_usage_error(tree, cli, tmp_path):
    """A destination the job cannot write into at all stops it before any file, in one line (exit 2)."""
    src, _ = tree
    blocker = tmp_path / "a-file"
    blocker.write_text("in the way")
    r = cli("compress", src / "a", blocker / "out", "--json", "--device", "cpu")
    assert r.exit_code == 2 and "cannot write into" in r.stderr and "Traceback" not in r.stderr
    if os.geteuid() != 0:  # root ignores directory permissions
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        r = cli("compress", src / "a", ro, "--json", "--device", "cpu")
        assert r.exit_code == 2 and "cannot write into" in r.stderr


def test_usage_errors_exit_2(cli, tmp_path):
    r = cli("compress", tmp_path / "missing", tmp_path / "out")
    assert r.exit_code == 2 and "missing" in r.stderr
    r = cli("decompress", tmp_path, tmp_path / "out", "--format", "gif")
    assert r.exit_code == 2 and "gif" in (r.stderr + r.stdout)
    r = cli("compress", tmp_path, tmp_path / "out", "--quality", "9")
    assert r.exit_code == 2
    r = cli("compress", tmp_path, tmp_path / "out", "--loader", "nvjpeg")
    assert r.exit_code == 2 and "nvjpeg" in r.stderr
    if not dali_source.available():  # an explicit GPU loader that is not installed is named, never silently replaced
        _write(tmp_path / "src" / "a.png", _array("uint8", (8, 8), 0))
        r = cli("compress", tmp_path / "src", tmp_path / "out", "--loader", "dali", "--device", "cpu")
        assert r.exit_code == 2 and ("DALI is not installed" in r.stderr or "needs device 'cuda'" in r.stderr)
    assert not (tmp_path / "out").exists()


def test_killed_run_resumes_without_loss(cli, model_weights, tmp_path):
    """The real command in a subprocess, killed after its first output; an in-process rerun completes it."""
    src, dst = tmp_path / "many", tmp_path / "dst"
    images = {f"d{i % 4}/img{i:03d}.png": _array("uint8", (64, 96), i) for i in range(16)}
    for rel, img in images.items():
        _write(src / rel, img)
    env = dict(os.environ, VISEMZ_WEIGHTS_DIR=str(model_weights), VISEMZ_DEVICE="cpu")
    proc = subprocess.Popen([sys.executable, "-m", "visemz", "compress", str(src), str(dst), "--max-error", "0",
                             "--streams", "2"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None and not any(dst.rglob("*.vsz")):
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGKILL, \
        f"the command ended by itself ({proc.returncode}): {err.decode()[-2000:]}"
    assert b"Warning" not in err, err.decode()[-2000:]  # no dependency's warning on the user's terminal
    written = list(dst.rglob("*.vsz"))
    assert 0 < len(written) < len(images), "the run was not interrupted part-way"
    assert all(is_complete(p) for p in written)  # no partial file under a final name
    assert not (dst / "visemz-manifest.json").exists() and list(dst.glob(".visemz-journal-*.jsonl"))
    (dst / "d1").mkdir(exist_ok=True)
    (dst / "d1" / ".visemz-tmp-left-by-a-kill").write_bytes(b"partial")  # as a kill mid-write leaves one

    r = cli("compress", src, dst, "--max-error", "0", "--json", "--device", "cpu")
    summary = json.loads(r.stdout)
    assert r.exit_code == 0 and summary["done"] + summary["skipped"] == len(images)
    assert summary["skipped"] >= len(written)  # the journal recorded each output before it was placed
    assert not list(dst.rglob(".visemz-tmp-*")) and not list(dst.glob(".visemz-journal-*"))
    assert any("temporary file(s) an interrupted run left" in n for n in summary["notes"])
    manifest = json.loads((dst / "visemz-manifest.json").read_text())
    assert sorted(f["rel"] for f in manifest["files"]) == sorted(images)
    assert {f["status"] for f in manifest["files"]} <= {"done", "skipped"}
    out = tmp_path / "out"
    assert cli("decompress", dst, out, "--device", "cpu").exit_code == 0
    for rel, img in images.items():
        np.testing.assert_array_equal(cv2.imread(str(out / rel), cv2.IMREAD_UNCHANGED), img)


def test_demo_runs_the_main_job_and_says_where_its_outputs_are(cli, tmp_path):
    out = tmp_path / "demo"
    r = cli("demo", "--device", "cpu", "--out", out)
    assert r.exit_code == 0, r.stderr
    assert "compressed 8 sample images" in r.stdout and "PSNR" in r.stdout
    assert f"outputs in {out}" in r.stdout
    assert len(list((out / "compressed").glob("*.vsz"))) == 8 and \
        len(list((out / "restored").glob("[!.]*"))) == 9  # and the manifest
    r = cli("demo", "--device", "cpu", "--out", out)  # never into a folder that holds something
    assert r.exit_code == 2 and "not an empty folder" in r.stderr


def test_version_prints_the_package_version(cli):
    r = cli("version")
    assert r.exit_code == 0 and r.stdout.strip() == visemz.__version__


def test_large_tiff_and_volume_tiled_and_a_region_decoded(cli, tmp_path):
    """compress writes tiled files for a 16-bit gray TIFF, an 8-bit RGB TIFF and a .npy volume (a stack of
    tiled planes); decompress --region writes only that window, the same pixels as the full decode's."""
    src, dst, out = tmp_path / "src", tmp_path / "dst", tmp_path / "out"
    rng = np.random.default_rng(5)
    cam = data.camera()
    inputs = {"gray16.tif": cam[:200, :150].astype(np.uint16) * 250
              + rng.integers(0, 200, (200, 150)).astype(np.uint16),
              "rgb8.tif": data.astronaut()[:130, :200], "volume.npy": np.stack([cam[:70, :130], cam[100:170, 200:330]])}
    for name, img in inputs.items():
        _write(src / name, img)
    assert cli("compress", src, dst, "--tile", "64", "--device", "cpu", "--quality", "3").exit_code == 0
    for name in inputs:
        c = container.unpack((dst / f"{name}.vsz").read_bytes())
        first = container.unpack(bytes(pages.page_buffers(c)[0])) if c.kind == pages.KIND else c
        assert first.meta["format"] == FORMAT and first.meta["tiles"]["grid"][0] >= 2, name
    r = cli("decompress", dst, out, "--region", "10:60,20:120", "--format", "npy", "--device", "cpu")
    assert r.exit_code == 0, r.stdout + r.stderr
    for name, img in inputs.items():
        got = np.load(out / (Path(name).stem + ".npy" if name.endswith(".npy") else f"{name}.npy"))
        full = visemz.decompress((dst / f"{name}.vsz").read_bytes(), device="cpu")
        window = full[:, 10:60, 20:120] if name == "volume.npy" else full[10:60, 20:120]
        assert got.dtype == img.dtype and np.array_equal(got, window), name
    r = cli("decompress", dst, out, "--region", "10:60;20:120")
    assert r.exit_code == 2 and "10:60;20:120" in r.stderr
    for empty in ("10:0,0:10", "-5:10,0:10", "5:5,0:10"):  # refused before any file is opened
        r = cli("decompress", dst, tmp_path / "none", "--region", empty)
        assert r.exit_code == 2 and "0 <= y0 < y1" in r.stderr and not (tmp_path / "none").exists(), r.stderr
    r = cli("compress", src, dst, "--tile", "100")
    assert r.exit_code == 2 and "tile=100" in r.stderr


@pytest.mark.parametrize("tile", ["65536", "100"])
def test_a_tile_the_reader_refuses_is_a_usage_error(cli, tmp_path, tile):
    """Before any output: exit 2, the value named, no traceback, no output folder."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    _write(src / "gray8.png", data.camera()[:40, :52])
    r = cli("compress", src, dst, "--tile", tile, "--device", "cpu")
    assert r.exit_code == 2 and f"--tile={tile}: expected a multiple of 64 pixels in 64..32768" in r.stderr
    assert "Traceback" not in r.stdout + r.stderr and not dst.exists()


# ------------------------------------------------------------------ a CLI that answers fast and plainly
NO_TORCH = ("import sys, atexit; atexit.register(lambda: print('torch loaded' if {'torch', 'compressai'} & "
            "set(sys.modules) else 'torch not loaded', file=sys.stderr)); sys.argv = ['visemz', *sys.argv[1:]]; "
            "from visemz.cli import main; main()")


def test_help_usage_errors_version_and_info_load_no_torch(tmp_path, model_weights):
    """Each in a fresh process: the answer, its exit code, and neither torch nor CompressAI imported."""
    src, empty = tmp_path / "src", tmp_path / "empty"
    _write(src / "a.png", _array("uint8", (16, 16), 0))
    empty.mkdir()
    vsz = tmp_path / "v" / "a.png.vsz"
    vsz.parent.mkdir()
    vsz.write_bytes(visemz.compress(_array("uint8", (16, 16), 0), device="cpu"))
    cases = [(["--help"], 0, "compress"), (["version"], 0, visemz.__version__), (["info", vsz], 0, "16x16 uint8"),
             (["info", vsz.parent, "--json"], 0, '"files"'),
             (["compress", src, tmp_path / "d", "--model", "nope"], 2, "nope"),
             (["compress", src, tmp_path / "d", "--max-error", "nan"], 2, "max_error=nan"),
             (["compress", src, tmp_path / "d", "--max-error", "-1"], 2, "max_error=-1"),
             (["compress", src, tmp_path / "d", "--entropy", "lz4"], 2, "lz4"),
             (["compress", src, tmp_path / "d", "--entropy", "ans", "--device", "cpu"], 2, "entropy 'ans'"),
             (["compress", src, tmp_path / "d", "--quality", "9"], 2, "--quality"),
             (["compress", src, tmp_path / "d", "--quality", "nan"], 2, "quality=nan"),
             (["compress", src, src], 2, "is the source"), (["compress", empty, tmp_path / "d"], 2, "no images"),
             (["decompress", src, tmp_path / "d", "--format", "gif"], 2, "gif"),
             (["compress", src, tmp_path / "d", "--refine", "-1"], 2, "--refine"),
             (["ints-info", tmp_path / "nothing"], 2, "cannot read"),
             (["info", tmp_path / "nothing"], 2, "neither a file nor a folder"), (["compres"], 2, "No such command")]
    for args, code, says in cases:
        p = subprocess.run([sys.executable, "-c", NO_TORCH, *map(str, args)], capture_output=True, text=True,
                           timeout=120, env=dict(os.environ, VISEMZ_WEIGHTS_DIR=str(model_weights)))
        assert p.returncode == code and says in p.stdout + p.stderr, (args, p.returncode, p.stdout, p.stderr)
        assert p.stderr.rstrip().endswith("torch not loaded") and "Traceback" not in p.stderr, (args, p.stderr)
    assert not (tmp_path / "d").exists()
    p = subprocess.run([sys.executable, "-c", "import sys, visemz; assert 'torch' not in sys.modules; "
                        "visemz.ImageCodec; assert 'torch' in sys.modules; print(visemz.compress.__module__)"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "visemz.api", p.stderr


def test_info_reads_folders_and_its_json_is_strict(cli, tmp_path):
    folder = tmp_path / "v"
    (folder / "sub").mkdir(parents=True)
    img = _array("uint8", (32, 48), 1)
    buf = visemz.compress(img, device="cpu", quality=2)
    (folder / "a.png.vsz").write_bytes(buf)
    crafted = repack_header(buf, lambda text: text.replace('"max_error":null', '"max_error":1e400'))
    (folder / "sub" / "inf.png.vsz").write_bytes(crafted)
    (folder / "sub" / "junk.vsz").write_bytes(b"not a container")
    r = cli("info", folder, "--json")
    doc = strict_json(r.stdout)
    rows = {row["file"]: row for row in doc["files"]}
    assert r.exit_code == 1 and "meta.max_error holds inf" in rows["sub/inf.png.vsz"]["error"]
    assert "error" in rows["sub/junk.vsz"]
    assert rows["a.png.vsz"]["bpp"] == round(8 * len(buf) / (32 * 48), 4)
    assert r.stderr.strip() == doc["summary"] and doc["summary"].startswith("1 file(s)") and \
        "2 unreadable" in doc["summary"]
    r = cli("info", folder / "a.png.vsz")
    assert r.exit_code == 0 and "a.png.vsz: image 32x48 uint8" in r.stdout and "bpp" in r.stdout
    r = cli("info", folder / "sub" / "junk.vsz")
    assert r.exit_code == 2 and "junk.vsz" in r.stderr and "Traceback" not in r.stderr


def test_verify_uses_the_datas_peak_and_16_bit_losses_are_warned_once(cli, tmp_path):
    """12-bit data in uint16 files: PSNR against 4095, named; a lossy encode of 16-bit data that loses
    a bright point (a star) warns once for the job; --max-error does not warn."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    rng = np.random.default_rng(3)
    sky = rng.integers(0, 40, (2, 64, 64)).astype(np.uint16)
    sky[:, 20, 33] = 65000  # a star on each
    src.mkdir()
    for k in range(2):
        tifffile.imwrite(src / f"sky{k}.tif", sky[k])
    r = cli("compress", src, dst, "--device", "cpu")
    assert r.exit_code == 0 and r.stderr.count("visemz: warning:") == 1, r.stderr
    assert "lost up to" in r.stderr and "--max-error" in r.stderr
    r = cli("compress", src, tmp_path / "bounded", "--device", "cpu", "--max-error", "2")
    assert r.exit_code == 0 and "warning" not in r.stderr

    xray = tmp_path / "xray"
    xray.mkdir()
    tifffile.imwrite(xray / "x.tif", rng.integers(0, 4096, (48, 64)).astype(np.uint16))
    assert cli("compress", xray, tmp_path / "xd", "--device", "cpu", "--max-error", "8").exit_code == 0
    r = cli("verify", xray, tmp_path / "xd", "--device", "cpu", "--json")
    row = strict_json(r.stdout)[0]
    assert row["peak"] == 4095 and 0 < row["max_error"] <= 8
    err = (visemz.decompress((tmp_path / "xd" / "x.tif.vsz").read_bytes()).astype(float)
           - tifffile.imread(xray / "x.tif").astype(float))
    assert row["psnr"] == round(10 * np.log10(4095 ** 2 / np.mean(err ** 2)), 3)
    r = cli("verify", xray, tmp_path / "xd", "--device", "cpu")
    assert "(peak 4095)" in r.stdout and r.stdout.strip().endswith(f"largest max error {row['max_error']:g}")
    ct = tmp_path / "ct"  # signed: the span's bits, -1024..3071 is 12-bit
    ct.mkdir()
    tifffile.imwrite(ct / "c.tif", rng.integers(-1024, 3072, (48, 64)).astype(np.int16))
    assert cli("compress", ct, tmp_path / "cd", "--device", "cpu", "--max-error", "8").exit_code == 0
    assert strict_json(cli("verify", ct, tmp_path / "cd", "--device", "cpu", "--json").stdout)[0]["peak"] == 4095


def test_progress_lines_with_total_and_eta_when_not_on_a_terminal(cli, tmp_path):
    src = tmp_path / "src"
    for k in range(3):
        _write(src / f"{k}.png", _array("uint8", (16, 16), k))
    r = cli("compress", src, tmp_path / "dst", "--device", "cpu")
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("compress: ")]
    assert lines[-1].startswith("compress: 3/3 (100%)") and "ETA" in lines[-1] and "img/s" in lines[-1]
    r = cli("compress", src, tmp_path / "dst2", "--device", "cpu", "--quiet")
    assert "compress: " not in r.stderr


def test_progress_bar_on_a_terminal_shows_total_and_eta():
    import io

    from visemz.pipeline.progress import Progress
    from visemz.pipeline.results import ItemResult

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    term = Terminal()
    with Progress("compress", "bytes_in", term) as p:
        p.start(4)
        for k in range(4):
            p(ItemResult(f"{k}.png", "done", bytes_in=1000))
        assert p._bar is not None and p._bar.tasks[0].total == 4 and p._bar.tasks[0].completed == 4


@pytest.mark.parametrize("var, value", [("VISEMZ_STREAMS", "65"), ("VISEMZ_DEVICE", "gpu")])  # a process each
def test_a_bad_setting_in_the_environment_is_a_usage_error(tmp_path, var, value):
    """A VISEMZ_* variable out of its rule: the command says which and exits 2, no traceback (the settings are read
    when a command first needs one, not when visemz is imported)."""
    _write(tmp_path / "src/a.png", _array("uint8", (16, 16), 0))
    env = dict(os.environ, **{var: value})
    r = subprocess.run([sys.executable, "-m", "visemz", "compress", str(tmp_path / "src"), str(tmp_path / "dst"),
                        "--device", "cpu"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and f"{var}=" in r.stderr and value in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "dst").exists()


def test_streams_beyond_the_bound_are_refused(cli, tmp_path):
    _write(tmp_path / "src/a.png", _array("uint8", (16, 16), 0))
    for command in (("compress", tmp_path / "src", tmp_path / "dst"), ("decompress", tmp_path / "src", tmp_path / "o")):
        r = cli(*command, "--streams", "65")
        assert r.exit_code == 2 and "--streams" in r.stderr and not (tmp_path / command[2]).exists()


def test_a_model_without_installed_weights_is_refused_before_any_file(cli, tmp_path, monkeypatch):
    _write(tmp_path / "src/a.png", _array("uint8", (16, 16), 0))
    weights = tmp_path / "weights"  # the gray mbt2018-mean weights only
    weights.mkdir()
    gray = W.weights_path(registry.spec("mbt2018-mean", "gray"))
    (weights / gray.name).symlink_to(gray.resolve())
    monkeypatch.setenv("VISEMZ_WEIGHTS_DIR", str(weights))
    r = cli("compress", tmp_path / "src", tmp_path / "dst", "--model", "balle2016", "--device", "cpu")
    assert r.exit_code == 2 and "'balle2016': no weights are installed" in r.stderr
    assert not (tmp_path / "dst").exists()
    r = cli("compress", tmp_path / "src", tmp_path / "dst", "--model", "mbt2018-mean", "--device", "cpu")
    assert r.exit_code == 0, r.stderr


def _gray_alpha_png(img: np.ndarray) -> bytes:
    """A gray and alpha PNG (colour type 4) of 8- or 16-bit samples, chunk by chunk (neither OpenCV nor Pillow
    writes the 16-bit one)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    h, w, _ = img.shape
    rows = b"".join(b"\x00" + img[y].astype(img.dtype.newbyteorder(">")).tobytes() for y in range(h))
    ihdr = struct.pack(">IIBBBBB", w, h, img.dtype.itemsize * 8, 4, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


@pytest.mark.parametrize("dtype", ["uint8", "uint16"])
def test_gray_and_alpha_pngs_keep_their_two_channels(cli, tmp_path, dtype):
    """OpenCV reads a gray and alpha PNG as four channels (the gray three times): it is compressed as the two it
    holds, and restored as a PNG of them where one can be written (8 bits), else refused by name."""
    img = _array(dtype, (24, 20, 2), 3)
    (tmp_path / "src").mkdir()
    (tmp_path / "src/la.png").write_bytes(_gray_alpha_png(img))
    assert cli("compress", tmp_path / "src", tmp_path / "c", "--max-error", "0").exit_code == 0
    info = strict_json(cli("info", tmp_path / "c/la.png.vsz", "--json").stdout)
    assert json.dumps(info).count("[24, 20, 2]") >= 1, info
    r = cli("decompress", tmp_path / "c", tmp_path / "o")
    if dtype == "uint8":
        assert r.exit_code == 0, r.stderr
        restored = np.asarray(PIL.Image.open(tmp_path / "o/la.png"))
        np.testing.assert_array_equal(restored, img)
    else:
        assert r.exit_code == 1 and "2-channel uint16 image cannot be written as PNG" in r.stderr, r.stderr
        assert cli("decompress", tmp_path / "c", tmp_path / "t", "--format", "tiff").exit_code == 0
        np.testing.assert_array_equal(tifffile.imread(tmp_path / "t/la.png.tif"), img)


def test_a_volume_with_a_short_last_axis_is_a_page_stack(cli, tmp_path):
    """A (3, 64, 48) .npy is three pages of 64 x 48, not a 3 x 64 image of 48 channels; (16, 16, 5) is an image."""
    vol, img = _array("uint8", (3, 64, 48), 1), _array("uint8", (16, 16, 5), 2)
    _write(tmp_path / "src/vol.npy", vol)
    _write(tmp_path / "src/img.npy", img)
    assert cli("compress", tmp_path / "src", tmp_path / "c", "--max-error", "0").exit_code == 0
    assert container.unpack((tmp_path / "c/vol.npy.vsz").read_bytes()).kind == pages.KIND
    assert container.unpack((tmp_path / "c/img.npy.vsz").read_bytes()).kind != pages.KIND
    assert cli("decompress", tmp_path / "c", tmp_path / "o").exit_code == 0
    np.testing.assert_array_equal(np.load(tmp_path / "o/vol.npy"), vol)
    np.testing.assert_array_equal(np.load(tmp_path / "o/img.npy"), img)


def test_images_of_other_channel_counts_are_not_written_as_png(cli, tmp_path):
    _write(tmp_path / "src/five.npy", _array("uint8", (16, 16, 5), 0))
    assert cli("compress", tmp_path / "src", tmp_path / "c", "--max-error", "0").exit_code == 0
    r = cli("decompress", tmp_path / "c", tmp_path / "o", "--format", "png")
    assert r.exit_code == 1 and "5-channel uint8 image cannot be written as PNG here" in r.stderr, r.stderr
    assert "OpenCV" not in r.stderr


def test_user_errors_of_other_commands_print_no_traceback(cli, tmp_path):
    r = cli("ints-info", tmp_path / "nonexistent")
    assert r.exit_code == 2 and "cannot read" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "junk").write_bytes(b"\x00" * 40)
    r = cli("ints-info", tmp_path / "junk")
    assert r.exit_code == 2 and "Traceback" not in r.stderr
    frames = tmp_path / "frames"
    _write(frames / "a.png", _array("uint8", (16, 16), 0))
    _write(frames / "b.png", _array("uint8", (16, 20), 1))
    r = cli("stack", frames, "--out", tmp_path / "stack.tif", "--device", "cpu")
    assert r.exit_code == 2 and "must share one shape" in r.stderr and not (tmp_path / "stack.tif").exists()
    (frames / "b.png").unlink()
    _write(frames / "b.png", _array("uint8", (16, 16), 1))
    r = cli("stack", frames, "--out", tmp_path / "stack.tif", "--device", "cpu")
    report = strict_json(r.stdout)
    assert r.exit_code == 0 and report["ranks"] == 1 and "one rank" in report["note"]
    assert r.stderr.strip().startswith("stacked 2 frames on 1 rank(s) with plain: max error")
    assert strict_json((tmp_path / "stack.tif.json").read_text()) == report
    before = {p: p.read_bytes() for p in frames.iterdir()}
    for out, said in ((frames / "a.png", "name it .tif or .tiff"), (tmp_path / "stack.tif", "exists"),
                      (tmp_path / "stack.txt", ".tif or .tiff")):
        r = cli("stack", frames, "--out", out, "--device", "cpu")  # a frame, the last stack, not a TIFF: refused
        assert r.exit_code == 2 and said in r.stderr and "Traceback" not in r.stderr, r.stderr
    (frames / "a.tif").write_bytes(b"")  # a frame of the stack named as its output
    r = cli("stack", frames, "--out", frames / "a.tif", "--device", "cpu")
    assert r.exit_code == 2 and "exists" in r.stderr
    (frames / "a.tif").unlink()
    assert {p: p.read_bytes() for p in frames.iterdir()} == before
    for bound in ("0", "-1", "nan", "inf"):
        r = cli("stack", frames, "--out", tmp_path / "other.tif", "--device", "cpu", "--error-bound", bound)
        assert r.exit_code == 2 and f"error_bound={float(bound)!r}" in r.stderr, r.stderr
    tifffile.imwrite(frames / "c.tif", np.full((16, 16), np.nan, np.float32))
    r = cli("stack", frames, "--out", tmp_path / "other.tif", "--device", "cpu")
    assert r.exit_code == 2 and "'c.tif' holds NaN" in r.stderr and not (tmp_path / "other.tif").exists()
