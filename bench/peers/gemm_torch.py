#!/usr/bin/env python3
"""PyTorch peer of the lowbit GEMM benchmark (`lowbit bench gemm`).

Times the GEMMs of a linear layer Y [M, N] = X [M, K] . W [N, K]^T in plain eager PyTorch, on the
same layers as the C++ benchmark (square shapes and the 124m / 1b / 8b presets), so that the two
can be run side by side on one GPU host and compared:

  fprop  Y  = X @ W^T     (contracts K)
  dgrad  dX = dY @ W      (contracts N)
  wgrad  dW = dY^T @ X    (contracts M)

Modes:
  bf16  torch.matmul on bf16 tensors (bf16 out).
  fp8   torch._scaled_mm with per-tensor scales, bf16 out, in the TN layout FP8 tensor cores take
        (first operand row-major, second column-major, both contiguous along the contraction;
        the transposed copies are made once, outside the timing, as a fused cast+transpose would
        make them). HYBRID formats: fprop E4M3 x E4M3; dgrad and wgrad E5M2 (dY) x E4M3.
        use_fast_accum follows Transformer Engine's policy: on in fprop, off in dgrad and wgrad
        (--fast-accum on|off overrides it).

FLOPs = 2*M*N*K for every role; TFLOP/s = FLOPs / median time. ratio_bf16 = TFLOP/s over the
bf16 TFLOP/s of the same layer and role.

Timing (--timing): `queued` (default): CUDA events around each call after warm-up calls; a GPU
sleep kernel is queued first so that the host enqueues the timed calls ahead of the GPU and the
events measure device time, not Python launch latency. `burst`: the method of `lowbit bench
gemm` — rounds of back-to-back calls (a burst of about 1 ms, its length from the warm-up speed)
between two events, one call's time being the burst's over its length; the GPU runs the sweep
without idling, at the clocks it sustains (after the idle sleep of `queued` an H100 runs its first
calls at clocks it cannot hold under FP8 / BF16 load, which made the two benches differ by up to
18 %). A burst is preceded by a sleep only where Python's launch time per call reaches half the
call's GPU time. The median (and minimum) are reported.

Every case (layer, role, mode) runs under its own error handling: an unsupported dtype pair,
an OOM or any other failure is recorded in the case's `error` field and the run goes on.

Usage:
  python3 bench/peers/gemm_torch.py                           # square, 124m, 1b, 8b
  python3 bench/peers/gemm_torch.py --quick --out torch_gemm.jsonl
  python3 bench/peers/gemm_torch.py --shapes 8192x8192x8192,8b --modes fp8 --roles fprop
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import platform
import statistics
import sys
import time

try:
    import torch
except ImportError:  # reported in main()
    torch = None

E4M3_MAX = 448.0
E5M2_MAX = 57344.0
MODES = ("bf16", "fp8")
ROLES = ("fprop", "dgrad", "wgrad")
DEFAULT_SHAPES = "square,124m,1b,8b"
QUICK_SHAPES = "square,8b"

# The layers of the presets, as in src/bench/gemm_bench.cu: (name, M tokens, N out, K in).
PRESETS = {
    # d 768, GELU MLP ffn 3072, vocab 32000, 16x1024 tokens.
    "124m": [("124m.qkv", 16384, 2304, 768), ("124m.proj", 16384, 768, 768),
             ("124m.fc1", 16384, 3072, 768), ("124m.fc2", 16384, 768, 3072),
             ("124m.head", 16384, 32000, 768)],
    # d 2048, GELU MLP ffn 8192, 8x2048 tokens.
    "1b": [("1b.qkv", 16384, 6144, 2048), ("1b.proj", 16384, 2048, 2048),
           ("1b.fc1", 16384, 8192, 2048), ("1b.fc2", 16384, 2048, 8192)],
    # d 4096, GQA 32/8 heads of 128, SwiGLU ffn 14336 (gate+up fused), 8x2048 tokens.
    "8b": [("8b.qkv", 16384, 6144, 4096), ("8b.proj", 16384, 4096, 4096),
           ("8b.gate_up", 16384, 28672, 4096), ("8b.down", 16384, 4096, 14336)],
    "square": [("4096x4096x4096", 4096, 4096, 4096), ("8192x8192x8192", 8192, 8192, 8192)],
}


def parse_shapes(text):
    out = []
    for item in [s.strip() for s in text.split(",") if s.strip()]:
        if item in PRESETS:
            out.extend(PRESETS[item])
            continue
        parts = item.split("x")
        try:
            m, n, k = (int(p) for p in parts)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"bad shape {item!r}: expected MxNxK (e.g. 8192x8192x8192) or a preset "
                f"({', '.join(PRESETS)})") from None
        if min(m, n, k) <= 0:
            raise argparse.ArgumentTypeError(f"shape {item!r}: sizes must be positive")
        out.append((item, m, n, k))
    if not out:
        raise argparse.ArgumentTypeError("no shapes given")
    return out


def parse_list(allowed):
    def parse(text):
        items = [s.strip() for s in text.split(",") if s.strip()]
        bad = [s for s in items if s not in allowed]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"choose from {','.join(allowed)}")
        return [a for a in allowed if a in items]  # canonical order (bf16 first)
    return parse


def short_error(exc, limit=400):
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = f"{type(exc).__name__}: {' | '.join(lines[:3])}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def free_memory(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def sleep_cycles_per_ms(device):
    """Calibrates torch.cuda._sleep (GPU spin, in clock cycles); None when unavailable."""
    if device.type != "cuda" or not hasattr(torch.cuda, "_sleep"):
        return None
    try:
        torch.cuda._sleep(1000)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 20_000_000
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end)
        return cycles / ms if ms > 0 else None
    except Exception:  # noqa: BLE001 - fall back to timing without a queued sleep
        return None


def time_calls(call, device, warmup, iters, cycles_per_ms):
    """Returns (median ms, min ms) of call()."""
    call()
    sync(device)
    host = []
    for _ in range(warmup):
        t = time.perf_counter()
        call()
        host.append(time.perf_counter() - t)
    sync(device)
    if device.type != "cuda":
        times = []
        for _ in range(iters):
            t = time.perf_counter()
            call()
            times.append((time.perf_counter() - t) * 1e3)
        return statistics.median(times), min(times)
    host_per_call = min(host, default=1e-3)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    if cycles_per_ms:
        sleep_ms = min(500.0, 1.5 * host_per_call * 1e3 * iters + 1.0)
        torch.cuda._sleep(int(sleep_ms * cycles_per_ms))
    for i in range(iters):
        starts[i].record()
        call()
        ends[i].record()
    sync(device)
    times = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    return statistics.median(times), min(times)


def time_bursts(call, device, warmup, iters, cycles_per_ms):
    """Returns (median ms, min ms) of one call of call(), timed as `lowbit bench gemm` times:
    `iters` bursts of back-to-back calls between two events, each about 1 ms long."""
    call()
    sync(device)
    w = max(warmup, 1)
    t0 = time.perf_counter()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(w):
        call()
    end.record()
    host_per_call = (time.perf_counter() - t0) / w
    sync(device)
    est_ms = max(start.elapsed_time(end) / w, 1e-4)
    burst = min(max(math.ceil(1.0 / est_ms), 1), 64)
    # Launch-bound calls (Python slower than the GPU): let the host queue the burst first.
    sleep_ms = 1.5 * host_per_call * 1e3 * burst + 0.05
    queue_first = cycles_per_ms and host_per_call * 1e3 >= 0.5 * est_ms
    times = []
    for _ in range(iters):
        if queue_first:
            torch.cuda._sleep(int(min(sleep_ms, 500.0) * cycles_per_ms))
        start.record()
        for _ in range(burst):
            call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / burst)
    return statistics.median(times), min(times)


def quantize_fp8(x, dtype, fmax):
    """Per-tensor current scaling: (fp8 tensor, scale_inv as a 0-d fp32 tensor)."""
    amax = x.abs().amax().float()
    scale = torch.where(amax > 0, fmax / amax, torch.ones_like(amax))
    q = (x.float() * scale).clamp(-fmax, fmax).to(dtype)
    return q, (1.0 / scale).reshape(())


class Layer:
    """The bf16 sources of one layer and, on demand, their FP8 copies."""

    def __init__(self, m, n, k, device, seed):
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
        bf = torch.bfloat16
        self.x = torch.randn((m, k), generator=gen, device=device, dtype=bf)
        self.w = torch.randn((n, k), generator=gen, device=device, dtype=bf) * 0.02
        self.dy = torch.randn((m, n), generator=gen, device=device, dtype=bf) * 1e-3
        self._fp8 = {}

    def fp8(self, name):
        """name: x, w (E4M3), dy (E5M2), or with a 't' suffix the transposed copy."""
        if name not in self._fp8:
            base = name.rstrip("t")
            src = getattr(self, base)
            if name.endswith("t"):
                src = src.t().contiguous()
            if base == "dy":
                self._fp8[name] = quantize_fp8(src, torch.float8_e5m2, E5M2_MAX)
            else:
                self._fp8[name] = quantize_fp8(src, torch.float8_e4m3fn, E4M3_MAX)
        return self._fp8[name]


def make_call(layer, role, mode, fast_accum):
    """The timed function of one case and a description of it."""
    x, w, dy = layer.x, layer.w, layer.dy
    if mode == "bf16":
        if role == "fprop":
            return (lambda: torch.matmul(x, w.t())), "matmul bf16 X @ W^T"
        if role == "dgrad":
            return (lambda: torch.matmul(dy, w)), "matmul bf16 dY @ W"
        dyt = dy.t()
        return (lambda: torch.matmul(dyt, x)), "matmul bf16 dY^T @ X"
    # fp8: a row-major [R, Kc], b column-major [Kc, C] (the transpose of a row-major [C, Kc]).
    if role == "fprop":
        (a, sa), (b, sb) = layer.fp8("x"), layer.fp8("w")          # X [M,K], W [N,K]
    elif role == "dgrad":
        (a, sa), (b, sb) = layer.fp8("dy"), layer.fp8("wt")        # dY [M,N], W^T [K,N]
    else:
        (a, sa), (b, sb) = layer.fp8("dyt"), layer.fp8("xt")       # dY^T [N,M], X^T [K,M]
    bt = b.t()
    fast = {"policy": role == "fprop", "on": True, "off": False}[fast_accum]

    def call():
        return torch._scaled_mm(a, bt, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16,
                                use_fast_accum=fast)

    names = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}
    desc = f"_scaled_mm {names[a.dtype]}x{names[b.dtype]} fast_accum={int(fast)}"
    return call, desc


def build_parser():
    p = argparse.ArgumentParser(
        description="PyTorch peer of `lowbit bench gemm` (eager torch.matmul / torch._scaled_mm)")
    p.add_argument("--shapes", type=parse_shapes, default=None,
                   help=f"MxNxK layers or presets {','.join(PRESETS)} (default {DEFAULT_SHAPES})")
    p.add_argument("--modes", type=parse_list(MODES), default=list(MODES),
                   help="bf16,fp8 (default both)")
    p.add_argument("--roles", type=parse_list(ROLES), default=list(ROLES),
                   help="fprop,dgrad,wgrad (default all)")
    p.add_argument("--fast-accum", choices=("policy", "on", "off"), default="policy",
                   help="FP8 use_fast_accum: TE policy (fprop only; default), on or off")
    p.add_argument("--iters", type=int, default=None, help="timed calls (default 30, --quick 10)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up calls (default 5, --quick 3)")
    p.add_argument("--quick", action="store_true",
                   help=f"shapes {QUICK_SHAPES}, fewer iterations")
    p.add_argument("--device", default="cuda", help="cuda (default) or cuda:N")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--out", default=None,
                   help="JSON lines file; '-' writes them to stdout and the table to stderr")
    p.add_argument("--launch-overhead", choices=("hide", "include"), default="hide",
                   help="hide (default): queue a GPU sleep before the timed calls")
    p.add_argument("--timing", choices=("queued", "burst"), default="queued",
                   help="queued (default): a GPU sleep, then events around each call; burst: "
                        "lowbit bench gemm's ~1 ms bursts of back-to-back calls")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    if torch is None:
        print("error: gemm_torch.py needs PyTorch (import torch failed)", file=sys.stderr)
        return 2
    shapes = args.shapes or parse_shapes(QUICK_SHAPES if args.quick else DEFAULT_SHAPES)
    iters = args.iters if args.iters is not None else (10 if args.quick else 30)
    warmup = args.warmup if args.warmup is not None else (3 if args.quick else 5)
    if iters < 1 or warmup < 0:
        print("error: --iters must be >= 1 and --warmup >= 0", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device is available to torch", file=sys.stderr)
        return 2

    json_file, table = None, sys.stdout
    if args.out == "-":
        json_file, table = sys.stdout, sys.stderr
    elif args.out:
        json_file = open(args.out, "w")

    meta = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    print(f"gemm_torch on {meta['device']} (torch {meta['torch']}, CUDA {meta['cuda']})",
          file=table)
    cycles = sleep_cycles_per_ms(device) if args.launch_overhead == "hide" else None
    timing = "burst" if args.timing == "burst" else ("queued" if cycles else "per-call")
    if args.timing == "burst" and device.type != "cuda":
        print("error: --timing burst needs a CUDA device", file=sys.stderr)
        return 2
    timer = time_bursts if args.timing == "burst" else time_calls
    failures = 0

    for li, (name, m, n, k) in enumerate(shapes):
        flops = 2.0 * m * n * k
        layer, layer_error = None, None
        try:
            layer = Layer(m, n, k, device, args.seed + li)
        except Exception as exc:  # noqa: BLE001 - recorded per case
            layer_error = f"inputs: {short_error(exc)}"
        bf16_ms = {}
        for mode in args.modes:
            for role in args.roles:
                rec = {"bench": "gemm", "peer": "torch", "impl": "torch", "shape": name,
                       "M": m, "N": n, "K": k, "role": role, "mode": mode, "op": None,
                       "ms": None, "ms_min": None, "flops": flops, "tflops": None,
                       "ratio_bf16": None, "iters": iters, "warmup": warmup, "timing": timing,
                       "error": layer_error, **meta}
                if layer is not None:
                    try:
                        call, rec["op"] = make_call(layer, role, mode, args.fast_accum)
                        ms, ms_min = timer(call, device, warmup, iters, cycles)
                        rec.update(ms=ms, ms_min=ms_min, tflops=flops / ms / 1e9)
                        if mode == "bf16":
                            bf16_ms[role] = ms
                        if role in bf16_ms:
                            rec["ratio_bf16"] = bf16_ms[role] / ms
                    except Exception as exc:  # noqa: BLE001 - recorded per case, run goes on
                        rec["error"] = short_error(exc)
                        if device.type == "cuda" and isinstance(exc, torch.cuda.OutOfMemoryError):
                            free_memory(device)
                label = f"{name} {role}"
                if rec["error"]:
                    failures += 1
                    print(f"{label:<24} {mode:<5} error: {rec['error']}", file=table)
                else:
                    ratio = f"{rec['ratio_bf16']:.2f}x bf16" if rec["ratio_bf16"] else ""
                    print(f"{label:<24} {mode:<5} {rec['ms']:9.4f} ms {rec['tflops']:7.1f} "
                          f"TFLOP/s {ratio:>11}  {rec['op']}", file=table)
                table.flush()
                if json_file:
                    json_file.write(json.dumps(rec) + "\n")
                    json_file.flush()
        del layer
        free_memory(device)

    if json_file and json_file is not sys.stdout:
        json_file.close()
    if failures:
        print(f"{failures} case(s) failed (see their error fields)", file=table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
