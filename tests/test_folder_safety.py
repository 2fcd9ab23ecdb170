"""Folder jobs with a lab's data (CPU): inputs never written over, reruns that notice change, one bad
file never stopping the others, a destination shared by no two jobs, the memory gate."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
import tifffile

from visemz.io import files, loaders, writers
from visemz.pipeline import manifest, memory
from visemz.pipeline.jobs import CompressConfig, DecompressConfig, compress_folder, decompress_folder

from .helpers import folder_digests
from .test_cli import strict_json


def _png(path: Path, seed: int, shape=(24, 32)) -> np.ndarray:
    img = np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), img)
    return img


@pytest.fixture
def src(tmp_path):
    s = tmp_path / "S"
    for k, rel in enumerate(("a.png", "sub/b.png", "sub/deep/c.png")):
        _png(s / rel, k)
    return s


# ------------------------------------------------------------------ inputs are sacred
def test_compress_then_decompress_into_the_source_leaves_the_originals(cli, src, tmp_path):
    before = folder_digests(src, links=False)
    link = tmp_path / "link-to-S"
    link.symlink_to(src)
    for cmd in ("compress", "decompress"):
        for dst in (src, src / "sub", src / "new" / "deeper", tmp_path, link, link / "sub"):
            r = cli(cmd, src, dst, "--device", "cpu")
            assert r.exit_code == 2, (cmd, dst, r.stdout, r.stderr)
            assert "visemz: error: destination" in r.stderr and "Traceback" not in r.stderr
        r = cli(cmd, src / "sub", src, "--device", "cpu")  # the other way round: the source inside the destination
        assert r.exit_code == 2 and "contains the source" in r.stderr
        r = cli(cmd, src / "a.png", src, "--device", "cpu")  # a file source whose folder is the destination
        assert r.exit_code == 2 and "contains the source" in r.stderr
    assert folder_digests(src, links=False) == before and not (src / "new").exists()


def test_files_the_job_did_not_write_are_never_written_over(cli, src, tmp_path):
    dst, out = tmp_path / "D", tmp_path / "O"
    dst.mkdir()
    (dst / "a.png.vsz").write_bytes(b"the user's own file")
    r = cli("compress", src, dst, "--device", "cpu", "--json")
    summary = strict_json(r.stdout)
    assert r.exit_code == 1 and (summary["done"], summary["failed"]) == (2, 1)
    assert "is not an output of this job" in summary["errors"][0]["error"]
    assert (dst / "a.png.vsz").read_bytes() == b"the user's own file"
    again = strict_json(cli("compress", src, dst, "--device", "cpu", "--json", "--no-resume").stdout)
    assert again["failed"] == 1 and (dst / "a.png.vsz").read_bytes() == b"the user's own file"

    # decompressing into a folder of originals refuses each original, by name
    originals = tmp_path / "originals"
    _png(originals / "sub/b.png", 1)
    before = folder_digests(originals, links=False)
    r = cli("decompress", dst, originals, "--device", "cpu", "--json")
    summary = strict_json(r.stdout)
    errors = {e["file"]: e["error"] for e in summary["errors"]}
    assert r.exit_code == 1 and summary["done"] == 1 and sorted(errors) == ["a.png.vsz", "sub/b.png.vsz"]
    assert "container" in errors["a.png.vsz"]  # the user's file in D does not decode
    assert "originals/sub/b.png' exists and is not an output of this job" in errors["sub/b.png.vsz"]
    assert folder_digests(originals, links=False)["sub/b.png"] == before["sub/b.png"]  # the original, untouched

    # a file in the way that is not a visemz manifest stops the job before any work
    (out / "visemz-manifest.json").parent.mkdir()
    (out / "visemz-manifest.json").write_text("notes of my own")
    r = cli("compress", src, out, "--device", "cpu")
    assert r.exit_code == 2 and "is not a visemz manifest" in r.stderr
    assert (out / "visemz-manifest.json").read_text() == "notes of my own"


def test_a_link_in_the_destination_never_leads_a_write_into_the_source(cli, src, tmp_path):
    dst = tmp_path / "D"
    dst.mkdir()
    (dst / "sub").symlink_to(src / "sub")
    before = folder_digests(src, links=False)
    d = strict_json(cli("compress", src, dst, "--device", "cpu", "--json").stdout)
    assert d["done"] == 1 and sorted(e["file"] for e in d["errors"]) == ["sub/b.png", "sub/deep/c.png"]
    assert all("leads out of the destination" in e["error"] for e in d["errors"])
    assert folder_digests(src, links=False) == before and not list(src.rglob("*.vsz"))


def test_an_empty_source_is_refused_and_nothing_is_created(cli, tmp_path):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    (tmp_path / "empty" / "notes.txt").write_text("not an image")
    for cmd, what in (("compress", "no images"), ("decompress", "no .vsz files")):
        r = cli(cmd, tmp_path / "empty", tmp_path / "D", "--device", "cpu")
        assert r.exit_code == 2 and what in r.stderr and "Traceback" not in r.stderr
        assert not (tmp_path / "D").exists()


def test_a_second_job_on_the_same_destination_is_refused(cli, src, tmp_path):
    dst = tmp_path / "D"
    with writers.FolderLock(dst):
        r = cli("compress", src, dst, "--device", "cpu")
    assert r.exit_code == 2 and "another visemz job is writing into" in r.stderr
    assert cli("compress", src, dst, "--device", "cpu").exit_code == 0  # released with the job


# ------------------------------------------------------------------ resume that knows what it did
def test_a_rerun_makes_again_what_changed_and_says_why(cli, tmp_path, model_weights):
    """A real folder: a source edited (same size, time set back: only its hash tells), a source touched
    (time changed, same bytes: kept), other settings, --no-resume; the manifest says each file's state."""
    src, dst = tmp_path / "S", tmp_path / "D"
    src.mkdir()
    vol = np.random.default_rng(0).integers(0, 4096, (24, 40), dtype=np.uint16)
    np.save(src / "frame.npy", vol)
    _png(src / "a.png", 1)
    _png(src / "b.png", 2)
    first = strict_json(cli("compress", src, dst, "--device", "cpu", "--json").stdout)
    assert (first["done"], first["skipped"]) == (3, 0)

    stat = (src / "frame.npy").stat()
    edited = vol.copy()
    edited[3, 5] ^= 1  # one value: the same size
    np.save(src / "frame.npy", edited)
    os.utime(src / "frame.npy", ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and the same time
    os.utime(src / "a.png")  # touched: a new time, the same bytes
    r = cli("compress", src, dst, "--device", "cpu", "--json")
    d = strict_json(r.stdout)
    assert (d["done"], d["skipped"]) == (1, 2) and d["redone"] == {"source changed": 1}
    assert d["redone_files"] == [{"file": "frame.npy", "reason": "source changed"}]
    assert "made again: 1 source changed" in r.stderr
    from visemz import decompress
    np.testing.assert_array_less(np.abs(decompress((dst / "frame.npy.vsz").read_bytes()).astype(int) - edited), 4096)

    for args, reason in ((("--quality", "6"), "other settings (quality 4.0 -> 6.0)"),
                         (("--quality", "6", "--max-error", "0"), "other settings (max_error None -> 0.0)"),
                         (("--quality", "6", "--max-error", "0", "--no-resume"), "--no-resume")):
        d = strict_json(cli("compress", src, dst, "--device", "cpu", "--json", *args).stdout)
        assert d["done"] == 3 and d["skipped"] == 0, args
        assert {f["reason"] for f in d["redone_files"]} == {reason}, args
    d = strict_json(cli("compress", src, dst, "--device", "cpu", "--json", "--quality", "6", "--max-error", "0").stdout)
    assert (d["done"], d["skipped"]) == (0, 3)
    from visemz import decompress as dec
    np.testing.assert_array_equal(dec((dst / "frame.npy.vsz").read_bytes()), edited)  # lossless now, and current

    doc = json.loads((dst / manifest.MANIFEST).read_text())
    entry = {f["rel"]: f for f in doc["files"]}["frame.npy"]
    source = entry["record"]["source"]
    assert source["size"] == (src / "frame.npy").stat().st_size and source["mtime_ns"] == stat.st_mtime_ns
    assert source["xxh64"] == files.identify(src / "frame.npy").xxh64
    settings = doc["settings_table"][entry["record"]["settings"]]
    assert settings["quality"] == 6.0 and settings["max_error"] == 0.0 and settings["model"] == "mbt2018-mean"
    assert {"tile", "refine", "entropy", "format", "weights"} <= set(settings)


def test_an_output_changed_by_someone_else_is_no_longer_the_jobs(cli, src, tmp_path):
    dst = tmp_path / "D"
    assert cli("compress", src, dst, "--device", "cpu").exit_code == 0
    (dst / "a.png.vsz").write_bytes(b"edited by hand")
    d = strict_json(cli("compress", src, dst, "--device", "cpu", "--json").stdout)
    assert d["failed"] == 1 and "is not an output of this job" in d["errors"][0]["error"]
    assert (dst / "a.png.vsz").read_bytes() == b"edited by hand"


def test_decompress_resumes_and_names_outputs_by_the_source_type(cli, tmp_path):
    src, dst, out = tmp_path / "S", tmp_path / "D", tmp_path / "O"
    img16 = np.random.default_rng(0).integers(0, 4096, (20, 28), dtype=np.uint16)
    src.mkdir()
    tifffile.imwrite(src / "x.tif", img16)
    tifffile.imwrite(src / "y.tiff", img16[:, :20])
    np.save(src / "v.npy", np.random.default_rng(1).standard_normal((12, 16)).astype(np.float32))
    _png(src / "p.png", 2)
    _png(src / "j.bmp", 3)
    assert cli("compress", src, dst, "--device", "cpu", "--max-error", "0").exit_code == 0
    d = strict_json(cli("decompress", dst, out, "--device", "cpu", "--json").stdout)
    assert d["done"] == 5
    assert sorted(p.name for p in out.glob("[!.]*")) == ["j.bmp.png", "p.png", "v.npy", "visemz-manifest.json",
                                                         "x.tif", "y.tiff"]
    np.testing.assert_array_equal(tifffile.imread(out / "x.tif"), img16)
    d = strict_json(cli("decompress", dst, out, "--device", "cpu", "--json").stdout)
    assert (d["done"], d["skipped"]) == (0, 5)
    d = strict_json(cli("decompress", dst, tmp_path / "P", "--device", "cpu", "--json", "--format", "png").stdout)
    assert d["failed"] == 1 and "v.npy.vsz" in d["errors"][0]["file"]  # float32 cannot be PNG
    assert (tmp_path / "P" / "x.tif.png").is_file()


def test_a_region_summary_counts_the_files_whole_pixels(cli, tmp_path):
    src, dst = tmp_path / "S", tmp_path / "D"
    _png(src / "a.png", 0, (64, 96))
    c = strict_json(cli("compress", src, dst, "--device", "cpu", "--json").stdout)
    d = strict_json(cli("decompress", dst, tmp_path / "O", "--device", "cpu", "--json", "--region", "0:8,0:8").stdout)
    assert d["bpp"] == c["bpp"]  # the file's bits over the file's pixels, not the window's
    assert cv2.imread(str(tmp_path / "O" / "a.png"), cv2.IMREAD_UNCHANGED).shape == (8, 8)


# ------------------------------------------------------------------ one bad file never stops the others
def test_every_bad_file_fails_alone_with_its_reason(cli, tmp_path, monkeypatch):
    src, dst = tmp_path / "S", tmp_path / "D"
    _png(src / "good.png", 0)
    odd = os.fsencode(src) + b"/\xff-odd.png"  # a name that is not UTF-8 (OpenCV's imread crashed on one)
    with open(odd, "wb") as f:
        f.write(cv2.imencode(".png", np.full((16, 16), 7, np.uint8))[1].tobytes())
    (src / "zero.png").symlink_to("/dev/zero")
    (src / "loop.png").symlink_to("loop.png")
    (src / "nowhere.png").symlink_to(src / "missing.png")
    outside = tmp_path / "outside.png"
    _png(outside, 1)
    (src / "out.png").symlink_to(outside)
    (src / "linked.png").symlink_to(src / "good.png")  # inside the tree: read as its target
    (src / "linkdir").symlink_to(src)  # a link to a folder (its own): not followed
    os.mkfifo(src / "pipe.png")
    (src / "garbage.png").write_bytes(b"\x89PNG not really")
    _png(src / "huge.png", 2)
    _png(src / "bug.png", 3)
    real_decode = loaders.decode

    def decode(data, ext):  # a file too large for memory, and a bug of one file
        img = real_decode(data, ext)
        if img[0].size == 24 * 32 and int(img[0][0, 0]) == int(cv2.imread(str(src / "huge.png"), 0)[0, 0]):
            raise MemoryError("cannot allocate 12 GiB")
        if img[0].size == 24 * 32 and int(img[0][0, 0]) == int(cv2.imread(str(src / "bug.png"), 0)[0, 0]):
            raise KeyError("a bug")
        return img

    monkeypatch.setattr(loaders, "decode", decode)
    r = cli("compress", src, dst, "--device", "cpu", "--json")
    assert r.exit_code == 1 and "Traceback" not in r.stderr
    d = strict_json(r.stdout)
    errors = {e["file"]: e["error"] for e in d["errors"]}
    assert d["done"] == 3 and d["skipped"] == 0 and len(errors) == 9, errors  # good, linked, \xff-odd
    assert "in a loop" in errors["loop.png"] and "to nothing" in errors["nowhere.png"]
    assert "outside the source folder" in errors["zero.png"] and "outside the source folder" in errors["out.png"]
    assert "not a regular file" in errors["pipe.png"] and "not followed" in errors["linkdir"]
    assert "not an image OpenCV can decode" in errors["garbage.png"]
    assert "does not fit in memory" in errors["huge.png"] and "KeyError" in errors["bug.png"]
    assert (dst / os.fsdecode(b"\xff-odd.png.vsz")).is_file()
    doc = json.loads((dst / manifest.MANIFEST).read_text())  # every file, with its state
    assert len(doc["files"]) == 12 and {f["status"] for f in doc["files"]} == {"done", "failed"}
    r = cli("verify", src, dst, "--device", "cpu", "--json")
    rows = {row["file"]: row for row in strict_json(r.stdout)}
    assert r.exit_code == 1 and rows["\\xff-odd.png"]["max_error"] <= 255 and "error" in rows["zero.png"]


def test_a_png_header_declares_the_values_it_decodes_to(tmp_path):
    """Every kind of PNG: the values its header declares (colour type, a tRNS chunk) are the values it decodes to, so
    that the limit refuses from the header exactly what it would refuse after decoding."""
    import PIL.Image

    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)
    gray = rgb[..., 0]
    kinds = {
        "gray": PIL.Image.fromarray(gray), "gray16": PIL.Image.fromarray(gray.astype(np.uint16) * 257),
        "rgb": PIL.Image.fromarray(rgb), "rgba": PIL.Image.fromarray(np.dstack([rgb, gray])),
        "gray-alpha": PIL.Image.fromarray(np.dstack([gray, gray]), "LA"),
        "palette": PIL.Image.fromarray(rgb).quantize(16),
    }
    extra = {"palette-trns": ("palette", {"transparency": 0}), "rgb-trns": ("rgb", {"transparency": (0, 0, 0)}),
             "gray-trns": ("gray", {"transparency": 0})}
    paths = {}
    for name, im in kinds.items():
        im.save(paths.setdefault(name, tmp_path / f"{name}.png"))
    for name, (base, options) in extra.items():
        kinds[base].save(paths.setdefault(name, tmp_path / f"{name}.png"), **options)
    for name, path in paths.items():
        data = path.read_bytes()
        assert (b"tRNS" in data) == name.endswith("trns"), name
        assert loaders.declared_values(data, ".png") == loaders.load(path).pixels.size, name
    cut = paths["rgb"].read_bytes()[:33]  # IHDR only: the channels a transparency chunk would add are counted
    assert loaders.declared_values(cut, ".png") == 12 * 10 * 4


