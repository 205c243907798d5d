#!/usr/bin/env python3
"""PyTorch peer of `lowbit bench train`: the same LLaMA architecture, shapes and batch, trained in
BF16 autocast with FP32 master weights, fused AdamW and torch.compile, on random tokens.

Cases (as in lowbit): 124m (d 768, 12 layers, 12 heads, SwiGLU 2048, vocab 32000, tied head) at
batch 16 x 1024, and 1b (d 2048, 16 layers, 32 heads / 8 kv heads, SwiGLU 8192, vocab 128256,
tied head) at 8 x 2048. RoPE in HF's rotate_half convention, RMSNorm, causal SDPA (flash).

Reports tokens/s over timed steps after warm-up (compilation included in warm-up), MFU against
the H100's dense BF16 peak (989.4 TFLOP/s) with the same FLOP count as lowbit
(6 * matmul params incl. the head + 6 * L * T * H * Dh), and torch.cuda.max_memory_allocated.
"""
import argparse
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {
    "124m": dict(d=768, layers=12, heads=12, kv=12, ffn=2048, vocab=32000, batch=16, seq=1024,
                 theta=10000.0),
    "1b": dict(d=2048, layers=16, heads=32, kv=8, ffn=8192, vocab=128256, batch=8, seq=2048,
               theta=500000.0),
}


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.w = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.w, self.eps)


def rope_cache(seq, dh, theta, device):
    inv = 1.0 / (theta ** (torch.arange(0, dh, 2, device=device, dtype=torch.float64) / dh))
    t = torch.arange(seq, device=device, dtype=torch.float64)
    ang = torch.outer(t, inv)
    emb = torch.cat([ang, ang], dim=-1)
    return emb.cos().float(), emb.sin().float()


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, h, kv, ffn = c["d"], c["heads"], c["kv"], c["ffn"]
        self.h, self.kv, self.dh = h, kv, d // h
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
        self.qkv = nn.Linear(d, (h + 2 * kv) * self.dh, bias=False)
        self.o = nn.Linear(h * self.dh, d, bias=False)
        self.gu = nn.Linear(d, 2 * ffn, bias=False)
        self.down = nn.Linear(ffn, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q, k, v = self.qkv(self.n1(x)).split(
            [self.h * self.dh, self.kv * self.dh, self.kv * self.dh], dim=-1)
        q = q.view(B, T, self.h, self.dh).transpose(1, 2)
        k = k.view(B, T, self.kv, self.dh).transpose(1, 2)
        v = v.view(B, T, self.kv, self.dh).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=self.kv != self.h)
        x = x + self.o(a.transpose(1, 2).reshape(B, T, -1))
        g, u = self.gu(self.n2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)


class Llama(nn.Module):
    def __init__(self, c, device):
        super().__init__()
        self.emb = nn.Embedding(c["vocab"], c["d"])
        self.blocks = nn.ModuleList(Block(c) for _ in range(c["layers"]))
        self.norm = RMSNorm(c["d"])
        cos, sin = rope_cache(c["seq"], c["d"] // c["heads"], c["theta"], device)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x, self.cos, self.sin)
        logits = F.linear(self.norm(x), self.emb.weight)  # tied head
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def flops_per_token(c):
    d, L, h, kv, ffn, V, T = c["d"], c["layers"], c["heads"], c["kv"], c["ffn"], c["vocab"], c["seq"]
    dh = d // h
    matmul = L * (d * (h + 2 * kv) * dh + h * dh * d + 3 * d * ffn) + V * d
    return 6 * matmul + 6 * L * T * h * dh


def run(name, args):
    c = PRESETS[name]
    dev = torch.device("cuda")
    torch.manual_seed(0)
    torch.cuda.reset_peak_memory_stats()
    model = Llama(c, dev).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=True)
    step_fn = torch.compile(model) if args.compile else model
    B, T, V = c["batch"], c["seq"], c["vocab"]
    idx = torch.randint(0, V, (B, T), device=dev)
    tgt = torch.randint(0, V, (B, T), device=dev)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_fn(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    torch.cuda.synchronize()
    sec = time.perf_counter() - t0
    tok_s = B * T * args.steps / sec
    row = dict(bench="train", impl="torch", preset=name, recipe="bf16",
               compile=bool(args.compile), batch=B, seq_len=T, step_ms=sec * 1e3 / args.steps,
               tokens_per_s=tok_s, mfu=flops_per_token(c) * tok_s / 989.4e12,
               peak_mem_bytes=torch.cuda.max_memory_allocated(), loss_last=float(loss),
               torch=torch.__version__, device=torch.cuda.get_device_name())
    print(f"{name:6s} torch bf16{'+compile' if args.compile else ''}  {B}x{T}  "
          f"{row['step_ms']:.1f} ms/step  {tok_s:,.0f} tok/s  MFU {row['mfu'] * 100:.1f}%  "
          f"peak {row['peak_mem_bytes'] / 2**30:.2f} GiB", flush=True)
    del model, opt
    torch.cuda.empty_cache()
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", default="124m,1b")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--no-compile", dest="compile", action="store_false")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    rows = []
    for name in args.presets.split(","):
        try:
            rows.append(run(name, args))
        except Exception as e:  # record and go on (OOM, compile failure)
            print(f"{name}: error {e}", file=sys.stderr, flush=True)
            rows.append(dict(bench="train", impl="torch", preset=name, error=str(e)))
    if args.out:
        with open(args.out, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
