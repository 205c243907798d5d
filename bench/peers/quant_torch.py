#!/usr/bin/env python3
"""PyTorch peer of the lowbit quantization benchmark.

Times the quantization recipes of the format reference (formats.md §2-§5), written in plain
PyTorch, once eagerly and once through torch.compile, on the same shapes as our C++ benchmark, so
that the two can be run side by side on one GPU host and compared.

Shapes are M tokens x K hidden; the input is a random bf16 tensor (torch.randn, fixed seed).
Recipes (outputs; bytes counted for GB/s, mk = M*K):

  copy        y.copy_(x) into a preallocated bf16 tensor: the bandwidth reference.
              bytes = 2*mk read + 2*mk write = 4*mk
  fp8_tensor  FP8 E4M3 per-tensor current scaling with cast + transpose:
              amax = max|x|, scale = 448/amax (fp32; amax == 0 -> 1),
              q = e4m3(clamp(x*scale, +-448)) [M,K], qt = q^T [K,M], scale_inv = 1/scale.
              bytes = 2*mk + 2*mk = 4*mk
  fp8_block   FP8 E4M3 1x128 blocks with power-of-two fp32 scales (TE Float8BlockScaling):
              rowwise blocks along K -> q [M,K] + scale_inv [M,K/128]; columnwise blocks along M,
              quantized from the bf16 source and stored transposed -> qt [K,M] + scale_inv
              [M/128,K] (TE's compact layout). s = 2^floor(log2(448/amax)) (amax == 0 -> 1).
              bytes = 2*mk + 2*mk + 2*(mk/128)*4 = 4*mk + mk/16
  mxfp8       MXFP8 E4M3: 1x32 rowwise and 32x1 columnwise blocks (columnwise stored transposed,
              as lowbit stores it), E8M0 scale e = ceil(log2(amax/448)) + 127 as uint8 -> q_row
              [M,K] + e_row [M,K/32], q_col [K,M] + e_col [K,M/32].
              bytes = 2*mk + 2*mk + 2*(mk/32) = 4*mk + mk/16
  nvfp4_rht   NVFP4 (E2M1 data, E4M3 scales per 16, fp32 global amax), rowwise [M,K/2] packed
              + scales [M,K/16]; columnwise: x^T [K,M], 16-point random Hadamard transform along
              M (bf16 matmul), post-RHT global amax, same quantization -> [K,M/2] + [K,M/16].
              S_enc = 2688/A, sd = e4m3(block_amax * S_enc/6), element = e2m1_rne(x / (sd/S_enc)),
              two elements per byte, even element in the low nibble.
              bytes = 2*mk + 2*(mk/2) + 2*(mk/16) = 3*mk + mk/8

Modes: "eager" (plain PyTorch ops) and "compile" (torch.compile, mode "default" unless
--compile-mode says otherwise; each function is compiled once per shape with static shapes).

Timing: CUDA events around each call, warm-up calls first (the first call of the compiled mode
includes compilation; its wall time is reported as compile_s), then --iters timed calls; the
median is reported. Inputs under 100 MiB are rotated between two tensors so that the L2 cache
does not hold the input. By default a short GPU sleep kernel is queued before the timed calls so
that the host can enqueue them ahead of the GPU: the events then measure device time, not Python
launch overhead (--launch-overhead include turns that off).

Each compiled output is compared bit for bit with the eager output of the same input
(match_eager = fraction of equal bytes). With --check (on by default) every recipe is also
checked numerically on a small input before timing: dequantized values against the input,
scale properties (power-of-two, block maxima in [224, 448]), the transpose and the FP4 nibble
order.

Usage:
  python3 bench/peers/quant_torch.py                     # full run (5 shapes)
  python3 bench/peers/quant_torch.py --quick --out torch.jsonl
  python3 bench/peers/quant_torch.py --device cpu --smoke   # logic smoke test, tiny shapes
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import platform
import statistics
import sys
import time
import traceback

try:
    import torch
except ImportError:  # reported in main()
    torch = None

DEFAULT_SHAPES = "8192x8192,16384x768,16384x2048,16384x4096,16384x8192"
QUICK_SHAPES = "8192x8192,16384x2048"
SMOKE_SHAPES = "256x384,384x128"
CHECK_SHAPE = (256, 384)
RECIPES = ("copy", "fp8_tensor", "fp8_block", "mxfp8", "nvfp4_rht")
MODES = ("eager", "compile")
ROTATE_BELOW_BYTES = 100 * 2**20  # inputs smaller than this are rotated between two tensors

E4M3_MAX = 448.0
FP32_MAX = 3.4028234663852886e38  # FLT_MAX
BF16_MAX = 3.3895313892515355e38  # 0x7F7F, TE's value_for_inf for block scales of bf16 inputs
NVFP4_GLOBAL = 2688.0  # 448 * 6
RHT_SIGN_MASK = 0xD7E8  # bit i set <=> s_i = -1
POW2_MASK = -8388608  # 0xFF800000 as int32: sign + exponent bits of an fp32
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# E2M1 round-to-nearest-even decision points: a tie at 0.25, 1.25, 2.5, 5 goes down (to the even
# code), a tie at 0.75, 1.75, 3.5 goes up, so
#   code(|v|) = #{b in TIES_DOWN: b < |v|} + #{b in TIES_UP: b <= |v|}   (saturates at 7 = 6.0).
E2M1_TIES_DOWN = (0.25, 1.25, 2.5, 5.0)
E2M1_TIES_UP = (0.75, 1.75, 3.5)
# Probe values of the numerical check and their codes (sign in bit 3).
E2M1_PROBE = (0.0, 0.25, 0.3, 0.75, 1.0, 1.25, 1.3, 1.75, 2.5, 2.6, 3.5, 5.0, 5.5, 7.0, -0.75, -6.0)
E2M1_PROBE_CODES = (0, 0, 1, 2, 2, 2, 3, 4, 4, 5, 6, 6, 7, 7, 10, 15)


def payload_bytes(recipe: str, m: int, k: int) -> int:
    """Bytes moved by one call, as counted for GB/s (see the module docstring)."""
    mk = m * k
    if recipe in ("copy", "fp8_tensor"):
        return 4 * mk
    if recipe == "fp8_block":
        return 4 * mk + 2 * (mk // 128) * 4
    if recipe == "mxfp8":
        return 4 * mk + 2 * (mk // 32)
    if recipe == "nvfp4_rht":
        return 2 * mk + 2 * (mk // 2) + 2 * (mk // 16)
    raise ValueError(recipe)


# --------------------------------------------------------------------------------------------
# Recipes. Every function takes the bf16 input [M, K] (plus constant tensors) and returns a tuple
# of tensors. The same functions run eagerly and under torch.compile.
# --------------------------------------------------------------------------------------------

def q_copy(x, out):
    """Bandwidth reference: copy into a preallocated tensor."""
    out.copy_(x)
    return (out,)


def q_fp8_tensor(x):
    """FP8 E4M3 per-tensor current scaling; rowwise data and its transpose share one scale."""
    amax = x.abs().amax().float()
    scale = torch.clamp(E4M3_MAX / amax, max=FP32_MAX)  # amax tiny -> inf -> FLT_MAX
    scale = torch.where(amax > 0, scale, torch.ones_like(scale))
    q = (x.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    qt = q.t().contiguous()
    return q, qt, torch.reciprocal(scale)


def _pow2_floor(s):
    """Largest power of two <= s for positive normal fp32 s (= 2^floor(log2 s)), exactly."""
    return (s.view(torch.int32) & POW2_MASK).view(torch.float32)


def _block_scale_pow2(amax):
    """TE block scale from fp32 block amax: RN(448/amax) (inf -> bf16 max, amax 0 -> 1), pow2."""
    s = E4M3_MAX / amax
    s = torch.where(torch.isinf(s), torch.full_like(s, BF16_MAX), s)
    s = torch.where(amax > 0, s, torch.ones_like(s))
    return _pow2_floor(s)


def q_fp8_block(x):
    """FP8 E4M3 1x128 blocks, pow2 fp32 scales: rowwise along K, columnwise along M transposed."""
    m, k = x.shape
    xa = x.abs()
    # rowwise: blocks of 128 consecutive elements along K
    s_row = _block_scale_pow2(xa.view(m, k // 128, 128).amax(dim=-1).float())  # [M, K/128]
    xr = x.view(m, k // 128, 128) * s_row.unsqueeze(-1)  # bf16 * fp32 -> fp32
    q_row = xr.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(m, k)
    # columnwise: blocks of 128 consecutive elements along M, stored transposed [K, M]
    s_col = _block_scale_pow2(xa.view(m // 128, 128, k).amax(dim=1).float())  # [M/128, K]
    xc = x.view(m // 128, 128, k) * s_col.unsqueeze(1)
    q_col = xc.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(m, k)
    q_col_t = q_col.t().contiguous()
    return q_row, torch.reciprocal(s_row), q_col_t, torch.reciprocal(s_col)


def _e8m0_ceil(amax):
    """E8M0 scale of fp32 block amaxes (TE/cuBLAS 'RCEIL'): e - 127 = ceil(log2(amax/448)).

    Returns (e as uint8, fp32 multiplier 2^(127-e)). Computed on the bits of RN(amax*RN(1/448)),
    as TE does: exponent byte plus one if the mantissa is non-zero; amax 0 -> e = 0.
    """
    v = amax * (1.0 / E4M3_MAX)
    bits = v.view(torch.int32)
    exp = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    round_up = ((mant != 0) & (exp > 0) & (exp < 254)) | ((exp == 0) & (mant > 0x400000))
    e = torch.clamp(exp + round_up.to(torch.int32), max=254)
    # 2^(127-e): a normal fp32 for e <= 253, the subnormal 2^-127 for e = 254
    mult_bits = torch.where(e == 254, torch.full_like(e, 0x400000), (254 - e) << 23)
    return e.to(torch.uint8), mult_bits.view(torch.float32)


def _mx_rows(t):
    """MXFP8 E4M3 1x32 blocks along the rows of t [R, C]: codes [R, C], E8M0 scales [R, C/32]."""
    r, c = t.shape
    e, mult = _e8m0_ceil(t.abs().reshape(r, c // 32, 32).amax(dim=-1).float())
    q = (t.reshape(r, c // 32, 32) * mult.unsqueeze(-1)).to(torch.float8_e4m3fn).view(r, c)
    return q, e


def q_mxfp8(x):
    """MXFP8 E4M3: 1x32 rowwise blocks, and 32x1 columnwise blocks stored transposed (the
    rowwise blocks of x^T), E8M0 scales."""
    q_row, e_row = _mx_rows(x)                  # [M, K], [M, K/32]
    q_col, e_col = _mx_rows(x.t().contiguous())  # [K, M], [K, M/32]
    return q_row, e_row, q_col, e_col


def _e2m1_codes(v, ties_down, ties_up):
    """E2M1 codes (sign in bit 3) of fp32 v, round to nearest even, saturating at 6."""
    a = v.abs()
    mag = torch.bucketize(a, ties_down, out_int32=True) + torch.bucketize(
        a, ties_up, out_int32=True, right=True)
    return torch.where(torch.signbit(v), mag + 8, mag).to(torch.uint8)


def _nvfp4_quantize(t, ties_down, ties_up):
    """NVFP4 1x16 quantization of bf16 t [R, C] along its last dim (formats.md §2.6 order)."""
    r, c = t.shape
    tb = t.view(r, c // 16, 16)
    block_amax = tb.abs().amax(dim=-1).float()  # [R, C/16]
    amax = block_amax.amax()  # global amax A
    s_enc = torch.clamp(NVFP4_GLOBAL / amax, max=FP32_MAX)
    s_enc = torch.where((amax == 0) | (s_enc == 0), torch.ones_like(s_enc), s_enc)
    s_dec = torch.reciprocal(s_enc)
    k_mul = s_enc * (1.0 / 6.0)
    sd = torch.clamp(block_amax * k_mul, max=E4M3_MAX).to(torch.float8_e4m3fn)  # block scales
    mult = torch.clamp(torch.reciprocal(sd.float() * s_dec), max=FP32_MAX)  # sd 0 -> FLT_MAX
    codes = _e2m1_codes(tb * mult.unsqueeze(-1), ties_down, ties_up).view(r, c)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)  # even element in the low nibble
    return packed, sd, amax


def q_nvfp4_rht(x, rht, ties_down, ties_up):
    """NVFP4 rowwise, plus the columnwise copy: x^T, 16-point RHT along M, then NVFP4."""
    m, k = x.shape
    row = _nvfp4_quantize(x, ties_down, ties_up)
    xt = x.t().contiguous()  # [K, M]
    y = (xt.view(-1, 16) @ rht).view(k, m)  # bf16 matmul, fp32 accumulation, bf16 result
    col = _nvfp4_quantize(y, ties_down, ties_up)
    return row + col


RECIPE_FNS = {
    "copy": q_copy,
    "fp8_tensor": q_fp8_tensor,
    "fp8_block": q_fp8_block,
    "mxfp8": q_mxfp8,
    "nvfp4_rht": q_nvfp4_rht,
}


def rht_matrix(device):
    """H = diag(s) * H16 / 4 in bf16 (entries +-0.25): H16 Sylvester, s from RHT_SIGN_MASK."""
    h = torch.ones(1, 1, dtype=torch.float32)
    while h.shape[0] < 16:
        h = torch.cat([torch.cat([h, h], dim=1), torch.cat([h, -h], dim=1)], dim=0)
    signs = torch.tensor([-1.0 if (RHT_SIGN_MASK >> i) & 1 else 1.0 for i in range(16)])
    return (signs[:, None] * h * 0.25).to(device=device, dtype=torch.bfloat16)


class Constants:
    """Constant tensors the recipes need, on the benchmark device."""

    def __init__(self, device):
        self.rht = rht_matrix(device)
        self.ties_down = torch.tensor(E2M1_TIES_DOWN, dtype=torch.float32, device=device)
        self.ties_up = torch.tensor(E2M1_TIES_UP, dtype=torch.float32, device=device)

    def extra_args(self, recipe):
        if recipe == "nvfp4_rht":
            return (self.rht, self.ties_down, self.ties_up)
        return ()


# --------------------------------------------------------------------------------------------
# Numerical checks (small input): catch logic errors before the numbers are trusted.
# --------------------------------------------------------------------------------------------

def _fp8_close(deq, xf, scale_inv):
    """|deq - x| within E4M3 rounding: 2^-4 relative (normals), half a subnormal step absolute."""
    bound = xf.abs() * (2.0**-4 * (1 + 1e-3)) + scale_inv * 2.0**-9
    bad = (~((deq - xf).abs() <= bound)).sum().item()  # NaN counts as bad
    return None if bad == 0 else f"{bad} elements outside the E4M3 rounding bound"


def _block_max_ok(qf_blocks, dim):
    """Scaled block maxima of power-of-two recipes lie in [224, 448]."""
    bmax = qf_blocks.abs().amax(dim=dim)
    bad = (~((bmax >= 224) & (bmax <= 448))).sum().item()  # NaN counts as bad
    return None if bad == 0 else f"{bad} blocks with scaled max outside [224, 448]"


def _decode_nvfp4(packed, sd, amax):
    """NVFP4 data [R, C/2], block scales [R, C/16], global amax -> (dequantized fp32 [R, C],
    E2M1 values [R, C/16, 16])."""
    r = packed.shape[0]
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).view(r, -1).long()
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)
    val = lut[codes & 7] * (1.0 - 2.0 * (codes >= 8).float())
    c = val.shape[1]
    scale = sd.float() * amax / NVFP4_GLOBAL
    val = val.view(r, c // 16, 16)
    return (val * scale.unsqueeze(-1)).view(r, c), val


def _nvfp4_blocks_ok(val, sd):
    """The block maximum maps to E2M1 6 (up to E4M3 rounding of the block scale), and the block
    holding the global amax gets the largest E4M3 scale, 448."""
    frac = (val.abs().amax(dim=-1) == 6.0).float().mean().item()
    if frac < 0.99:
        return f"only {frac:.3f} of the blocks reach E2M1 6"
    sd_max = sd.float().max().item()
    return None if sd_max == 448.0 else f"largest block scale {sd_max}, expected 448"


def _rel_rms(a, ref):
    return (((a - ref) ** 2).mean() / (ref**2).mean()).sqrt().item()


def check_outputs(recipe, x, outs, consts):
    """Returns a list of problems (empty when the outputs look right)."""
    m, k = x.shape
    xf = x.float()
    problems = []

    def expect(cond, msg):
        if not cond:
            problems.append(msg)

    def add(msg):
        if msg:
            problems.append(msg)

    if recipe == "copy":
        expect(torch.equal(outs[0], x), "copy differs from its input")
    elif recipe == "fp8_tensor":
        q, qt, sinv = outs
        expect(q.dtype == torch.float8_e4m3fn and tuple(q.shape) == (m, k), "q dtype/shape")
        expect(tuple(qt.shape) == (k, m), "qt shape")
        expect(torch.equal(qt.view(torch.uint8), q.t().contiguous().view(torch.uint8)),
               "qt is not the transpose of q")
        add(_fp8_close(q.float() * sinv, xf, sinv))
        expect(abs(q.float().abs().max().item() - 448.0) <= 32.0, "tensor max not near 448")
    elif recipe == "fp8_block":
        q, s_row, qt, s_col = outs
        expect(tuple(q.shape) == (m, k) and tuple(qt.shape) == (k, m), "data shapes")
        expect(tuple(s_row.shape) == (m, k // 128) and tuple(s_col.shape) == (m // 128, k),
               "scale shapes")
        for s in (s_row, s_col):
            expect(((s.view(torch.int32) & 0x7FFFFF) == 0).all().item(), "scale not a power of 2")
        qr = q.float().view(m, k // 128, 128)
        add(_block_max_ok(qr, -1))
        add(_fp8_close((qr * s_row.unsqueeze(-1)).view(m, k), xf,
                       s_row.repeat_interleave(128, dim=1)))
        qc = qt.t().float().reshape(m // 128, 128, k)
        add(_block_max_ok(qc, 1))
        add(_fp8_close((qc * s_col.unsqueeze(1)).reshape(m, k), xf,
                       s_col.repeat_interleave(128, dim=0)))
    elif recipe == "mxfp8":
        q_row, e_row, q_col, e_col = outs
        expect(e_row.dtype == torch.uint8 and tuple(e_row.shape) == (m, k // 32), "e_row")
        expect(e_col.dtype == torch.uint8 and tuple(e_col.shape) == (k, m // 32), "e_col")
        expect(tuple(q_row.shape) == (m, k) and tuple(q_col.shape) == (k, m), "data shapes")
        sr = torch.exp2(e_row.float() - 127)
        sc = torch.exp2(e_col.float() - 127)
        qr = q_row.float().view(m, k // 32, 32)
        qc = q_col.float().view(k, m // 32, 32)
        add(_block_max_ok(qr, -1))
        add(_block_max_ok(qc, -1))
        add(_fp8_close((qr * sr.unsqueeze(-1)).view(m, k), xf, sr.repeat_interleave(32, dim=1)))
        add(_fp8_close((qc * sc.unsqueeze(-1)).view(k, m), xf.t(),
                       sc.repeat_interleave(32, dim=1)))
    elif recipe == "nvfp4_rht":
        p_row, sd_row, a_row, p_col, sd_col, a_col = outs
        expect(p_row.dtype == torch.uint8 and tuple(p_row.shape) == (m, k // 2), "rowwise data")
        expect(tuple(sd_row.shape) == (m, k // 16), "rowwise scales")
        expect(p_col.dtype == torch.uint8 and tuple(p_col.shape) == (k, m // 2), "columnwise data")
        expect(tuple(sd_col.shape) == (k, m // 16), "columnwise scales")
        expect(a_row.item() == xf.abs().max().item(), "rowwise amax")
        deq, val = _decode_nvfp4(p_row, sd_row, a_row)
        err = _rel_rms(deq, xf)
        expect(err < 0.15, f"rowwise relative RMS error {err:.3f} (expected ~0.1)")
        add(_nvfp4_blocks_ok(val, sd_row))
        y_ref = (x.t().float().reshape(-1, 16) @ consts.rht.float()).view(k, m)
        expect(abs(a_col.item() - y_ref.abs().max().item()) <= 2**-7 * a_col.item(),
               "columnwise (post-RHT) amax")
        deq, val = _decode_nvfp4(p_col, sd_col, a_col)
        err = _rel_rms(deq, y_ref)
        expect(err < 0.15, f"columnwise relative RMS error {err:.3f} (expected ~0.1)")
        add(_nvfp4_blocks_ok(val, sd_col))
        # H[i][j] = s_i * (-1)^popcount(i & j) / 4 with the sign vector of formats.md §5.2
        s = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)
        h_ref = [[0.25 * s[i] * (-1) ** bin(i & j).count("1") for j in range(16)]
                 for i in range(16)]
        expect(torch.equal(consts.rht.float(), torch.tensor(h_ref, device=x.device)),
               "RHT matrix")
        # E2M1 round to nearest even at and between the decision points
        v = torch.tensor(E2M1_PROBE, dtype=torch.float32, device=x.device)
        codes = _e2m1_codes(v, consts.ties_down, consts.ties_up)
        expect(codes.tolist() == list(E2M1_PROBE_CODES), "E2M1 rounding")
    return problems


def run_checks(recipes, device, consts, seed):
    """Eager numerical check of each recipe on a small input: {recipe: 'ok' | 'FAILED: ...'}."""
    m, k = CHECK_SHAPE
    x = make_input(m, k, device, seed)
    results = {}
    for recipe in recipes:
        try:
            extra = (torch.empty_like(x),) if recipe == "copy" else consts.extra_args(recipe)
            outs = RECIPE_FNS[recipe](x, *extra)
            problems = check_outputs(recipe, x, outs, consts)
            results[recipe] = "ok" if not problems else "FAILED: " + "; ".join(problems)
        except Exception as exc:  # noqa: BLE001 - report and go on
            results[recipe] = "FAILED: " + short_error(exc)
    return results


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------

def make_input(m, k, device, seed):
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return torch.randn((m, k), generator=gen, device=device, dtype=torch.bfloat16)


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


def time_calls(call, inputs, device, warmup, iters, cycles_per_ms):
    """Returns (median ms, min ms, wall seconds of the first call)."""
    n = len(inputs)
    t0 = time.perf_counter()
    call(inputs[0])  # compiles in compile mode
    sync(device)
    first_s = time.perf_counter() - t0

    host_times = []  # host time to enqueue one call
    for i in range(warmup):
        t = time.perf_counter()
        call(inputs[(i + 1) % n])
        host_times.append(time.perf_counter() - t)
    host_per_call = min(host_times, default=first_s)
    sync(device)

    if device.type == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        if cycles_per_ms:
            # Let the host queue every timed call before the GPU starts on them.
            sleep_ms = min(500.0, 1.5 * host_per_call * 1e3 * iters + 1.0)
            torch.cuda._sleep(int(sleep_ms * cycles_per_ms))
        for i in range(iters):
            starts[i].record()
            call(inputs[i % n])
            ends[i].record()
        sync(device)
        times = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    else:
        times = []
        for i in range(iters):
            t = time.perf_counter()
            call(inputs[i % n])
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times), min(times), first_s


def bitwise_match(ref, outs):
    """Fraction of equal bytes between two output tuples (0 if shapes or dtypes differ)."""
    if len(ref) != len(outs):
        return 0.0
    equal = total = 0
    for a, b in zip(ref, outs):
        if a.shape != b.shape or a.dtype != b.dtype:
            return 0.0
        au = a.reshape(-1).contiguous().view(torch.uint8)
        bu = b.reshape(-1).contiguous().view(torch.uint8)
        equal += (au == bu).sum().item()
        total += au.numel()
    return equal / total if total else 1.0


def bind(fn, extra):
    """fn(x, *extra) as a function of x alone."""
    return lambda x: fn(x, *extra)


def short_error(exc, limit=400):
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = f"{type(exc).__name__}: {' | '.join(lines[:3])}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def free_memory(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------

def parse_shapes(text):
    shapes = []
    for item in text.split(","):
        item = item.strip().lower()
        if not item:
            continue
        try:
            m, k = (int(v) for v in item.split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad shape {item!r}: expected MxK, e.g. 8192x8192")
        if m <= 0 or k <= 0 or m % 128 or k % 128:
            raise argparse.ArgumentTypeError(f"shape {item!r}: M and K must be multiples of 128")
        shapes.append((m, k))
    if not shapes:
        raise argparse.ArgumentTypeError("no shapes given")
    return shapes


def parse_list(allowed):
    def parse(text):
        items = [v.strip() for v in text.split(",") if v.strip()]
        bad = [v for v in items if v not in allowed]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"choose from {','.join(allowed)}")
        return items
    return parse


def build_parser():
    p = argparse.ArgumentParser(
        description="PyTorch peer of the lowbit quantization benchmark (eager and torch.compile).")
    p.add_argument("--shapes", type=parse_shapes, default=None,
                   help=f"comma-separated MxK list (default {DEFAULT_SHAPES})")
    p.add_argument("--recipes", type=parse_list(RECIPES), default=list(RECIPES),
                   help=f"comma-separated subset of {','.join(RECIPES)}")
    p.add_argument("--modes", type=parse_list(MODES), default=list(MODES),
                   help="comma-separated subset of eager,compile")
    p.add_argument("--compile-mode", default="default",
                   help="torch.compile mode (default: 'default'; e.g. max-autotune-no-cudagraphs)")
    p.add_argument("--iters", type=int, default=None, help="timed calls (default 30, --quick 10)")
    p.add_argument("--warmup", type=int, default=None,
                   help="warm-up calls after the first (compiling) call (default 3)")
    p.add_argument("--quick", action="store_true",
                   help=f"shapes {QUICK_SHAPES} and fewer iterations")
    p.add_argument("--smoke", action="store_true",
                   help=f"logic smoke test: shapes {SMOKE_SHAPES}, 3 iterations, checks on")
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--out", default=None,
                   help="write JSON lines here ('-': to stdout, the table then goes to stderr)")
    p.add_argument("--launch-overhead", choices=("hide", "include"), default="hide",
                   help="hide (default): queue the timed calls behind a GPU sleep so events "
                        "measure device time; include: time calls as they are launched")
    p.add_argument("--check", dest="check", action="store_true", default=True,
                   help="numerical check of each recipe on a small input first (default)")
    p.add_argument("--no-check", dest="check", action="store_false",
                   help="skip the numerical check")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    if torch is None:
        print("error: PyTorch is not installed", file=sys.stderr)
        return 2

    if args.shapes is None:
        args.shapes = parse_shapes(
            SMOKE_SHAPES if args.smoke else QUICK_SHAPES if args.quick else DEFAULT_SHAPES)
    iters = args.iters or (3 if args.smoke else 10 if args.quick else 30)
    warmup = args.warmup if args.warmup is not None else (1 if args.smoke else 3)
    if args.smoke:
        args.check = True
    modes = [mode for mode in MODES if mode in args.modes]  # eager first: compile compares to it
    recipes = [r for r in RECIPES if r in args.recipes]  # copy first: the others relate to it

    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print("error: CUDA is not available (use --device cpu for a smoke test)",
                  file=sys.stderr)
            return 2
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
        device_name = torch.cuda.get_device_name(device)
    else:
        device_name = platform.processor() or platform.machine() or "cpu"

    # One compilation per (function, shape); never fall back to dynamic shapes.
    for name, value in (("cache_size_limit", 256), ("recompile_limit", 256),
                        ("accumulated_cache_size_limit", 4096),
                        ("accumulated_recompile_limit", 4096)):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, value)
    # fp32 accumulation in the RHT matmul, as TE does.
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False

    try:
        import triton  # noqa: F401
        triton_version = triton.__version__
    except Exception:  # noqa: BLE001
        triton_version = None
    meta = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton_version,
        "python": platform.python_version(),
        "device": device_name,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }

    json_file = None
    table = sys.stdout
    if args.out == "-":
        json_file, table = sys.stdout, sys.stderr
    elif args.out:
        json_file = open(args.out, "w", encoding="utf-8")

    def say(text=""):
        print(text, file=table, flush=True)

    cycles_per_ms = (sleep_cycles_per_ms(device)
                     if args.launch_overhead == "hide" else None)
    timing = "queued" if cycles_per_ms else "per-call"
    compile_mode = args.compile_mode
    say(f"quant peer: torch {meta['torch']} (CUDA {meta['cuda']}, triton {triton_version}), "
        f"{device_name}")
    say(f"iters {iters} (median), warmup {warmup}, timing {timing}, inputs < 100 MiB rotated x2; "
        f"compile: torch.compile(mode={compile_mode!r}, dynamic=False, fullgraph=True)"
        + (" -- 'default' keeps compile time short; try --compile-mode "
           "max-autotune-no-cudagraphs" if compile_mode == "default" else ""))

    consts = Constants(device)
    check = {}
    if args.check:
        check = run_checks(recipes, device, consts, args.seed)
        for recipe in recipes:
            say(f"check {recipe:<11} {check[recipe]}")
        free_memory(device)

    header = (f"{'shape':<12}{'recipe':<12}{'mode':<9}{'ms':>9}{'GB/s':>9}{'x copy':>8}"
              f"  {'compile_s':>9}  {'match':>8}  note")
    say()
    say(header)
    say("-" * len(header))

    t_start = time.perf_counter()
    n_errors = 0
    for m, k in args.shapes:
        shape = f"{m}x{k}"
        inputs, input_error = [], None
        try:
            n_inputs = 2 if m * k * 2 < ROTATE_BELOW_BYTES else 1
            inputs = [make_input(m, k, device, args.seed + i) for i in range(n_inputs)]
        except Exception as exc:  # noqa: BLE001
            input_error = "input: " + short_error(exc)
        copy_gbps = {}
        eager_ref = {}
        for mode in modes:
            if mode == "compile":
                torch._dynamo.reset()
            for recipe in recipes:
                rec = {
                    "bench": "quant", "peer": "torch", "shape": shape, "M": m, "K": k,
                    "recipe": recipe, "mode": mode,
                    "compile_mode": compile_mode if mode == "compile" else None,
                    "ms": None, "ms_min": None, "gbps": None,
                    "bytes": payload_bytes(recipe, m, k), "ratio_copy": None,
                    "iters": iters, "warmup": warmup, "inputs": len(inputs), "timing": timing,
                    "compile_s": None, "match_eager": None,
                    "check": check.get(recipe), "error": input_error,
                    **meta,
                }
                if input_error is None:
                    try:
                        fn = RECIPE_FNS[recipe]
                        if mode == "compile":
                            fn = torch.compile(fn, mode=compile_mode, dynamic=False,
                                               fullgraph=True)
                        extra = consts.extra_args(recipe)
                        if recipe == "copy":
                            extra = (torch.empty_like(inputs[0]),)
                        call = bind(fn, extra)
                        ms, ms_min, first_s = time_calls(call, inputs, device, warmup, iters,
                                                         cycles_per_ms)
                        gbps = rec["bytes"] / (ms * 1e-3) / 1e9
                        rec.update(ms=round(ms, 5), ms_min=round(ms_min, 5),
                                   gbps=round(gbps, 2))
                        if recipe == "copy":
                            copy_gbps[mode] = gbps
                        ref_gbps = copy_gbps.get("eager") or copy_gbps.get(mode)
                        if ref_gbps:
                            rec["ratio_copy"] = round(gbps / ref_gbps, 4)
                        if mode == "compile":
                            rec["compile_s"] = round(first_s, 2)
                        outs = call(inputs[0])
                        if mode == "eager":
                            eager_ref[recipe] = tuple(o.clone() for o in outs)
                        elif recipe in eager_ref:
                            rec["match_eager"] = round(bitwise_match(eager_ref[recipe], outs), 6)
                        del outs
                    except Exception as exc:  # noqa: BLE001 - record, go on with the next case
                        rec["error"] = short_error(exc)
                        tb = traceback.format_exc()
                        print(f"[{shape} {recipe} {mode}] " + tb[-3000:], file=sys.stderr)
                        if mode == "compile":
                            torch._dynamo.reset()
                        free_memory(device)
                if rec["error"]:
                    n_errors += 1
                say(format_row(rec))
                if json_file is not None:
                    json_file.write(json.dumps(rec) + "\n")
                    json_file.flush()
        del inputs, eager_ref
        torch._dynamo.reset()
        free_memory(device)

    say(f"\n{len(args.shapes)} shape(s), {n_errors} failed case(s), "
        f"{time.perf_counter() - t_start:.1f} s")
    if json_file is not None and json_file is not sys.stdout:
        json_file.close()
    return 0


def format_row(rec):
    def num(v, width, fmt):
        return format(v, f"{width}{fmt}") if v is not None else "-".rjust(width)
    note = []
    if rec["error"]:
        note.append("ERROR " + rec["error"])
    if rec["check"] and rec["check"] != "ok":
        note.append("check failed")
    if rec["match_eager"] is not None and rec["match_eager"] < 1.0:
        note.append("differs from eager")
    return (f"{rec['shape']:<12}{rec['recipe']:<12}{rec['mode']:<9}"
            f"{num(rec['ms'], 9, '.4f')}{num(rec['gbps'], 9, '.0f')}"
            f"{num(rec['ratio_copy'], 8, '.2f')}  {num(rec['compile_s'], 9, '.1f')}"
            f"  {num(rec['match_eager'], 8, '.6f')}  {'; '.join(note)}")


if __name__ == "__main__":
    sys.exit(main())
