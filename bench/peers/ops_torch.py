#!/usr/bin/env python3
"""PyTorch peer of `lowbit bench ops`: the same transformer ops at the same shapes, on the same GPU.

Presets (as in lowbit): 124m (N = 16 x 1024 tokens, D 768, H 12, Hkv 12, Dh 64, F 2048, V 32000)
and 1b (N = 8 x 2048, D 2048, H 32, Hkv 8, Dh 64, F 8192, V 128256). Rows:
  embedding fwd / bwd     F.embedding; aten.embedding_dense_backward (what autograd runs)
  rmsnorm fwd / bwd       F.rms_norm; its backward through autograd (dx and dw)
  rope fwd / bwd (q)      rotate_half RoPE on the q heads of a fused qkv activation; the backward
                          is the rotation by -angle
  swiglu fwd / bwd        F.silu(g) * u; its backward through autograd (d gate_up)
  add (bf16)              a.add_(b)
  cross_entropy fwd+bwd   F.cross_entropy on bf16 logits of a 4096-row chunk, forward and
                          d logits through autograd (and on 16384 x 32000 for 124m); the
                          "(f32 upcast)" rows take logits.float() first, as train_torch.py does
  adamw_step              torch.optim.AdamW(fused=True).step() over f32 parameters of the
                          preset's tensor shapes (no bf16 copy is written: 28 bytes / param)
  segment_norms + clip    torch._foreach_norm, the global norm and the clip coefficient
  attention fwd / fwd+bwd F.scaled_dot_product_attention(is_causal=True, enable_gqa where
                          Hkv < H) at T 1024, 2048, 4096: Dh 64 with H = Hkv = 12, B = 16384 / T;
                          Dh 128 with H 16, Hkv 4, B = 16384 / T
Eager rows have "impl": "torch"; norm, rope, swiglu and cross-entropy also run under torch.compile
("impl": "torch.compile"). Byte and FLOP counts are lowbit's (see src/bench/ops_bench.cu), so GB/s
compares time directly. Timing: CUDA events, warm-up, then the median of --iters samples, each a
burst of back-to-back calls lasting about 1 ms. A failing case is recorded with its error and the
run goes on.
"""
import argparse
import json
import math
import sys

import torch
import torch.nn.functional as F

PRESETS = {
    "124m": dict(batch=16, seq=1024, d=768, layers=12, heads=12, kv=12, ffn=2048, vocab=32000,
                 theta=10000.0),
    "1b": dict(batch=8, seq=2048, d=2048, layers=16, heads=32, kv=8, ffn=8192, vocab=128256,
               theta=500000.0),
}
EPS = 1e-5


