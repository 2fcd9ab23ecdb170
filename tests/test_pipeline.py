"""The folder pipeline's parts on the CPU: executor, loader choice, header probes, page stacks, writers."""

import io
import threading
import time

import cv2
import numpy as np
import pytest
import tifffile
import torch
from safetensors.torch import save_file

import visemz
from visemz import ImageCodec, container
from visemz.errors import CorruptStreamError, DeviceUnavailableError, InvalidArgumentError, VisemzError
from visemz.image import pages
from visemz.io import loaders, writers
from visemz.io.files import Item
from visemz.pipeline import executor, probe, sources
from visemz.pipeline.jobs import CompressConfig, DecompressConfig, compress_folder, decompress_folder
from visemz.pipeline.kvikio_io import npy_header
from visemz.pipeline.results import ItemResult
from visemz.pipeline.sources import LoaderPlan, plan_loaders

from .helpers import count_checksums


# ------------------------------------------------------------------ executor
def _names(n):
    return [f"img{i:03d}" for i in range(n)]


def test_executor_reports_each_bad_item_and_finishes_the_rest():
    names = _names(20)

    def load(i):
        if i == 3:
            raise loaders.InputError(f"{names[i]} is damaged")
        return ItemResult(names[i], "skipped") if i == 9 else i * 10

    def compute(lane, i, x):
        if i == 5:
            raise InvalidArgumentError(f"{names[i]}: cannot compress")
        return x + 1

    def write(i, y):
        if i == 7:
            raise writers.OutputError(f"cannot write {names[i]}")
        assert y == i * 10 + 1
        return ItemResult(names[i], "done", bytes_in=y)

    seen = []
    results = executor.run(names, [executor.parallel_feed(range(20), load, 3)], compute, write,
                           executor.make_lanes("cpu", 3), depth=2, writers=2, progress=seen.append)
    assert [r.rel for r in results] == names  # in input order, one each
    assert len(seen) == 20
    status = {r.rel: r.status for r in results}
    assert [n for n, s in status.items() if s == "failed"] == [names[3], names[5], names[7]]
    assert status[names[9]] == "skipped"
    for i in (3, 5, 7):
        assert names[i] in results[i].error
    assert all(results[i].bytes_in == i * 10 + 1 for i in range(20) if status[names[i]] == "done")


def test_executor_keeps_memory_bounded():
    n, loaders_, lanes, depth, writers_ = 120, 3, 2, 2, 1
    alive, peak, lock = [0], [0], threading.Lock()

    def load(i):
        with lock:
            alive[0] += 1
            peak[0] = max(peak[0], alive[0])
        return i

    def write(i, x):
        time.sleep(0.002)  # a slow disk: everything upstream must wait, not pile up
        with lock:
            alive[0] -= 1
        return ItemResult(str(i), "done")

    results = executor.run([str(i) for i in range(n)], [executor.parallel_feed(range(n), load, loaders_)],
                           lambda lane, i, x: x, write, executor.make_lanes("cpu", lanes), depth, writers_)
    assert all(r.status == "done" for r in results) and alive[0] == 0
    bound = loaders_ + depth + lanes + depth + writers_  # pool, loaded queue, lanes, computed queue, writers
    assert lanes < peak[0] <= bound


def test_any_exception_of_one_item_fails_that_item_only():
    """A MemoryError, a bug's RuntimeError, an OSError: in a loader, a lane or a writer, the item fails with
    its reason and every other item is done."""
    names = _names(12)

    def load(i):
        if i == 1:
            raise MemoryError("cannot allocate 64 GiB")
        return i

    def compute(lane, i, x):
        if i == 4:
            raise RuntimeError("a bug, not a bad file")
        return x

    def write(i, x):
        if i == 7:
            raise OSError(28, "No space left on device")
        return ItemResult(names[i], "done")

    results = executor.run(names, [executor.parallel_feed(range(12), load, 2)], compute, write,
                           executor.make_lanes("cpu", 2), depth=2)
    failed = {r.rel: r.error for r in results if r.status == "failed"}
    assert failed == {names[1]: "out of memory: cannot allocate 64 GiB",
                      names[4]: "unexpected RuntimeError: a bug, not a bad file",
                      names[7]: "unexpected OSError: [Errno 28] No space left on device"}
    assert sum(r.status == "done" for r in results) == 9


