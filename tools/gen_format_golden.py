#!/usr/bin/env python3
"""Writes the ml_dtypes golden files for the scalar codecs (tests/data/golden/).

ml_dtypes is an independent implementation of the same formats (formats.md §1, tag [MLD]);
tests/formats/test_golden_ml_dtypes.cpp compares include/lowbit/formats.h against these files
bit for bit and names every place where the two are meant to differ.

Usage:  pip install ml_dtypes==0.6.0 numpy
        python3 tools/gen_format_golden.py [--out tests/data/golden]

Output is deterministic (no random inputs); rerunning with the same ml_dtypes version rewrites
identical bytes.

File layout (all integers little-endian; version 1; header is 96 bytes):

  offset  size  field
       0     8  magic, the ASCII bytes "LBGOLD01"
       8     4  u32 version = 1
      12     4  u32 header_bytes = 96 (payload starts here)
      16    16  dtype: our short name ("e4m3", "e5m2", "e3m2", "e2m3", "e2m1", "e8m0"), NUL-padded
      32    16  kind, NUL-padded:
                  "decode"      code -> value: inputs implicit (code i for i in [0, count)),
                                outputs are fp32 bit patterns (u32)
                  "encode_bf16" every bf16 bit pattern -> code: count = 65536, inputs implicit
                                (fp32 bits = i << 16), outputs are codes (u8)
                  "encode_f32"  listed fp32 inputs -> code: inputs are fp32 bit patterns (u32),
                                outputs are codes (u8)
      48    32  oracle, NUL-padded: "ml_dtypes-<version>:<numpy type>"; encode outputs come from
                numpy astype, i.e. ml_dtypes' default (non-saturating) conversion
      80     8  u64 count (number of vectors)
      88     4  u32 input_elem_bytes  (0 = implicit inputs, 4 = fp32 bits)
      92     4  u32 output_elem_bytes (1 = code, 4 = fp32 bits)
      96        inputs[count]  (input_elem_bytes each; absent when 0)
                outputs[count] (output_elem_bytes each)
  file size = 96 + count * (input_elem_bytes + output_elem_bytes)

FP6 codes sit in the low 6 bits of their byte, E2M1 codes in the low 4 bits.

ml_dtypes exposes no saturating conversion to Python (its C++ ConvertFrom<kSaturate=true> is not
bound), so only the default astype behaviour is recorded.
"""

import argparse
import os
import struct
import sys

import ml_dtypes
import numpy as np

MAGIC = b"LBGOLD01"
VERSION = 1
HEADER_BYTES = 96
ML_DTYPES_VERSION = "0.6.0"

# our name -> (ml_dtypes type, number of codes)
FORMATS = {
    "e4m3": (ml_dtypes.float8_e4m3fn, 256),
    "e5m2": (ml_dtypes.float8_e5m2, 256),
    "e3m2": (ml_dtypes.float6_e3m2fn, 64),
    "e2m3": (ml_dtypes.float6_e2m3fn, 64),
    "e2m1": (ml_dtypes.float4_e2m1fn, 16),
    "e8m0": (ml_dtypes.float8_e8m0fnu, 256),
}

F32_MAX_BITS = 0x7F7FFFFF
F32_INF_BITS = 0x7F800000
SIGN = 0x80000000

# Distances (in fp32 ulps) probed on each side of every boundary: dense close in, then sparse
# out to a large fraction of a binade.
ULP_STEPS = list(range(1, 5)) + [1 << k for k in range(3, 21)]

# fp32 patterns that every sweep contains, besides the per-format boundaries.
SPECIAL_BITS = [
    0x00000000,  # +0
    0x7F800000,  # +inf
    0x7FC00000,  # quiet NaN
    0x7F800001,  # signalling NaN, lowest payload
    0x7FA00000,  # signalling NaN
    0x7FFFFFFF,  # NaN, all payload bits
    0x00000001,  # fp32 subnormals
    0x00000002,
    0x00200000,
    0x00300000,
    0x00400000,
    0x00400001,
    0x005FFFFF,
    0x00600000,
    0x007FFFFF,
    0x00800000,  # smallest fp32 normal
    0x7F7FFFFF,  # largest fp32
]

# Decimal values quoted in formats.md (E8M0 rounding examples, overflow examples).
SPECIAL_VALUES = [1.4, 1.5, 3.0, 5.0, 0.75, 0.25, 1.25, 1.75, 2.5, 3.5, 464.01, 1e6, 61440.0]


def f32_bits(values):
    return np.asarray(values, dtype=np.float32).view(np.uint32)


