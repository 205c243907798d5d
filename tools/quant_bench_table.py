#!/usr/bin/env python3
"""Markdown table of a quantization benchmark run: lowbit's `bench quant --json-out` rows beside
the PyTorch peer's (bench/peers/quant_torch.py --out) from the same GPU call.

    tools/quant_bench_table.py LOWBIT.jsonl TORCH.jsonl > table.md

Each recipe's time is compared with the same shape's device-to-device copy measured by the same
program, so "% copy" numbers of the two columns are each against their own copy measurement.
"""
import json
import sys

# lowbit recipe row → the PyTorch peer recipe doing the same conversion.
PAIRS = [
    ("fp8 delayed cast+T", None),
    ("fp8 current cast+T", "fp8_tensor"),
    ("fp8 block 1x128 +T", "fp8_block"),
    ("fp8 block 128x128 +T", None),
    ("mxfp8 row+col", "mxfp8"),
    ("nvfp4 act (RHT col)", "nvfp4_rht"),
    ("nvfp4 act, amax given", None),
    ("nvfp4 grad (RHT+SR)", None),
    ("nvfp4 weight 16x16", None),
]


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    ours = load(sys.argv[1])
    peer = load(sys.argv[2])
    shapes = list(dict.fromkeys(r["shape"] for r in ours))
    mine = {(r["shape"], r["recipe"]): r for r in ours}
    theirs = {(r["shape"], r["recipe"], r["mode"]): r for r in peer if not r.get("error")}
    print("| shape | recipe | lowbit ms | lowbit GB/s | % copy | torch eager ms | "
          "torch.compile ms | compile % copy | lowbit speed-up vs compile |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for shape in shapes:
        copy = mine.get((shape, "copy (d2d)"))
        if copy:
            print(f"| {shape} | copy (d2d) | {copy['ms']:.4f} | {copy['gbps']:.0f} | 100.0 | | | | |")
        for ours_name, peer_name in PAIRS:
            r = mine.get((shape, ours_name))
            if r is None:
                continue
            eager = theirs.get((shape, peer_name, "eager")) if peer_name else None
            comp = theirs.get((shape, peer_name, "compile")) if peer_name else None
            cells = [
                shape, ours_name, f"{r['ms']:.4f}", f"{r['gbps']:.0f}",
                f"{100 * r['frac_of_copy']:.1f}",
                f"{eager['ms']:.4f}" if eager else "–",
                f"{comp['ms']:.4f}" if comp else "–",
                f"{100 * comp['ratio_copy']:.1f}" if comp else "–",
                f"{comp['ms'] / r['ms']:.2f}×" if comp else "–",
            ]
            print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
