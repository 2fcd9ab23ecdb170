"""The folder pipeline on a GPU: several streams, kvikio, DALI.

Run on a GPU machine: python -m pytest -m gpu tests/test_pipeline_gpu.py
(skipped without CUDA; the kvikio and DALI tests also say when those are not installed).
"""

import io
import struct
import zlib

import cv2
import numpy as np
import pytest
import tifffile
import torch

from visemz.device import as_numpy
from visemz.errors import VisemzError
from visemz.io import loaders
from visemz.io.files import Item
from visemz.pipeline import dali_source, kvikio_io, probe, sources
from visemz.pipeline.executor import CudaLane
from visemz.pipeline.jobs import CompressConfig, DecompressConfig, compress_folder, decompress_folder

from .helpers import cross_device_tolerance, folder_digests, optional, parity

pytestmark = pytest.mark.gpu


@pytest.fixture
def kvikio():
    return optional("kvikio")


@pytest.fixture
def dali():
    return optional("nvidia.dali")


def _png(path, img):
    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), img[..., ::-1] if img.ndim == 3 and img.shape[2] == 3 else
                       (cv2.cvtColor(img, cv2.COLOR_RGBA2BGRA) if img.ndim == 3 else img))


@pytest.fixture
def tree(tmp_path):
    rng = np.random.default_rng(7)
    src = tmp_path / "src"
    smooth = cv2.GaussianBlur(rng.integers(0, 256, (300, 420, 3), dtype=np.uint8), (0, 0), 3)
    _png(src / "rgb8.png", smooth)
    _png(src / "a/gray8.png", smooth[..., 1])
    _png(src / "a/gray16.png", smooth[:200, :260, 0].astype(np.uint16) * 200)
    _png(src / "a/b/rgb16.png", smooth[:130, :170].astype(np.uint16) * 250)
    _png(src / "a/b/rgba8.png", np.dstack([smooth[:90, :100], smooth[:90, :100, :1]]))
    assert cv2.imwrite(str(src / "photo.jpg"), smooth[..., ::-1])
    (src / "t").mkdir()
    (src / "n").mkdir()
    tifffile.imwrite(src / "t/rgb8.tif", smooth[:150], photometric="rgb")
    tifffile.imwrite(src / "t/gray16.tif", smooth[:, :, 2].astype(np.uint16) * 3, photometric="minisblack")
    tifffile.imwrite(src / "t/stack.tif", np.stack([smooth[:64, :80, k] for k in range(3)]), photometric="minisblack")
    np.save(src / "n/gray16.npy", smooth[:100, :120, 0].astype(np.uint16) * 7)
    np.save(src / "n/float.npy", rng.standard_normal((70, 90)).astype(np.float32))
    for k in range(6):  # same-size images, so lanes really run side by side
        _png(src / f"many/{k}.png", np.roll(smooth, 17 * k, axis=1))
    return src


@pytest.mark.parametrize("max_error, tile", [(None, 0), (1, 0), (None, 64)])
def test_several_streams_write_the_same_bytes_as_one(tree, tmp_path, model_weights, nvcomp, max_error, tile):
    """tile=64: every image is a grid of tiles, so several lanes' tiles are in flight at once."""
    outs = {}
    for streams in (1, 4):
        dst = tmp_path / f"s{streams}"
        cfg = CompressConfig(device="cuda", streams=streams, loader="cpu", max_error=max_error, tile=tile)
        summary = compress_folder(tree, dst, cfg)
        assert summary.count("done") == sum(p.is_file() for p in tree.rglob("*")), summary.to_dict()
        outs[streams] = folder_digests(dst, skip=("visemz-manifest.json",))
        back = tmp_path / f"r{streams}"
        assert not decompress_folder(dst, back, DecompressConfig("npy", "cuda", streams, "posix")).failed
        outs[f"restored{streams}"] = back
    assert outs[1] == outs[4]  # the compressed files: byte for byte
    _same_images(outs["restored1"], outs["restored4"], exact=max_error is not None)


def _same_images(a, b, exact: bool) -> None:
    """Decoded images of two runs: identical with an error bound (its float64 synthesis is
    device-independent by design), else within the codec's float tolerance (cuDNN may pick another
    algorithm while several streams run, and with TF32 (VISEMZ_TF32) two algorithms' results differ
    by a few 1e-4 of the range: on an H200 a float32 image moved by more than 1e-5 of its span)."""
    files = sorted(p.relative_to(a) for p in a.rglob("*.npy"))
    assert files == sorted(p.relative_to(b) for p in b.rglob("*.npy")) and files
    for rel in files:
        x, y = np.load(a / rel), np.load(b / rel)
        assert x.dtype == y.dtype and x.shape == y.shape, rel
        if exact:
            assert np.array_equal(x, y), rel
        else:
            assert np.abs(x.astype(np.float64) - y.astype(np.float64)).max() <= cross_device_tolerance(x), rel