@pytest.mark.timeout(60)
def test_executor_stops_every_stage_when_its_own_machinery_fails():
    names = _names(200)

    def progress(result):
        if result.rel == names[4]:
            raise RuntimeError("a bug in the progress display")

    with pytest.raises(RuntimeError, match="a bug"):
        executor.run(names, [executor.parallel_feed(range(200), lambda i: i, 2)], lambda lane, i, x: x,
                     lambda i, x: ItemResult(names[i], "done"), executor.make_lanes("cpu", 2), depth=2,
                     progress=progress)
    # the process-wide service threads (the GPU entropy stage's group worker, encoders/grouping.py) are no stage
    assert not [t for t in threading.enumerate() if t.name.startswith("visemz-")
                and not t.name.startswith("visemz-service-")]


def test_executor_config_is_checked_and_resolved():
    with pytest.raises(InvalidArgumentError, match="streams=-1"):
        executor.ExecutorConfig(streams=-1)
    assert executor.resolve(executor.ExecutorConfig(streams=3), "cpu") == (3, 6)
    assert executor.resolve(executor.ExecutorConfig(streams=2, queue_depth=5), "cpu") == (2, 5)


# ------------------------------------------------------------------ loader choice
def test_auto_picks_the_cpu_loader_without_gpu_loaders():
    assert plan_loaders("auto", "cpu", True, True) == LoaderPlan()  # GPU loaders need a GPU
    assert plan_loaders("auto", "cuda", False, False) == LoaderPlan()
    assert plan_loaders("auto", "cuda", True, False) == LoaderPlan()  # DALI only when asked: it was the slower
    assert plan_loaders("auto", "cuda", True, True).names == ["kvikio", "cpu"]
    assert plan_loaders("kvikio", "cuda", True, True) == LoaderPlan(kvikio=True)
    assert plan_loaders("dali", "cuda", True, True).names == ["dali", "cpu"]
    assert plan_loaders("cpu", "cuda", True, True) == LoaderPlan()


def test_an_explicit_gpu_loader_that_cannot_run_is_an_error():
    with pytest.raises(DeviceUnavailableError, match="DALI is not installed"):
        plan_loaders("dali", "cuda", False, True)
    with pytest.raises(DeviceUnavailableError, match="kvikio is not installed"):
        plan_loaders("kvikio", "cuda", True, False)
    with pytest.raises(InvalidArgumentError, match="needs device 'cuda'"):
        plan_loaders("dali", "cpu", True, True)
    with pytest.raises(InvalidArgumentError, match="'nvjpeg'"):
        plan_loaders("nvjpeg", "cuda", True, True)


def test_files_are_routed_to_the_loader_that_can_read_them(tmp_path):
    png, npy, bmp = tmp_path / "a.png", tmp_path / "b.npy", tmp_path / "c.bmp"
    img = np.arange(12 * 10, dtype=np.uint8).reshape(12, 10)
    cv2.imwrite(str(png), img)
    np.save(npy, img)
    cv2.imwrite(str(bmp), img)
    items = [Item(p, tmp_path / "out" / p.name, p.name) for p in (png, npy, bmp)]
    routes = [sources._route(i, it, LoaderPlan(dali=True, kvikio=True), None).loader for i, it in enumerate(items)]
    assert routes == ["dali", "kvikio", "cpu"]
    # JPEGs DALI decoded wrongly on a GPU (gray; odd sizes) stay with the CPU loader
    jpegs = {"rgb.jpg": np.zeros((8, 10, 3), np.uint8), "gray.jpg": img, "odd.jpg": np.zeros((8, 9, 3), np.uint8)}
    for name, pixels in jpegs.items():
        cv2.imwrite(str(tmp_path / name), pixels)
    got = [sources._route(0, Item(tmp_path / n, tmp_path / "out" / n, n), LoaderPlan(dali=True), None).loader
           for n in jpegs]
    assert got == ["dali", "cpu", "cpu"]
    def triage(i):  # the job's resume check: a finished result, or None for an item to do
        return ItemResult(items[i].rel, "skipped") if items[i].rel == "b.npy" else None

    assert [sources._route(i, it, LoaderPlan(), triage).loader for i, it in enumerate(items)] == \
        ["cpu", "finished", "cpu"]
    # without GPU loaders every file is read by the CPU loader, exactly as loaders.load reads it
    (feed_skip, feed_cpu) = sources.feeds(items, LoaderPlan(), None)
    got = dict(feed_cpu)
    assert list(feed_skip) == [] and sorted(got) == [0, 1, 2]
    assert all(got[i].loader == "cpu" and np.array_equal(got[i].pixels, img) for i in got)