def time_ms(fn, iters):
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def burst(calls):
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / calls

    est = burst(3)
    calls = min(max(math.ceil(1.0 / max(est, 1e-4)), 1), 10000)
    burst(calls)
    ms = sorted(burst(calls) for _ in range(iters))
    return ms[len(ms) // 2]


class Recorder:
    def __init__(self, iters, device):
        self.iters, self.device, self.rows, self.copy_gbps = iters, device, [], 0.0

    def row(self, impl, op, preset, shape, make, bytes_=0.0, flops=0.0):
        """make() builds the inputs and returns the function to time (setup errors recorded)."""
        r = dict(bench="ops", impl=impl, op=op, preset=preset, shape=shape, ms=None,
                 bytes=bytes_ or None, gbps=None, frac_of_copy=None, flops=flops or None,
                 tflops=None, iters=self.iters, device=self.device, torch=torch.__version__,
                 error=None)
        try:
            ms = time_ms(make(), self.iters)
            r["ms"] = ms
            if bytes_ > 0:
                r["gbps"] = bytes_ / ms / 1e6
                r["frac_of_copy"] = r["gbps"] / self.copy_gbps if self.copy_gbps > 0 else 1.0
            if flops > 0:
                r["tflops"] = flops / ms / 1e9
        except Exception as e:  # record and go on (OOM, compile failure)
            r["error"] = f"{type(e).__name__}: {e}".splitlines()[0]
        if r["error"]:
            print(f"{preset:6s} {impl:13s} {op:32s} {shape:30s} error: {r['error']}", flush=True)
        elif flops > 0:
            print(f"{preset:6s} {impl:13s} {op:32s} {shape:30s} {r['ms']:9.4f} ms {'':27s} "
                  f"{r['tflops']:8.1f} TFLOP/s", flush=True)
        else:
            print(f"{preset:6s} {impl:13s} {op:32s} {shape:30s} {r['ms']:9.4f} ms "
                  f"{r['gbps']:8.1f} GB/s {100 * r['frac_of_copy']:6.1f}% of copy", flush=True)
        self.rows.append(r)
        return r


def dims(**kw):
    return " ".join(f"{k}{v}" for k, v in kw.items())


def rope_cache(seq, dh, theta, dev):
    inv = 1.0 / (theta ** (torch.arange(0, dh, 2, device=dev, dtype=torch.float64) / dh))
    ang = torch.outer(torch.arange(seq, device=dev, dtype=torch.float64), inv)
    emb = torch.cat([ang, ang], dim=-1)
    # [T, 1, Dh]: broadcast over [B, T, H, Dh]
    return emb.cos().to(torch.bfloat16)[:, None, :], emb.sin().to(torch.bfloat16)[:, None, :]


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def rope(x, cos, sin):
    return x * cos + rotate_half(x) * sin


def rmsnorm(x, w):
    return F.rms_norm(x, (x.shape[-1],), w, EPS)


def swiglu(gu):
    g, u = gu.chunk(2, dim=-1)
    return F.silu(g) * u


def ce_bf16(logits, tgt, scale):
    return F.cross_entropy(logits, tgt, reduction="sum") * scale


def ce_f32(logits, tgt, scale):
    return F.cross_entropy(logits.float(), tgt, reduction="sum") * scale


def param_shapes(c):
    d, h, kv, ffn, dh = c["d"], c["heads"], c["kv"], c["ffn"], c["d"] // c["heads"]
    shapes = [((c["vocab"], d), True)]
    for _ in range(c["layers"]):
        shapes += [((d,), False), ((h * dh, d), True), ((kv * dh, d), True), ((kv * dh, d), True),
                   ((d, h * dh), True), ((d,), False), ((ffn, d), True), ((ffn, d), True),
                   ((d, ffn), True)]
    return shapes + [((d,), False)]


def bench_preset(rec, name, modes):
    c = PRESETS[name]
    dev, bf = "cuda", torch.bfloat16
    B, T, D, V = c["batch"], c["seq"], c["d"], c["vocab"]
    H, Hkv, F_ = c["heads"], c["kv"], c["ffn"]
    Dh, N = D // H, B * T
    g = torch.Generator(device=dev).manual_seed(0)

    def randn(*shape, dtype=bf, std=1.0, grad=False):
        t = (torch.randn(*shape, device=dev, generator=g) * std).to(dtype)
        return t.requires_grad_(grad)

    def fwd_bwd_rows(op, shape, fn, make_inputs, fwd_bytes, bwd_bytes):
        """fwd: fn(*inputs); bwd: autograd.grad of its output wrt the inputs, per mode."""
        for impl, f in modes(fn):
            def mk_fwd(f=f):
                ins = make_inputs(False)
                return lambda: f(*ins)

            def mk_bwd(f=f):
                ins = make_inputs(True)
                out = f(*ins)
                dout = torch.randn_like(out)
                return lambda: torch.autograd.grad(out, [i for i in ins if i.requires_grad], dout,
                                                   retain_graph=True)
            rec.row(impl, f"{op} fwd", name, shape, mk_fwd, fwd_bytes)
            rec.row(impl, f"{op} bwd", name, shape, mk_bwd, bwd_bytes)

    # embedding
    sh = dims(N=N, D=D, V=V)

    def mk_emb_fwd():
        tok, table = torch.randint(0, V, (N,), device=dev), randn(V, D, std=0.02)
        return lambda: F.embedding(tok, table)

    tok_emb = torch.randint(0, V, (N,), device=dev)
    unique = int(torch.unique(tok_emb).numel())

    def mk_emb_bwd():
        dout = randn(N, D)
        return lambda: torch.ops.aten.embedding_dense_backward(dout, tok_emb, V, -1, False)

    rec.row("torch", "embedding fwd", name, sh, mk_emb_fwd, 4.0 * N + 2.0 * N * D * 2)
    rec.row("torch", "embedding bwd", name, sh, mk_emb_bwd, 4.0 * N + 2.0 * N * D + 8.0 * unique * D)

    # rmsnorm
    fwd_bwd_rows("rmsnorm", dims(N=N, D=D), rmsnorm,
                 lambda gr: (randn(N, D, grad=gr), randn(D, grad=gr)),
                 2.0 * N * D + 2.0 * D + 2.0 * N * D + 4.0 * N,
                 3 * 2.0 * N * D + 2.0 * D + 4.0 * N + 8.0 * D)

    # rope on the q heads of a fused qkv [B, T, H + 2 Hkv, Dh]
    cos, sin = rope_cache(T, Dh, c["theta"], dev)
    rope_bytes = 2 * 2.0 * N * H * Dh + 4.0 * T * Dh
    sh = dims(B=B, T=T, H=H, Dh=Dh)
    for impl, f in modes(rope):
        def mk_rope(sign, f=f):
            qkv = randn(B, T, H + 2 * Hkv, Dh)
            q = qkv[:, :, :H, :]
            s = sin if sign > 0 else -sin
            return lambda: f(q, cos, s)
        rec.row(impl, "rope fwd (q)", name, sh, lambda: mk_rope(1), rope_bytes)
        rec.row(impl, "rope bwd (q)", name, sh, lambda: mk_rope(-1), rope_bytes)

    # swiglu
    fwd_bwd_rows("swiglu", dims(N=N, F=F_), swiglu, lambda gr: (randn(N, 2 * F_, grad=gr),),
                 2.0 * N * 2 * F_ + 2.0 * N * F_, 2.0 * N * F_ + 2 * 2.0 * N * 2 * F_)

    # residual add
    def mk_add():
        a, b = randn(N, D), randn(N, D, std=1e-3)
        return lambda: a.add_(b)

    rec.row("torch", "add (bf16)", name, dims(N=N, D=D), mk_add, 3 * 2.0 * N * D)

    # cross-entropy forward + backward
    def ce_rows(op, rows):
        for variant, fn in (("", ce_bf16), (" (f32 upcast)", ce_f32)):
            for impl, f in modes(fn):
                def mk(f=f):
                    logits = randn(rows, V, std=2.0, grad=True)
                    tgt = torch.randint(0, V, (rows,), device=dev)
                    return lambda: torch.autograd.grad(f(logits, tgt, 1.0 / N), [logits])
                rec.row(impl, op + variant, name, dims(n=rows, V=V), mk,
                        2 * 2.0 * rows * V + 8.0 * rows)

    ce_rows("cross_entropy fwd+bwd", min(4096, N))
    if name == "124m":
        ce_rows("cross_entropy fwd+bwd (all)", N)
    torch.cuda.empty_cache()

    # optimizer and gradient norm over the preset's parameters
    shapes = param_shapes(c)
    P = sum(math.prod(s) for s, _ in shapes)
    S = len(shapes)
    sh = dims(P=P, segments=S)
    state = {}

    def mk_adamw():
        params = [torch.nn.Parameter(randn(*s, dtype=torch.float32, std=0.02)) for s, _ in shapes]
        for p in params:
            p.grad = torch.randn_like(p) * 1e-3
        groups = [dict(params=[p for p, (_, d) in zip(params, shapes) if d], weight_decay=0.1),
                  dict(params=[p for p, (_, d) in zip(params, shapes) if not d], weight_decay=0.0)]
        opt = torch.optim.AdamW(groups, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
        state["params"], state["opt"] = params, opt
        return opt.step

    def mk_norm():
        if "params" not in state:
            mk_adamw()
        grads = [p.grad for p in state["params"]]

        def f():
            norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
            return torch.clamp(1.0 / (norm + 1e-6), max=1.0)
        return f

    rec.row("torch", "adamw_step", name, sh, mk_adamw, 4 * 4.0 * P + 3 * 4.0 * P)
    rec.row("torch", "segment_norms + clip", name, sh, mk_norm, 4.0 * P + 8.0 * S + 12.0)
    state.clear()
    torch.cuda.empty_cache()


def bench_attention(rec):
    dev, bf = "cuda", torch.bfloat16
    for dh, h, hkv in ((64, 12, 12), (128, 16, 4)):
        for T in (1024, 2048, 4096):
            B = 16 * 1024 // T
            sh = dims(B=B, T=T, H=h, Hkv=hkv, Dh=dh)
            fwd_flops = 2.0 * B * h * T * T * dh

            def qkv_views(grad):
                qkv = torch.randn(B, T, h + 2 * hkv, dh, device=dev, dtype=bf)
                q, k, v = (t.transpose(1, 2) for t in qkv.split([h, hkv, hkv], dim=2))
                if grad:
                    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
                return q, k, v

            def sdpa(q, k, v):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                      enable_gqa=hkv != h)

            def mk_fwd():
                q, k, v = qkv_views(False)
                return lambda: sdpa(q, k, v)

            def mk_fwd_bwd():
                q, k, v = qkv_views(True)
                dout = torch.randn(B, h, T, dh, device=dev, dtype=bf)
                return lambda: torch.autograd.grad(sdpa(q, k, v), (q, k, v), dout)

            rec.row("torch", "attention fwd", "attn", sh, mk_fwd, flops=fwd_flops)
            rec.row("torch", "attention fwd+bwd", "attn", sh, mk_fwd_bwd, flops=3.5 * fwd_flops)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", default="124m,1b",
                    help="comma-separated 124m, 1b; none: the copy and attention rows only")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--no-compile", dest="compile", action="store_false")
    ap.add_argument("--json-out", default="")
    args = ap.parse_args()
    presets = [] if args.presets == "none" else args.presets.split(",")
    for p in presets:
        if p not in PRESETS:
            sys.exit(f"--presets: unknown preset '{p}' (124m, 1b, or none)")
    if not torch.cuda.is_available():
        sys.exit("ops_torch.py needs a CUDA GPU; none was found")
    torch.backends.cuda.matmul.allow_tf32 = True
    rec = Recorder(args.iters, torch.cuda.get_device_name())
    print(f"torch {torch.__version__} ops on {rec.device}", flush=True)

    def modes(fn):
        out = [("torch", fn)]
        if args.compile:
            out.append(("torch.compile", torch.compile(fn, dynamic=False)))
        return out

    n = 1 << 30

    def mk_copy():
        src = torch.ones(n, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        return lambda: dst.copy_(src)

    r = rec.row("torch", "copy (d2d)", "device", "1 GiB", mk_copy, 2.0 * n)
    rec.copy_gbps = r["gbps"] or 0.0
    torch.cuda.empty_cache()
    for name in presets:
        bench_preset(rec, name, modes)
        torch.cuda.empty_cache()
    bench_attention(rec)
    if args.json_out:
        with open(args.json_out, "w") as f:
            for row in rec.rows:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
