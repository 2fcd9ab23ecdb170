"""Where the time of one image's compress and decompress goes, on a GPU (or the CPU).

    python -m visemz.benchmarks.profile_codec --image DATA/eval/kodak/kodim01.png --out prof/ [--threads 1,2,4]

Prints, after a warm-up: the median milliseconds of compress and of decompress (each bracketed
by device synchronisation), and the images/s of the same compress (and of its file's decompress) run in
1, 2, 4... threads at once, each thread with its own CUDA stream (as the folder pipeline's lanes), which tells whether
the per-image path is bound by the GPU or by the host, with how many ints-stream calls shared each
nvCOMP launch meanwhile (the grouped entropy stage; ``VISEMZ_ENTROPY_BATCH=0`` gives the
one-launch-per-stream path to compare with), and on a GPU the CUDA API calls per compress and per
decompress that cost the host (stream synchronisations, which stall it until the GPU catches up,
memory copies and kernel launches, every thread's: the entropy worker's too), counted by
torch.profiler, with the copies by kind (pageable or pinned host memory).  Unless --summary-only: the
milliseconds per compress and per decompress by stage (``STAGES``: the residual prior, the float64
synthesis, rANS...; GPU kernel time on a GPU), and under --out cProfile listings of compress and
decompress (by cumulative and by own time) and for each a torch.profiler table of CPU and CUDA time per
operator and kernel, with a Chrome trace (gzip) for a closer look.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gzip
import io
import json
import pstats
import re
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from visemz import ImageCodec, cuda, defaults, measure
from visemz.encoders import gpu
from visemz.io import loaders
from visemz.io.writers import write_atomic


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def median_ms(fn, device: str, reps: int) -> float:
    return 1e3 * measure.median_seconds(fn, reps, sync=lambda: sync(device))[0]


@contextlib.contextmanager
def own_stream(device: str):
    """A CUDA stream current for torch and cupy in this thread (what a pipeline lane does)."""
    if device != "cuda":
        yield
        return
    s = torch.cuda.Stream()
    with torch.cuda.stream(s), cuda.external_stream(s.cuda_stream, s.device.index):
        yield
        s.synchronize()


def threaded_rate(device: str, job, threads: int, per_thread: int) -> tuple[float, float | None]:
    """Images/s of ``threads`` threads each running ``job`` (one compress, or one decompress) ``per_thread`` times
    on its own stream, and how many ints-stream calls shared each nvCOMP launch on average (None without grouped
    launches)."""
    barrier = threading.Barrier(threads + 1)

    def work():
        with own_stream(device):
            job()  # warm this stream (workspaces, nvCOMP codec)
            barrier.wait()
            for _ in range(per_thread):
                job()
        barrier.wait()

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    barrier.wait()
    before = _launches()
    t0 = time.perf_counter()
    barrier.wait()
    seconds = time.perf_counter() - t0
    launches, requests = (a - b for a, b in zip(_launches(), before))
    for t in pool:
        t.join()
    return threads * per_thread / seconds, (round(requests / launches, 2) if launches else None)


def _launches() -> tuple[int, int]:
    """(grouped nvCOMP launches, ints-stream calls they served) so far, over every device and entropy kind."""
    counts = gpu.group_counts().values()
    return sum(c[0] for c in counts), sum(c[1] for c in counts)


# CUDA API calls (runtime and driver, as torch.profiler names them) and GPU copies worth counting per call:
# host waits, copies (their API calls, and the copies themselves by host memory kind), launches, events
COUNTED = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cuStreamSynchronize",
           "cuEventSynchronize", "cuCtxSynchronize", "cudaMemcpy", "cuMemcpy", "Memcpy ", "cudaMemset", "Memset ",
           "cudaLaunchKernel", "cuLaunchKernel", "cudaStreamWaitEvent", "cudaEventRecord", "cudaHostAlloc",
           "cudaMallocHost", "cudaFreeHost", "cudaMalloc", "cudaFree")


def cuda_calls(fn, device: str, reps: int) -> dict[str, float]:
    """Per call of ``fn``: how many of each CUDA API call (and GPU copy) in ``COUNTED`` it made, from a
    torch.profiler run of ``reps`` calls (the one synchronisation that closes the run is not counted)."""
    if device != "cuda":
        return {}
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    counts = Counter({e.key: e.count for e in prof.key_averages() if e.key.startswith(COUNTED)})
    counts["cudaDeviceSynchronize"] -= 1
    return {k: round(v / reps, 2) for k, v in sorted(counts.items()) if v > 0}


def cprofile(fn, reps: int, out: Path) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(reps):
        fn()
    prof.disable()
    text = io.StringIO()
    st = pstats.Stats(prof, stream=text)
    st.sort_stats("cumulative").print_stats(40)
    st.sort_stats("tottime").print_stats(25)
    write_atomic(out, text.getvalue().encode())
    return text.getvalue()


# The stages of a compress or decompress, named by the visemz function a kernel (or, on the CPU, the work) ran
# under: (stage, file, function or None for any of the file's); the innermost matching frame wins
STAGES = (("conditional rANS", "encoders/rans.py", None), ("block encoder", "encoders/__init__.py", None),
          ("block encoder", "encoders/gpu.py", None),
          ("residual prior network", "image/residual_coder.py", "_blocked"),
          ("residual coder, other", "image/residual_coder.py", None),
          ("synthesis, float64 (features of the residual prior)", "image/tiling.py", "synthesis_features"),
          ("synthesis", "image/tiling.py", "synthesise"), ("analysis", "image/tiling.py", "analyse"),
          ("latents", "image/latents.py", None), ("codec, other", "image/codec.py", None))
_FRAME = re.compile(r"visemz/([\w/]+\.py)\(\d+\): (\w+)")


def stage_times(trace: dict, device: str, reps: int) -> dict[str, float]:
    """Milliseconds per call by stage (``STAGES``), largest first, from a torch.profiler Chrome trace: on a GPU
    each kernel's (and copy's) time under the stage of the Python call that launched it, on the CPU each Python
    call's own time under its stage.  A call's stage is its innermost frame that names one; "other" if none."""
    events = trace["traceEvents"]
    frames = {e["args"]["Python id"]: e for e in events if e.get("cat") == "python_function"}
    memo: dict = {}

    def stage(frame_id) -> str:
        if frame_id not in memo:
            f = frames.get(frame_id)
            m = _FRAME.search(f["name"]) if f else None
            named = [st for st, file, fn in STAGES if m and m.group(1) == file and fn in (None, m.group(2))]
            memo[frame_id] = named[0] if named else (stage(f["args"].get("Python parent id")) if f else "other")
        return memo[frame_id]

    total = Counter()
    if device == "cuda":
        work = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
        launch = {e["args"].get("correlation"): e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")}
        calls = [(launch[k["args"]["correlation"]], k["dur"]) for k in work if k["args"].get("correlation") in launch]
        where = _innermost_frames(frames.values(), [c for c, _ in calls])
        for (_, dur), f in zip(calls, where):
            total[stage(f)] += dur
    else:
        own = {i: f["dur"] for i, f in frames.items()}
        for f in frames.values():
            parent = f["args"].get("Python parent id")
            if parent in own:
                own[parent] -= f["dur"]
        for i, t in own.items():
            total[stage(i)] += max(t, 0.0)
    return {k: round(v / reps / 1e3, 2) for k, v in total.most_common()}


def _innermost_frames(frames, calls) -> list:
    """The Python id of the innermost frame around each call (a trace event, on its thread), or None: one sweep
    over each thread's frames, which nest."""
    out = [None] * len(calls)
    by_thread: dict = {}
    for f in frames:
        by_thread.setdefault(f["tid"], []).append(f)
    for tid, fs in by_thread.items():
        fs.sort(key=lambda f: (f["ts"], -f["dur"]))
        points = sorted((c["ts"], j) for j, c in enumerate(calls) if c["tid"] == tid)
        stack, i = [], 0
        for t, j in points:
            while i < len(fs) and fs[i]["ts"] <= t:
                while stack and stack[-1]["ts"] + stack[-1]["dur"] < fs[i]["ts"]:
                    stack.pop()
                stack.append(fs[i])
                i += 1
            while stack and stack[-1]["ts"] + stack[-1]["dur"] < t:
                stack.pop()
            out[j] = stack[-1]["args"]["Python id"] if stack else None
    return out


