"""Encoder throughput and ratio on the GPU, against a device copy and nvCOMP's own codecs.

    python -m visemz.benchmarks.encoder --out bench.json [--sizes-mb 1 16 64 256 1024] [--repeat 20]

Throughput is GB/s of int32 input (1 GB = 1e9 bytes), the median over --repeat timed
runs after warm-up, timed with CUDA events.  The device-to-device copy of the same
bytes is the memory roofline measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

from visemz import defaults, markdown, measure
from visemz.encoders import entropy as E
from visemz.encoders import gpu, reference
from visemz.encoders import layout as L
from visemz.io.writers import write_atomic


def timed(cp, fn, repeat: int, warmup: int = 3) -> float:
    """Median seconds of fn() on the current stream, CUDA events around each call."""
    for _ in range(warmup):
        fn()
    cp.cuda.get_current_stream().synchronize()
    times = []
    for _ in range(repeat):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b) / 1e3)
    return statistics.median(times)


def make_data(cp, kind: str, n: int, seed: int):
    rs = cp.random.RandomState(seed)
    if kind == "latent":
        # Shaped like a learned codec's quantised latent (192 channels): each channel has its own
        # scale (log-uniform 0.02..3, so many channels are almost all zero) and a smooth spatial
        # modulation; values are rounded Laplacian.
        c = 192
        hw = -(-n // c)
        scale = cp.exp(rs.uniform(np.log(0.02), np.log(3.0), (c, 1))).astype(cp.float32)
        side = int(np.sqrt(hw)) + 1
        yy, xx = cp.meshgrid(cp.arange(side, dtype=cp.float32), cp.arange(side, dtype=cp.float32), indexing="ij")
        field = (0.6 + 0.4 * cp.sin(yy / 23.0) * cp.cos(xx / 31.0)).reshape(-1)[:hw]
        x = rs.laplace(0.0, 1.0, (c, hw), dtype=cp.float32) * scale * field
        return cp.rint(x).astype(cp.int32).reshape(-1)[:n]
    if kind == "laplace":  # i.i.d. rounded Laplacian(0, 0.5): ~63% zeros spread over every block
        return cp.rint(rs.laplace(0.0, 0.5, n, dtype=cp.float32)).astype(cp.int32)
    if kind == "dense":  # smooth-field residuals: every value non-zero, ~12-bit magnitudes
        return rs.randint(-3000, 3000, n, dtype=cp.int32)
    raise ValueError(kind)


def nvcomp_row(cp, gpu, algo: str, x, repeat: int, **opts):
    from nvidia import nvcomp as nv

    s = cp.cuda.get_current_stream().ptr
    c = nv.Codec(algorithm=algo, bitstream_kind=nv.BitstreamKind.NVCOMP_NATIVE, device_id=cp.cuda.Device().id,
                 cuda_stream=s, **opts)
    src = nv.as_array(x, cuda_stream=s)
    enc = c.encode(src)
    cp.cuda.get_current_stream().synchronize()
    size = enc.buffer_size
    t_enc = timed(cp, lambda: c.encode(src), repeat)
    t_dec = timed(cp, lambda: c.decode(enc), repeat)
    return {"codec": f"nvcomp-{algo}", "ratio": x.nbytes / size, "enc_GBps": x.nbytes / t_enc / 1e9,
            "dec_GBps": x.nbytes / t_dec / 1e9}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes-mb", type=int, nargs="+", default=[1, 16, 64, 256, 1024])
    ap.add_argument("--nvcomp-max-mb", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--out", type=Path, default=Path("bench_encoder.json"))
    ap.add_argument("--no-nvcomp", action="store_true")
    ap.add_argument("--reference-mb", type=int, default=16, help="MB of int32 input for the NumPy reference's rows")
    args = ap.parse_args(argv)

    import cupy as cp

    name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()
    print(f"device: {name}")
    rows, chunk = [], defaults.get("entropy_chunk")
    for kind in ("latent", "laplace", "dense"):
        for mb in args.sizes_mb:
            n = mb * (1 << 20) // 4
            x = make_data(cp, kind, n, seed=mb)
            dst = cp.empty_like(x)
            t_copy = timed(cp, lambda: cp.copyto(dst, x), args.repeat)
            base = {"data": kind, "MB": mb, "copy_GBps": x.nbytes / t_copy / 1e9}
            for policy in ("global", "block"):
                pid = L.POLICIES[policy]
                raw = gpu.encode_raw(x, pid, True)
                t_enc = timed(cp, lambda: gpu.encode_block_stream(x, pid, True), args.repeat)
                t_dec = timed(cp, lambda: gpu.decode_block_stream(raw), args.repeat)
                frames = gpu.compress_frames(raw, E.KINDS["zstd"], chunk)
                zsize = sum(f.size for f in frames)
                sizes = [b - a for a, b in E.chunk_bounds(raw.size, chunk)]
                host_frames = [f.get().tobytes() for f in frames]
                t_zenc = timed(cp, lambda: gpu.compress_frames(raw, E.KINDS["zstd"], chunk), args.repeat)
                t_zdec = timed(cp, lambda: gpu.decompress_frames(host_frames, E.KINDS["zstd"], sizes), args.repeat)
                row = dict(base, codec=f"visemz-{policy}", ratio=x.nbytes / raw.size,
                           enc_GBps=x.nbytes / t_enc / 1e9, dec_GBps=x.nbytes / t_dec / 1e9,
                           ratio_zstd=x.nbytes / zsize,
                           enc_zstd_GBps=x.nbytes / (t_enc + t_zenc) / 1e9,
                           dec_zstd_GBps=x.nbytes / (t_zdec + t_dec) / 1e9)
                row["enc_vs_copy"] = row["enc_GBps"] / base["copy_GBps"]
                if policy == "global":  # where the time goes: the statistics pass alone
                    stats = cp.zeros(gpu.N_STATS, cp.uint64)
                    row["stats_GBps"] = x.nbytes / timed(cp, lambda: gpu.global_stats(x, stats), args.repeat) / 1e9
                rows.append(row)
                print(json.dumps(row))
            if not args.no_nvcomp and mb <= args.nvcomp_max_mb:
                for algo, opts in (("Bitcomp", {"data_type": "<i4"}), ("Cascaded", {"data_type": "<i4"}),
                                   ("ANS", {"data_type": "|u1"})):
                    try:
                        row = dict(base, **nvcomp_row(cp, gpu, algo, x, max(5, args.repeat // 4), **opts))
                    except Exception as e:  # report, keep benchmarking the rest
                        row = dict(base, codec=f"nvcomp-{algo}", error=str(e)[:200])
                    rows.append(row)
                    print(json.dumps(row))
            x = dst = None  # free them now (not del: the lambdas above name them)
            cp.get_default_memory_pool().free_all_blocks()
    # CPU reference, one core, i.i.d. Laplacian data
    v = np.round(np.random.default_rng(0).laplace(0, 0.5, args.reference_mb << 18)).astype(np.int32)
    for policy in ("global", "block"):
        seconds, _ = measure.median_seconds(lambda: reference.encode(v, L.POLICIES[policy], True), 5)
        row = {"data": "laplace", "MB": args.reference_mb, "codec": f"numpy-reference-{policy}",
               "enc_MBps": v.nbytes / seconds / 1e6}
        rows.append(row)
        print(json.dumps(row))
    write_atomic(args.out, json.dumps({"device": name, "rows": rows}, indent=1).encode())
    print_table(name, rows)


def print_table(name: str, rows: list[dict]) -> None:
    print(f"\n{name}: GB/s of int32 input (median), ratio = input bytes / output bytes")
    head = ["data", "MB", "codec", "ratio", "enc GB/s", "dec GB/s", "+zstd ratio", "+zstd enc", "+zstd dec",
            "copy GB/s"]
    figures = ["ratio", "enc_GBps", "dec_GBps", "ratio_zstd", "enc_zstd_GBps", "dec_zstd_GBps", "copy_GBps"]

    def cell(r: dict, k: str) -> str:
        return f"{r[k]:.2f}" if isinstance(r.get(k), float) else "-"

    print("\n".join(markdown.table(head, ([r["data"], r["MB"], r["codec"], *(cell(r, k) for k in figures)]
                                         for r in rows if "copy_GBps" in r))))


if __name__ == "__main__":
    main()