def neighbourhood(center_bits):
    """center_bits (positive finite fp32 patterns) and their ±ULP_STEPS neighbours."""
    c = np.asarray(center_bits, dtype=np.int64)
    out = [c]
    for d in ULP_STEPS:
        out.append(c + d)
        out.append(c - d)
    b = np.concatenate(out)
    b = b[(b >= 0) & (b <= F32_MAX_BITS)]
    return b.astype(np.uint32)


def decode_table(ml_type, n_codes):
    codes = np.arange(n_codes, dtype=np.uint8)
    return codes.view(ml_type).astype(np.float32).view(np.uint32)


def boundary_points(name, ml_type, n_codes):
    """Positive fp32 patterns at the representable values and the rounding boundaries."""
    values = decode_table(ml_type, n_codes).view(np.float32).astype(np.float64)
    mags = np.unique(np.abs(values[np.isfinite(values)]))  # sorted, includes 0
    points = list(mags)
    points += list((mags[:-1] + mags[1:]) / 2)  # round-to-nearest decision points
    if name == "e8m0":
        # Every power of two fp32 can hold (ceil/floor boundaries) and 1.5 * 2^e (nearest).
        exps = np.arange(-149, 128, dtype=np.float64)
        points += list(np.exp2(exps))
        points += list(1.5 * np.exp2(exps[(exps >= -148) & (exps < 127)]))
        points.append(1.5 * 2.0**127)  # overflow threshold of nearest rounding
    else:
        top, below = mags[-1], mags[-2]
        points.append(top + (top - below) / 2)  # overflow threshold (tie with the next step)
        points.append(top + (top - below))  # first value past it
    points = np.array(points, dtype=np.float64)
    points = points[points < 3.4028234663852886e38]
    as_f32 = points.astype(np.float32)
    assert np.all(as_f32.astype(np.float64) == points), f"{name}: boundary not exact in fp32"
    return f32_bits(as_f32)


def sweep_inputs(name, ml_type, n_codes):
    centres = boundary_points(name, ml_type, n_codes)
    pos = np.concatenate(
        [neighbourhood(centres), np.array(SPECIAL_BITS, dtype=np.uint32), f32_bits(SPECIAL_VALUES)]
    )
    pos = np.unique(pos)
    return np.unique(np.concatenate([pos, pos | np.uint32(SIGN)]))


def encode(ml_type, in_bits):
    with np.errstate(invalid="ignore", over="ignore"):
        return np.asarray(in_bits, dtype=np.uint32).view(np.float32).astype(ml_type).view(np.uint8)


def pad(text, size):
    raw = text.encode("ascii")
    assert len(raw) < size, f"{text!r} does not fit in {size} bytes"
    return raw + b"\0" * (size - len(raw))


def write_file(path, dtype, kind, oracle, inputs, outputs):
    count = len(outputs)
    in_bytes = 0 if inputs is None else inputs.dtype.itemsize
    header = MAGIC + struct.pack("<II", VERSION, HEADER_BYTES)
    header += pad(dtype, 16) + pad(kind, 16) + pad(oracle, 32)
    header += struct.pack("<QII", count, in_bytes, outputs.dtype.itemsize)
    assert len(header) == HEADER_BYTES
    with open(path, "wb") as f:
        f.write(header)
        if inputs is not None:
            f.write(inputs.astype(inputs.dtype.newbyteorder("<")).tobytes())
        f.write(outputs.astype(outputs.dtype.newbyteorder("<")).tobytes())
    return os.path.getsize(path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default_out = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "golden")
    parser.add_argument("--out", default=os.path.normpath(default_out))
    args = parser.parse_args()
    if ml_dtypes.__version__ != ML_DTYPES_VERSION:
        sys.exit(
            f"ml_dtypes {ml_dtypes.__version__} is installed; the golden files are defined by "
            f"{ML_DTYPES_VERSION}: pip install ml_dtypes=={ML_DTYPES_VERSION}"
        )
    os.makedirs(args.out, exist_ok=True)

    bf16_all = np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)
    total = 0
    for name, (ml_type, n_codes) in FORMATS.items():
        oracle = f"ml_dtypes-{ml_dtypes.__version__}:{ml_type.__name__}"
        files = [
            ("decode", None, decode_table(ml_type, n_codes)),
            ("encode_bf16", None, encode(ml_type, bf16_all)),
        ]
        sweep = sweep_inputs(name, ml_type, n_codes)
        files.append(("encode_f32", sweep, encode(ml_type, sweep)))
        for kind, inputs, outputs in files:
            path = os.path.join(args.out, f"{name}_{kind}.bin")
            size = write_file(path, name, kind, oracle, inputs, outputs)
            total += size
            print(f"{path}: {len(outputs)} vectors, {size} bytes")
    print(f"total {total} bytes")


if __name__ == "__main__":
    main()