# ------------------------------------------------------------------ header probes
def _sample_files(folder):
    rng = np.random.default_rng(0)
    g8 = rng.integers(0, 256, (33, 47), dtype=np.uint8)
    c8 = rng.integers(0, 256, (33, 47, 3), dtype=np.uint8)
    g16 = rng.integers(0, 65536, (33, 47), dtype=np.uint16)
    c16 = rng.integers(0, 65536, (21, 19, 3), dtype=np.uint16)
    rgba = rng.integers(0, 256, (17, 23, 4), dtype=np.uint8)
    files = {}
    for name, img in {"g8.png": g8, "c8.png": c8, "g16.png": g16, "c16.png": c16, "rgba.png": rgba,
                      "g8.jpg": g8, "c8.jpg": c8, "c8even.jpg": c8[:32, :46], "g8.jp2": g8, "c8.jp2": c8,
                      "g16.jp2": g16}.items():
        assert cv2.imwrite(str(folder / name), img)
        files[name] = img
    for name, img in {"g8.tif": g8, "c8.tif": c8, "g16.tif": g16}.items():
        tifffile.imwrite(folder / name, img, photometric="rgb" if img.ndim == 3 else "minisblack")
    tifffile.imwrite(folder / "zlib16.tif", g16, compression="zlib")
    np.save(folder / "g16.npy", g16)
    np.save(folder / "f32.npy", rng.standard_normal((5, 6, 2)).astype(np.float32))
    np.save(folder / "fortran.npy", np.asfortranarray(c8))
    np.save(folder / "big_endian.npy", g16.astype(">u2"))
    return folder


# JPEGs: RGB of even width and height only (DALI decoded gray and odd-sized JPEGs wrongly on an H200)
DECODE = {"g8.png", "c8.png", "g16.png", "c16.png", "rgba.png", "c8even.jpg", "g8.jp2", "c8.jp2", "g16.jp2",
          "g8.tif", "c8.tif", "g16.tif", "zlib16.tif"}
RAW = {"g8.tif", "c8.tif", "g16.tif", "g16.npy", "f32.npy"}


def test_probes_agree_with_the_cpu_loader(tmp_path):
    folder = _sample_files(tmp_path)
    for path in sorted(folder.iterdir()):
        img = loaders.load(path).pixels
        target, layout = probe.decode_target(path), probe.raw_layout(path)
        assert (target is not None) == (path.name in DECODE), path.name
        assert (layout is not None) == (path.name in RAW), path.name
        if target is not None:
            assert (target.shape, target.dtype) == (img.shape, img.dtype.name), path.name
        if layout is not None:  # the pixels really lie at that offset, as the CPU loader reads them
            raw = np.fromfile(path, dtype=layout.dtype, count=int(np.prod(layout.shape)), offset=layout.offset)
            np.testing.assert_array_equal(raw.reshape(layout.shape), img)


def test_probes_turn_down_what_a_gpu_loader_would_get_wrong(tmp_path):
    palette = tmp_path / "palette.png"
    cv2.imwrite(str(tmp_path / "gray.png"), np.zeros((8, 8), np.uint8))
    raw = (tmp_path / "gray.png").read_bytes()
    palette.write_bytes(raw[:25] + b"\x03" + raw[26:])  # color type 3 (palette): OpenCV expands it
    trns = tmp_path / "trns.png"  # a tRNS chunk right after IHDR: OpenCV adds an alpha channel
    trns.write_bytes(raw[:33] + b"\x00\x00\x00\x02tRNS\x00\x00" + b"\x00" * 4 + raw[33:])
    truncated = tmp_path / "short.npy"
    buf = io.BytesIO()
    np.save(buf, np.zeros((64, 64), np.uint16))
    truncated.write_bytes(buf.getvalue()[:-10])
    garbage = tmp_path / "garbage.jpg"
    garbage.write_bytes(b"\xff\xd8\xff\xe0" + bytes(range(256)) * 4)
    for p in (palette, trns, garbage):
        assert probe.decode_target(p) is None, p.name
    assert probe.raw_layout(truncated) is None
    assert probe.decode_target(tmp_path / "gray.png").shape == (8, 8)