def test_an_image_over_the_pixel_limit_is_refused_from_its_header(tmp_path, monkeypatch):
    """A PNG, TIFF or .npy whose header declares more values than the limit is refused before it is decoded (a
    PNG of zeros holds a huge image in a few bytes); a file within the limit, or of another format, decodes."""
    from visemz import defaults
    from visemz.errors import LimitExceededError

    img = np.zeros((40, 30, 3), np.uint8)
    paths = {"png": tmp_path / "a.png", "tif": tmp_path / "b.tif", "npy": tmp_path / "c.npy"}
    cv2.imwrite(str(paths["png"]), img)
    tifffile.imwrite(paths["tif"], np.zeros((2, 40, 30), np.uint16))  # two pages: 2,400 values
    np.save(paths["npy"], img)
    assert [loaders.declared_values(p.read_bytes(), p.suffix) for p in paths.values()] == [3600, 2400, 3600]
    assert loaders.declared_values(b"\x89PNG\r\n\x1a\n", ".png") is None  # no header: the decoder reports it

    def no_decode(data, ext):
        raise AssertionError("decoded")

    monkeypatch.setattr(loaders, "decode", no_decode)
    with defaults.set(max_pixels=2399):
        for p in paths.values():
            with pytest.raises(LimitExceededError, match=f"{p.name}.*VISEMZ_MAX_PIXELS"):
                loaders.load(p)
    monkeypatch.undo()
    with defaults.set(max_pixels=3600):
        assert loaders.load(paths["png"]).pixels.shape == (40, 30, 3)
        assert loaders.load(paths["tif"]).paged


