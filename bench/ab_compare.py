#!/usr/bin/env python3
"""Compares two builds' `lowbit bench gemm` runs taken in the same call (A/B, alternated).

Usage: ab_compare.py --a A1 A2 ... --b B1 B2 ... [--modes mxfp8,nvfp4] [--min-delta PCT]

Each file is the text output of `lowbit bench gemm` or its `--json-out` JSON lines. For every
(layer, role, mode) row present in both sets it prints the median time of A and of B, the
median ratio to BF16 of each (timed in the same burst as the row, so a build's ratio does not
depend on the other build's clocks) and the change of the median time, B against A. Rows whose
change is below --min-delta percent in size are marked '~' (2 % by default: about the spread
of one build's rows over three alternations in results/h100-2026-11-27/a-first-1353/).
"""
import argparse
import json
import statistics
import sys


def read_rows(path):
    """{(shape, role, mode): (ms, ratio_bf16 or None)} of one run (lowbit rows only)."""
    rows = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            if line.startswith("{"):
                j = json.loads(line)
                if j.get("impl") != "lowbit" or j.get("ms") is None:
                    continue
                rows[(j["shape"], j["role"], j["mode"])] = (j["ms"], j.get("ratio_bf16"))
                continue
            # Text: "<shape> <role> <mode> <ms> ms <tflops> TFLOP/s <ratio>x bf16 ..."; raw
            # cuBLASLt rows read "<mode> (raw)" and are skipped.
            p = line.split()
            if len(p) < 5 or p[4] != "ms" or p[3] == "(raw)":
                continue
            try:
                ms = float(p[3])
            except ValueError:
                continue
            ratio = None
            if len(p) > 7 and p[7].endswith("x") and p[8:9] == ["bf16"]:
                ratio = float(p[7][:-1])
            rows[(p[0], p[1], p[2])] = (ms, ratio)
    return rows


def medians(runs, key):
    ms = [r[key][0] for r in runs if key in r]
    ratios = [r[key][1] for r in runs if key in r and r[key][1] is not None]
    return (statistics.median(ms) if ms else None,
            statistics.median(ratios) if ratios else None)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", nargs="+", required=True, help="runs of build A")
    ap.add_argument("--b", nargs="+", required=True, help="runs of build B")
    ap.add_argument("--modes", default="", help="comma-separated modes to show (default: all)")
    ap.add_argument("--min-delta", type=float, default=2.0, help="percent below which '~'")
    args = ap.parse_args(argv)
    a_runs = [read_rows(p) for p in args.a]
    b_runs = [read_rows(p) for p in args.b]
    modes = set(filter(None, args.modes.split(",")))
    keys = []
    for r in a_runs + b_runs:
        for k in r:
            if k not in keys:
                keys.append(k)
    shown = 0
    print(f"{'layer':<14} {'role':<6} {'mode':<10} {'A ms':>9} {'B ms':>9} "
          f"{'A xbf16':>8} {'B xbf16':>8} {'B vs A':>8}")
    for k in keys:
        if modes and k[2] not in modes:
            continue
        a_ms, a_ratio = medians(a_runs, k)
        b_ms, b_ratio = medians(b_runs, k)
        if a_ms is None or b_ms is None:
            continue
        delta = 100.0 * (b_ms / a_ms - 1.0)
        mark = "~" if abs(delta) < args.min_delta else ""
        fmt_ratio = lambda x: f"{x:.2f}" if x is not None else "-"
        print(f"{k[0]:<14} {k[1]:<6} {k[2]:<10} {a_ms:>9.4f} {b_ms:>9.4f} "
              f"{fmt_ratio(a_ratio):>8} {fmt_ratio(b_ratio):>8} {delta:>+7.1f}%{mark}")
        shown += 1
    if shown == 0:
        print("no row is in both sets", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