def test_gpu_loaders_feed_the_codec_the_same_pixels(tree, tmp_path, model_weights, nvcomp):
    """loaders auto (kvikio where installed) and dali (where installed) against the CPU loader:
    identical files, but for the JPEG, which nvJPEG and libjpeg-turbo may decode differently.
    Each run must really have read through its loader: the .npy files through kvikio (auto),
    the PNGs and the JPEG through DALI."""
    runs, used = {}, {}
    for loader in ("cpu", "auto") + (("dali",) if dali_source.available() else ()):
        summary = compress_folder(tree, tmp_path / loader, CompressConfig(device="cuda", streams=4, loader=loader))
        assert not summary.failed, summary.to_dict()
        runs[loader] = folder_digests(tmp_path / loader, skip=("visemz-manifest.json",))
        used[loader] = {r.rel: (r.loader, r.note) for r in summary.results}
    by = lambda loader, ext: {rel: how for rel, how in used[loader].items() if rel.endswith(ext)}
    assert {how for how in used["cpu"].values()} == {("cpu", "")}
    if kvikio_io.available():
        assert set(by("auto", ".npy").values()) == {("kvikio", "")}, used["auto"]
    else:
        assert {how for how in used["auto"].values()} == {("cpu", "")}, used["auto"]
    if "dali" in used:
        assert set(by("dali", ".png").values()) | set(by("dali", ".jpg").values()) == {("dali", "")}, used["dali"]
    drop_jpeg = lambda d: {k: v for k, v in d.items() if not k.endswith(".jpg.vsz")}
    with parity() as p:
        for loader in set(runs) - {"cpu"}:
            p.same(f"{loader}: the same files as the CPU loader's", drop_jpeg(runs["cpu"]) == drop_jpeg(runs[loader]),
                   str(sorted(k for k in runs["cpu"] if runs["cpu"][k] != runs[loader].get(k))))
            p.same(f"{loader}: the JPEG was compressed", "photo.jpg.vsz" in runs[loader])
    assert "photo.jpg.vsz" in runs["cpu"]


def test_kvikio_loader_reads_what_numpy_reads(tmp_path, kvikio):
    rng = np.random.default_rng(3)
    arrays = {"a.npy": rng.integers(0, 256, (37, 53), dtype=np.uint8),
              "b.npy": rng.integers(0, 65536, (41, 29, 3), dtype=np.uint16),
              "c.npy": rng.standard_normal((3000, 700)).astype(np.float32),  # past kvikio's task size
              "d.tif": rng.integers(0, 65536, (45, 31), dtype=np.uint16),
              "e.tif": rng.integers(0, 256, (20, 22, 3), dtype=np.uint8)}
    for name, a in arrays.items():
        (np.save if name.endswith(".npy") else tifffile.imwrite)(tmp_path / name, a)
        layout = probe.raw_layout(tmp_path / name)
        t = kvikio_io.read(tmp_path / name, layout, torch.cuda.current_device())
        assert t.is_cuda and tuple(t.shape) == a.shape
        np.testing.assert_array_equal(as_numpy(t), loaders.load(tmp_path / name).pixels)


def test_kvikio_npy_writer_matches_numpy_save(tmp_path, kvikio):
    rng = np.random.default_rng(4)
    for k, a in enumerate([rng.integers(0, 256, (64, 48, 3), dtype=np.uint8),
                           rng.integers(0, 65536, (2, 33, 35), dtype=np.uint16),
                           rng.standard_normal((1024, 1100)).astype(np.float32)]):
        t = torch.from_numpy(a.astype(np.int32) if a.dtype == np.uint16 else a).cuda()
        t = t.to(torch.uint16) if a.dtype == np.uint16 else t
        if a.ndim == 3:  # a permuted (non-contiguous) view, as the codec returns RGB images
            t = t.permute(2, 0, 1).contiguous().permute(1, 2, 0)
        size = kvikio_io.write_npy(tmp_path / f"{k}.npy", t)
        buf = io.BytesIO()
        np.save(buf, a)
        assert (tmp_path / f"{k}.npy").read_bytes() == buf.getvalue() and size == len(buf.getvalue())