# ------------------------------------------------------------------ memory
def test_available_memory_reads_meminfo_and_the_cgroup(tmp_path, monkeypatch):
    (tmp_path / "meminfo").write_text("MemTotal: 24000000 kB\nMemAvailable: 20000000 kB\n")
    (tmp_path / "cg").mkdir()
    monkeypatch.setattr(memory, "MEMINFO", tmp_path / "meminfo")
    monkeypatch.setattr(memory, "CGROUP", tmp_path / "cg")
    assert memory.available() == 20000000 * 1024
    (tmp_path / "cg" / "memory.max").write_text("8000000000\n")
    (tmp_path / "cg" / "memory.current").write_text("1000000000\n")
    assert memory.available() == 7_000_000_000
    (tmp_path / "cg" / "memory.max").write_text("max\n")
    assert memory.available() == 20000000 * 1024


def test_the_gate_runs_large_images_one_at_a_time_when_two_do_not_fit(tmp_path, monkeypatch):
    """2400x1900 X-rays compressed with an error bound, with memory for one and a half of them: one at a
    time; small images side by side; one larger than the budget still runs, alone.  On 22 GB available
    two X-rays fit (this version's codec needs about 2.5 GB for one, striped)."""
    xray = memory.estimate(2400 * 1900, bounded=True)
    (tmp_path / "meminfo").write_text(f"MemAvailable: {int(1.5 * xray / memory.SHARE) // 1024} kB\n")
    monkeypatch.setattr(memory, "MEMINFO", tmp_path / "meminfo")
    monkeypatch.setattr(memory, "CGROUP", tmp_path / "none")
    gate = memory.MemoryGate(memory.budget())
    assert xray < gate.budget < 2 * xray
    assert 2 * memory.estimate(512 * 512, bounded=True) < gate.budget
    assert memory.MemoryGate(memory.budget(processes=2)).budget < xray  # two processes: each alone
    (tmp_path / "meminfo").write_text("MemAvailable: 22000000 kB\n")
    assert 2 * xray < memory.budget()

    order = []

    def work(name, need, hold_s):
        with gate.hold(need):
            order.append(("start", name))
            time.sleep(hold_s)
            order.append(("end", name))

    first = threading.Thread(target=work, args=("x1", xray, 0.2))
    first.start()
    while not order:
        time.sleep(0.005)
    second = threading.Thread(target=work, args=("x2", xray, 0.0))
    second.start()
    first.join()
    second.join()
    assert order == [("start", "x1"), ("end", "x1"), ("start", "x2"), ("end", "x2")]
    with gate.hold(10 * gate.budget):  # larger than the budget: runs, alone
        assert gate.peak_images >= 1