# ------------------------------------------------------------------ CPU loader
def test_planar_tiff_pages_are_read_with_channels_last(tmp_path):
    """PlanarConfiguration 2 stores each sample as a plane (tifffile reads 'SYX'): the loader moves
    the samples last, as for chunky pages, instead of taking the planes for rows."""
    rgb = np.random.default_rng(2).integers(0, 65535, (20, 30, 3), dtype=np.uint16)
    planar = np.moveaxis(rgb, -1, 0)
    tifffile.imwrite(tmp_path / "planar.tif", planar, photometric="rgb", planarconfig="separate")
    with tifffile.TiffFile(tmp_path / "planar.tif") as tif:
        assert tif.pages[0].axes == "SYX"
    pic = loaders.load(tmp_path / "planar.tif")
    assert not pic.paged
    np.testing.assert_array_equal(pic.pixels, rgb)
    assert pic.pixels.flags.c_contiguous
    with tifffile.TiffWriter(tmp_path / "planar_pages.tif") as w:
        for _ in range(2):
            w.write(planar, photometric="rgb", planarconfig="separate")
    pic = loaders.load(tmp_path / "planar_pages.tif")
    assert pic.paged and pic.page_shape == (20, 30, 3)
    np.testing.assert_array_equal(pic.pixels, np.stack([rgb, rgb]))


def test_multi_page_tiff_is_one_stack_of_pages(tmp_path):
    stack = np.random.default_rng(1).integers(0, 4096, (4, 20, 30), dtype=np.uint16)
    tifffile.imwrite(tmp_path / "s.tif", stack, photometric="minisblack")
    pic = loaders.load(tmp_path / "s.tif")
    assert pic.paged and pic.page_shape == (20, 30)
    np.testing.assert_array_equal(pic.pixels, stack)
    with pytest.raises(loaders.InputError, match="multi-page"):
        loaders.load_image(tmp_path / "s.tif")  # single-image callers (stacking) refuse it by name
    out = loaders.save_image(tmp_path / "s.tif", stack, "tiff", paged=True)
    np.testing.assert_array_equal(tifffile.imread(io.BytesIO(out)), stack)
    with pytest.raises(loaders.InputError, match="cannot be PNG"):
        loaders.save_image(tmp_path / "s.png", stack, "png", paged=True)
    with tifffile.TiffWriter(tmp_path / "mixed.tif") as w:
        w.write(stack[0])
        w.write(stack[1, :10])
    with pytest.raises(loaders.InputError, match="page 1 is"):
        loaders.load(tmp_path / "mixed.tif")


def test_big_endian_arrays_come_back_in_native_order(tmp_path):
    img = np.arange(30, dtype=">u2").reshape(5, 6)
    np.save(tmp_path / "be.npy", img)
    got = loaders.load(tmp_path / "be.npy").pixels
    assert got.dtype == np.uint16 and got.dtype.isnative
    np.testing.assert_array_equal(got, img)


# ------------------------------------------------------------------ page stacks
def test_page_stacks_round_trip_and_reject_damage(model_weights):
    codec = ImageCodec("cpu")
    stack = np.random.default_rng(2).integers(0, 256, (3, 24, 20, 3), dtype=np.uint8)
    buf = pages.encode(stack, lambda page: codec.compress(page, max_error=0))
    back, paged = pages.decode(buf, codec.decompress)
    assert paged and back.dtype == np.uint8
    np.testing.assert_array_equal(back, stack)
    np.testing.assert_array_equal(visemz.decompress(buf, device="cpu"), stack)  # the API reads what folder jobs write
    single, paged = pages.decode(codec.compress(stack[0], max_error=0), codec.decompress)
    assert not paged and single.shape == (24, 20, 3)

    c = container.unpack(buf)
    body = bytes(c.sections["pages"])

    def repack(meta=None, index=None, body_=body):
        return container.pack(pages.KIND, meta or c.meta, {"index": index or bytes(c.sections["index"]),
                                                           "pages": body_})

    with pytest.raises(CorruptStreamError, match="do not split"):
        pages.decode(repack(index=np.array([1, 2, len(body)], "<u8").tobytes()), codec.decompress)
    with pytest.raises(CorruptStreamError, match="shorter than"):  # a split that cuts the pages apart
        pages.decode(repack(index=np.array([1, 2, len(body) - 3], "<u8").tobytes()), codec.decompress)
    with pytest.raises(CorruptStreamError, match="do not split"):  # lengths that wrap around u64 are refused
        pages.decode(repack(index=np.array([2**64 - 1, 1, len(body)], "<u8").tobytes()), codec.decompress)
    with pytest.raises(CorruptStreamError, match="page 0's header"):  # from its header, before decoding
        pages.decode(repack(meta=dict(c.meta, shape=[3, 24, 21, 3])), codec.decompress)
    with pytest.raises(CorruptStreamError, match="index holds"):
        pages.decode(repack(meta=dict(c.meta, shape=[2, 24, 20, 3])), codec.decompress)
    with pytest.raises(VisemzError, match="unknown fields"):
        pages.decode(repack(meta=dict(c.meta, extra=1)), codec.decompress)
    with pytest.raises(VisemzError, match="format"):
        pages.decode(repack(meta=dict(c.meta, format=2)), codec.decompress)