def test_dali_loader_equals_cpu_loader_for_png(tmp_path, dali):
    rng = np.random.default_rng(5)
    images = {"g8.png": rng.integers(0, 256, (61, 83), dtype=np.uint8),
              "c8.png": rng.integers(0, 256, (40, 50, 3), dtype=np.uint8),
              "g16.png": rng.integers(0, 65536, (33, 47), dtype=np.uint16),
              "c16.png": rng.integers(0, 65536, (29, 31, 3), dtype=np.uint16),
              "rgba.png": rng.integers(0, 256, (17, 23, 4), dtype=np.uint8),
              "big.png": rng.integers(0, 256, (1024, 768, 3), dtype=np.uint8)}
    for name, img in images.items():
        _png(tmp_path / name, img)
    items = [Item(tmp_path / n, tmp_path / "out" / n, n) for n in images]
    entries = [(i, it.src, probe.decode_target(it.src)) for i, it in enumerate(items)]
    assert all(e[2] is not None for e in entries)
    got = dict(dali_source.DaliFeed(entries, torch.cuda.current_device(),
                                    lambda i, why: sources.load_cpu(items[i], why), batch=4))
    for i, it in enumerate(items):
        pic = got[i]
        assert pic.loader == "dali", (it.rel, pic.note)
        assert pic.pixels.is_cuda
        np.testing.assert_array_equal(as_numpy(pic.pixels), loaders.load(it.src).pixels, err_msg=it.rel)


def test_dali_hands_a_file_it_cannot_decode_to_the_cpu_loader(tmp_path, dali):
    good = np.arange(40 * 30, dtype=np.uint16).reshape(40, 30).astype(np.uint8)
    for k in range(4):
        _png(tmp_path / f"good{k}.png", good + k)
    ihdr = struct.pack(">IIBBBBB", 30, 40, 8, 0, 0, 0, 0)
    chunk = lambda kind, data: struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    (tmp_path / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", b"not zlib data")
                                       + chunk(b"IEND", b""))
    names = ["good0.png", "bad.png", "good1.png", "good2.png", "good3.png"]
    items = [Item(tmp_path / n, tmp_path / "out" / n, n) for n in names]
    entries = [(i, it.src, probe.decode_target(it.src)) for i, it in enumerate(items)]
    assert all(e[2] is not None for e in entries)  # the header looks fine: only decoding finds the damage
    def fallback(i, why):  # as sources.feeds does: a file the CPU loader cannot read fails alone
        try:
            return sources.load_cpu(items[i], why)
        except VisemzError as e:
            return e

    got = dict(dali_source.DaliFeed(entries, torch.cuda.current_device(), fallback, batch=2))
    assert isinstance(got[1], VisemzError) and "bad.png" in str(got[1])
    assert got[0].loader == "cpu" and "DALI failed" in got[0].note  # the failed batch's other file
    assert [got[i].loader for i in (2, 3, 4)] == ["dali"] * 3  # the pipeline was rebuilt for the rest
    for i in (0, 2, 3, 4):
        np.testing.assert_array_equal(as_numpy(got[i].pixels) if got[i].loader == "dali" else got[i].pixels,
                                      loaders.load(items[i].src).pixels)


def test_lane_uploads_host_images_through_its_pinned_buffer():
    rng = np.random.default_rng(6)
    lane = CudaLane(0, torch.cuda.current_device())
    with lane:
        assert torch.cuda.current_stream() == lane.stream
        for shape, dtype in [((50, 60), np.uint8), ((300, 200, 3), np.uint16), ((20, 10), np.float32),
                             ((50, 60), np.uint8)]:
            a = (rng.standard_normal(shape) * 1000).astype(dtype)
            t = lane.to_device(a)
            assert t.is_cuda and tuple(t.shape) == shape
            np.testing.assert_array_equal(as_numpy(t), a)
        lane.finish()


def test_folder_ranks_beyond_the_gpus_share_them(monkeypatch):
    """Under torchrun, a folder job's rank whose LOCAL_RANK is past the GPU count takes GPU r mod count
    (several processes per GPU, ``share=True``, as ``_torchrun_group`` asks); without sharing, the rank's own
    GPU (the stacking job's NCCL wants one rank per GPU)."""
    from visemz import cli

    n = torch.cuda.device_count()
    saved = torch.cuda.current_device()
    try:
        monkeypatch.setenv("LOCAL_RANK", str(n + 1))
        assert cli._use_local_gpu(share=True) == (n + 1) % n == torch.cuda.current_device()
        monkeypatch.setenv("LOCAL_RANK", "0")
        assert cli._use_local_gpu() == 0
    finally:
        torch.cuda.set_device(saved)
