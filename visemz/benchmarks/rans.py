"""Conditional rANS throughput and size, GPU and CPU, against the block encoder + zstd and CompressAI's rANS.

    python -m visemz.benchmarks.rans --out bench_rans.json [--images 768x512 2432x1920] [--big-mb 64 256]
                                     [--repeat 20] [--lane-bytes 128 256 512 1024 2048]

Inputs are latent-shaped symbol tensors (192 channels at 1/16 of an image's padded size,
so 768x512 gives 192 x 32 x 48 = 294,912 symbols), and --big-mb megabytes of int32
symbols for throughput.  Each symbol is round(N(0, s)) with its own scale s: 60% of the
scales log-uniform in [0.05, 0.2] (the near-empty channels of a low-rate latent), the
rest log-uniform in [0.2, 20].  Table indexes come from CompressAI's GaussianConditional
(its default 64-scale table) and are the same for every coder.

Rows, per input: visemz's conditional rANS on the GPU (cupy in, bytes out; and bytes in,
cupy out) and on the CPU (NumPy reference, up to --cpu-max symbols); the block encoder
+ zstd (``encode_ints``, per-block policy) on the GPU (nvCOMP) and CPU (libzstd); and
CompressAI's rANS, timed both as the coder alone (``compressai.ans`` BufferedRansEncoder /
RansDecoder with the indexes, their lists made once) and through GaussianConditional.compress /
decompress themselves (the tensor-to-list conversions they make on every call included).
Bytes, bytes over the ideal code length of the quantised tables, and times as medians over --repeat runs
after --warmup runs; GPU calls are timed on the host with the stream synchronised before
and after (they return host bytes or a cupy array).  Throughput is symbols/s and GB/s of
int32 input (1 GB = 1e9 bytes).  --lane-bytes sweeps the lane plan on the first input
(bytes against GPU time).  The device name is printed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from compressai import ans
from compressai.entropy_models import GaussianConditional
from compressai.models.google import get_scale_table

from visemz import cuda, markdown, measure
from visemz.encoders import decode_ints, encode_ints
from visemz.encoders.cdf_tables import gaussian_scale_tables
from visemz.encoders.rans import decode_conditional, encode_conditional, prepare
from visemz.io.writers import write_atomic


def timed(fn, repeat: int, warmup: int, sync=None) -> tuple[float, object]:
    """(median seconds of fn() over ``repeat`` runs after ``warmup``, ``sync`` around each; its last result)."""
    return measure.median_seconds(fn, repeat, warmup=warmup, sync=sync)


def make_input(n: int, seed: int):
    """Symbols and float32 scales shaped like a low-to-mid-rate latent (see the module docstring)."""
    rng = np.random.default_rng(seed)
    small = rng.random(n) < 0.6
    scales = np.where(small, np.exp(rng.uniform(np.log(0.05), np.log(0.2), n)),
                      np.exp(rng.uniform(np.log(0.2), np.log(20.0), n)))
    sym = np.round(rng.normal(0.0, 1.0, n) * scales).astype(np.int32)
    return sym, scales.astype(np.float32)


def ideal_bytes(sym, idx, tables) -> float:
    entry, _ = prepare(sym, idx, tables)
    freq = np.diff(tables.cdf.astype(np.int64), append=0)[entry]
    return float(-np.log2(freq / 65536).sum() / 8)


def row(name: str, n: int, nbytes: int, ideal: float, t_enc: float, t_dec: float, **extra) -> dict:
    r = {"coder": name, "symbols": n, "bytes": nbytes, "bytes_over_ideal": round(nbytes / ideal, 4) if ideal else None,
         "enc_ms": round(1e3 * t_enc, 3), "dec_ms": round(1e3 * t_dec, 3),
         "enc_Msym_s": round(n / t_enc / 1e6, 1), "dec_Msym_s": round(n / t_dec / 1e6, 1),
         "enc_GBps": round(4 * n / t_enc / 1e9, 3), "dec_GBps": round(4 * n / t_dec / 1e9, 3)}
    r.update(extra)
    print(json.dumps(r), flush=True)
    return r


def compressai_rows(gc, sym, idx, ideal, repeat, warmup) -> list[dict]:
    cdf, lengths, offsets = (gc.quantized_cdf.tolist(), gc.cdf_length.reshape(-1).int().tolist(),
                             gc.offset.reshape(-1).int().tolist())
    s_list, i_list = sym.tolist(), idx.tolist()

    def enc_coder():
        e = ans.BufferedRansEncoder()
        e.encode_with_indexes(s_list, i_list, cdf, lengths, offsets)
        return e.flush()

    # GaussianConditional itself: one row of symbols (its batch of one), the indexes as a tensor
    values, indexes = torch.from_numpy(sym).float()[None], torch.from_numpy(idx)[None]

    t_enc, string = timed(enc_coder, repeat, warmup)
    t_enc_full, (full,) = timed(lambda: gc.compress(values, indexes), repeat, warmup)
    dec = ans.RansDecoder()
    t_dec, out = timed(lambda: dec.decode_with_indexes(string, i_list, cdf, lengths, offsets), repeat, warmup)
    t_dec_full, back = timed(lambda: gc.decompress([full], indexes), repeat, warmup)
    assert np.array_equal(np.asarray(out, np.int32), sym) and torch.equal(back, values)
    return [row("compressai-rans (coder)", sym.size, len(string), ideal, t_enc, t_dec),
            row("compressai-rans (GaussianConditional)", sym.size, len(full), ideal, t_enc_full, t_dec_full)]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", nargs="*", default=["768x512", "2432x1920"], help="WxH: latents of these images")
    ap.add_argument("--big-mb", type=int, nargs="*", default=[64, 256], help="MB of int32 symbols")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--cpu-max", type=float, default=4e6, help="largest input for the CPU rows (symbols)")
    ap.add_argument("--compressai-max", type=float, default=2e7, help="largest input for CompressAI's rows")
    ap.add_argument("--lane-bytes", type=int, nargs="*", default=[128, 256, 512, 1024, 2048])
    ap.add_argument("--no-gpu", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("bench_rans.json"))
    args = ap.parse_args(argv)

    gc = GaussianConditional(None)
    gc.update_scale_table(get_scale_table())
    tables = gaussian_scale_tables(gc.scale_table.double().numpy())
    cp = None
    if not args.no_gpu:
        cp = cuda.require_cupy()
        name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()
    else:
        name = "CPU only"
    print(f"device: {name}")
    sync = cp.cuda.get_current_stream().synchronize if cp else None

    inputs = []
    for spec in args.images:
        w, h = (int(v) for v in spec.lower().split("x"))
        inputs.append((f"latent of {w}x{h}", 192 * (-(-h // 64) * 4) * (-(-w // 64) * 4)))
    inputs += [(f"{mb} MB int32", mb * (1 << 20) // 4) for mb in args.big_mb]
    rows, sweep = [], []
    for k, (label, n) in enumerate(inputs):
        print(f"\n{label}: {n} symbols", flush=True)
        sym, scales = make_input(n, seed=k)
        idx = gc.build_indexes(torch.from_numpy(scales)).int().numpy()
        ideal = ideal_bytes(sym, idx, tables)
        rep = args.repeat if n <= 4e6 else max(3, args.repeat // 4)
        base = {"input": label}
        if cp:
            g_sym, g_idx = cp.asarray(sym), cp.asarray(idx)
            t_enc, buf = timed(lambda: encode_conditional(g_sym, g_idx, tables), rep, args.warmup, sync)
            t_dec, out = timed(lambda: decode_conditional(buf, g_idx, tables), rep, args.warmup, sync)
            assert np.array_equal(out.get(), sym)
            rows.append(dict(base, **row("visemz-rans-gpu", n, len(buf), ideal, t_enc, t_dec)))
            t_enc, zbuf = timed(lambda: encode_ints(g_sym, policy="block"), rep, args.warmup, sync)
            t_dec, _ = timed(lambda: decode_ints(zbuf, device="cuda"), rep, args.warmup, sync)
            rows.append(dict(base, **row("visemz-block+zstd-gpu", n, len(zbuf), ideal, t_enc, t_dec)))
            if k == 0:
                for lb in args.lane_bytes:
                    t_enc, b = timed(lambda: encode_conditional(g_sym, g_idx, tables, lane_bytes=lb), rep, args.warmup,
                                     sync)
                    t_dec, _ = timed(lambda: decode_conditional(b, g_idx, tables), rep, args.warmup, sync)
                    sweep.append(dict(base, **row(f"visemz-rans-gpu lane_bytes={lb}", n, len(b), ideal, t_enc, t_dec,
                                                  lane_bytes=lb)))
        if n <= args.cpu_max:
            crep = max(3, rep // 4)
            t_enc, buf = timed(lambda: encode_conditional(sym, idx, tables), crep, 1)
            t_dec, out = timed(lambda: decode_conditional(buf, idx, tables), crep, 1)
            assert np.array_equal(out, sym)
            rows.append(dict(base, **row("visemz-rans-cpu", n, len(buf), ideal, t_enc, t_dec)))
            t_enc, zbuf = timed(lambda: encode_ints(sym, policy="block"), crep, 1)
            t_dec, _ = timed(lambda: decode_ints(zbuf), crep, 1)
            rows.append(dict(base, **row("visemz-block+zstd-cpu", n, len(zbuf), ideal, t_enc, t_dec)))
        if n <= args.compressai_max:
            rows += [dict(base, **r) for r in compressai_rows(gc, sym, idx, ideal, max(3, rep // 4), 1)]
    write_atomic(args.out, json.dumps({"device": name, "rows": rows, "lane_bytes_sweep": sweep}, indent=1).encode())
    print_table(name, rows + sweep)


def print_table(name: str, rows: list[dict]) -> None:
    print(f"\n{name}")
    keys = ["input", "coder", "bytes", "bytes_over_ideal", "enc_ms", "dec_ms", "enc_Msym_s", "dec_Msym_s", "enc_GBps",
            "dec_GBps"]
    head = ["input", "coder", "bytes", "/ ideal", "enc ms", "dec ms", "enc Msym/s", "dec Msym/s", "enc GB/s",
            "dec GB/s"]
    print("\n".join(markdown.table(head, ([r[k] for k in keys] for r in rows))))


if __name__ == "__main__":
    main()