def test_the_folder_job_gates_cpu_lanes_unless_the_user_chose_them(src, tmp_path, model_weights, monkeypatch):
    seen = []
    real = memory.MemoryGate.hold

    def hold(self, need):
        seen.append(need)
        return real(self, need)

    monkeypatch.setattr(memory.MemoryGate, "hold", hold)
    compress_folder(src, tmp_path / "D1", CompressConfig(device="cpu", max_error=0))
    assert seen == [memory.estimate(24 * 32, bounded=True)] * 3
    seen.clear()
    compress_folder(src, tmp_path / "D2", CompressConfig(device="cpu", streams=2))
    decompress_folder(tmp_path / "D2", tmp_path / "O", DecompressConfig(device="cpu", streams=1))
    assert seen == []


def test_outputs_of_an_earlier_manifest_are_made_again_not_refused(cli, src, tmp_path):
    """A destination written by visemz 0.1 (its manifest lists the files done, with no identities):
    the .vsz files it lists are the job's and are made again once; a file it does not list is not."""
    dst = tmp_path / "D"
    assert cli("compress", src, dst, "--device", "cpu").exit_code == 0
    old = {"source": str(src), "config": {}, "files": [{"rel": rel, "status": "done", "error": ""}
                                                        for rel in ("a.png", "sub/b.png")]}
    (dst / manifest.MANIFEST).write_text(json.dumps(old))
    d = strict_json(cli("compress", src, dst, "--device", "cpu", "--json").stdout)
    assert d["done"] == 2 and d["redone"] == {"made by an earlier visemz": 2}
    assert [e["file"] for e in d["errors"]] == ["sub/deep/c.png"]
    d = strict_json(cli("compress", src, dst, "--device", "cpu", "--json").stdout)
    assert (d["done"], d["skipped"], d["failed"]) == (0, 2, 1)