def torch_profile(fn, device: str, reps: int, out: Path, name: str) -> dict[str, float]:
    """``reps`` calls of ``fn`` under torch.profiler: writes its table (``torch_ops_NAME.txt``) and Chrome trace
    (``trace_NAME.json.gz``), returns ``stage_times``."""
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts, with_stack=True) as prof:
        for _ in range(reps):
            fn()
        sync(device)
    key = "cuda_time_total" if device == "cuda" else "cpu_time_total"
    write_atomic(out / f"torch_ops_{name}.txt", prof.key_averages().table(sort_by=key, row_limit=60).encode())
    with tempfile.TemporaryDirectory() as tmp:  # torch writes the trace itself; the report gets it gzipped, atomically
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        raw = trace.read_bytes()
    write_atomic(out / f"trace_{name}.json.gz", gzip.compress(raw))
    return stage_times(json.loads(raw), device, reps)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default="balle2016")
    ap.add_argument("--quality", type=float, default=4.0)
    ap.add_argument("--max-error", type=float, default=None)
    ap.add_argument("--image-format", type=int, default=None, help="the image format written (default: the model's)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", default="1,2,4", help="thread counts for the concurrent compress rate")
    ap.add_argument("--summary-only", action="store_true", help="timings only: no cProfile, no torch.profiler")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    image = loaders.load_image(args.image)
    codec = ImageCodec(args.device)
    kwargs = {"model": args.model, "quality": args.quality, "max_error": args.max_error,
              "image_format": args.image_format}
    buf = codec.compress(image, **kwargs)
    for _ in range(3):  # warm-up: kernels compiled, nvCOMP codecs made, cuDNN chose its algorithms
        codec.decompress_tensor(codec.compress(image, **kwargs))
    sync(args.device)

    name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    report = {"device": name, "image": args.image.name, "shape": list(image.shape), **kwargs, "bytes": len(buf),
              "entropy_chunk": defaults.get("entropy_chunk"),
              "compress_ms": median_ms(lambda: codec.compress(image, **kwargs), args.device, args.reps),
              "decompress_ms": median_ms(lambda: codec.decompress_tensor(buf), args.device, args.reps)}
    report["entropy_batch"] = defaults.get("entropy_batch")
    threads = list(map(int, args.threads.split(",")))
    rates = {n: threaded_rate(args.device, lambda: codec.compress(image, **kwargs), n, args.reps) for n in threads}
    report["threaded_images_per_s"] = {n: r for n, (r, _) in rates.items()}
    report["calls_per_nvcomp_launch"] = {n: c for n, (_, c) in rates.items()}
    report["threaded_decompressions_per_s"] = {
        n: threaded_rate(args.device, lambda: codec.decompress_tensor(buf), n, args.reps)[0] for n in threads}
    report["cuda_calls_per_compress"] = cuda_calls(lambda: codec.compress(image, **kwargs), args.device, 10)
    report["cuda_calls_per_decompress"] = cuda_calls(lambda: codec.decompress_tensor(buf), args.device, 10)
    if not args.summary_only:
        text = cprofile(lambda: codec.compress(image, **kwargs), args.reps, args.out / "cprofile_compress.txt")
        print(text[:6000])
        cprofile(lambda: codec.decompress_tensor(buf), args.reps, args.out / "cprofile_decompress.txt")
        reps = min(args.reps, 5)
        report["stages_ms_per_compress"] = torch_profile(lambda: codec.compress(image, **kwargs), args.device, reps,
                                                         args.out, "compress")
        report["stages_ms_per_decompress"] = torch_profile(lambda: codec.decompress_tensor(buf), args.device, reps,
                                                           args.out, "decompress")
    print(json.dumps(report, indent=1), flush=True)
    write_atomic(args.out / "summary.json", (json.dumps(report, indent=1) + "\n").encode())


if __name__ == "__main__":
    main()