def test_a_folder_decode_unpacks_each_file_once(model_weights, tmp_path, monkeypatch):
    """The first-use gate's key and the decode read one unpacking of the file (an image: one container)."""
    buf = ImageCodec("cpu").compress(np.random.default_rng(3).integers(0, 256, (40, 30), dtype=np.uint8), quality=2)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.png.vsz").write_bytes(buf)
    seen = count_checksums(monkeypatch)
    summary = decompress_folder(tmp_path / "src", tmp_path / "out", DecompressConfig(fmt="npy", device="cpu"))
    assert not summary.failed and np.load(tmp_path / "out" / "a.png.npy").shape == (40, 30)
    assert seen == {"unpacks": 1, "hashed": len(buf) - 8}


# ------------------------------------------------------------------ writers
def test_npy_header_equals_numpy_save():
    for a in (np.zeros((3, 4), np.uint8), np.ones((5, 6, 3), np.uint16), np.zeros((2, 7, 9, 3), np.float32)):
        buf = io.BytesIO()
        np.save(buf, a)
        assert npy_header(a.shape, a.dtype) + a.tobytes() == buf.getvalue()


def test_atomic_file_leaves_nothing_behind_on_failure(tmp_path):
    target = tmp_path / "out" / "x.bin"
    with pytest.raises(KeyError):
        with writers.atomic_file(target) as (f, tmp):
            f.write(b"partial")
            raise KeyError("interrupted")
    assert not target.exists() and list((tmp_path / "out").iterdir()) == []
    writers.write_atomic(target, b"whole")
    assert target.read_bytes() == b"whole"
    assert target.stat().st_mode & 0o777 == writers.FILE_MODE  # as open() makes it, not mkstemp's 0600
    assert writers.FILE_MODE & 0o044  # others can read it under the usual umasks (022, 002)


def test_atomic_file_settles_a_file_another_writer_put_at_the_temporary_path(tmp_path):
    """safetensors' save_file writes a new file at the path it is given: it gets the same permissions."""
    target = tmp_path / "w.safetensors"
    with writers.atomic_file(target) as (_, tmp):
        save_file({"x": torch.zeros(3)}, str(tmp))
    assert target.stat().st_mode & 0o777 == writers.FILE_MODE
    assert [p.name for p in tmp_path.iterdir()] == ["w.safetensors"]


def test_tiled_images_through_several_lanes_match_the_codec(model_weights, tmp_path):
    """Images larger than a tile go through the folder pipeline's lanes tile by tile: 1 and 3 lanes
    write the codec's own bytes."""
    rng = np.random.default_rng(5)
    src = tmp_path / "src"
    src.mkdir()
    base = cv2.GaussianBlur(rng.integers(0, 256, (150, 200), np.uint8), (0, 0), 3)
    images = {f"{k}.png": np.roll(base, 23 * k, axis=1) for k in range(3)}
    for name, img in images.items():
        cv2.imwrite(str(src / name), img)
    codec = ImageCodec("cpu")
    for lanes in (1, 3):
        dst = tmp_path / f"out{lanes}"
        summary = compress_folder(src, dst, CompressConfig(device="cpu", streams=lanes, loader="cpu", tile=64))
        assert summary.count("done") == len(images), summary.to_dict()
        for name, img in images.items():
            assert (dst / f"{name}.vsz").read_bytes() == codec.compress(img, tile=64)
