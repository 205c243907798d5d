// FP8 per-tensor current scaling and FP8 block scaling (1×128, 128×128): formats.md §2.0,
// §2.3, §2.4.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "lowbit/quant/layout.h"
#include "quant/quant_test_util.h"

namespace lowbit {
namespace {

using namespace quant_test;

uint32_t e4m3(float v) { return encode_rn(DType::kE4M3, v); }

// --- current scaling --------------------------------------------------------------------------

TEST(QuantFp8Current, HandComputedCodes) {
  // amax = 448 → scale = 1: the codes are the plain e4m3 encodings.
  const Tensor x = bf16_from(
      1, 16, {1, -2, 448, 0.001f, 3, 0, -0.0f, 300, 0.5f, -448, 6, 7, 100, -100, 0.0625f, 1.125f});
  const QuantizedTensor q = run(x, QuantConfig::fp8_current(DType::kE4M3));
  EXPECT_EQ(q.rowwise_scale_inv.ptr<float>()[0], 1.0f);
  EXPECT_EQ(q.amax.ptr<float>()[0], 448.0f);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(code_at(q.rowwise_data, j), e4m3(value_at(x, 0, j))) << j;
  }
  EXPECT_EQ(code_at(q.rowwise_data, 2), 0x7Eu);
  EXPECT_EQ(code_at(q.rowwise_data, 6), 0x80u);  // -0 keeps its sign
  // E5M2: scale = RN(57344 / 448) = 128 exactly; code of 1 · 128 = 2^7 → exponent 22, 0x58.
  const QuantizedTensor q5 = run(x, QuantConfig::fp8_current(DType::kE5M2));
  EXPECT_EQ(q5.rowwise_scale_inv.ptr<float>()[0], 1.0f / 128);
  EXPECT_EQ(code_at(q5.rowwise_data, 0), 0x58u);
  EXPECT_EQ(code_at(q5.rowwise_data, 2), 0x7Bu);  // 448 · 128 = 57344 = max
}

TEST(QuantFp8Current, ScaleRulesAndPow2) {
  // amax 3: scale RN(448/3), scale_inv RN(1/scale); pow2 → 128, scale_inv 2^-7.
  const Tensor x = bf16_from(1, 4, {1, -3, 2, 0.5f});
  QuantizedTensor q = run(x, QuantConfig::fp8_current(DType::kE4M3));
  const float s = 448.0f / 3.0f;
  EXPECT_EQ(q.rowwise_scale_inv.ptr<float>()[0], 1.0f / s);
  EXPECT_EQ(code_at(q.rowwise_data, 1), e4m3(-3.0f * s));
  EXPECT_EQ(code_at(q.rowwise_data, 1), 0xFEu);  // -448 (RN(-3 · s) rounds to 448's code)
  q = run(x, QuantConfig::fp8_current(DType::kE4M3, /*pow2=*/true));
  EXPECT_EQ(q.rowwise_scale_inv.ptr<float>()[0], 1.0f / 128);
  EXPECT_EQ(code_at(q.rowwise_data, 1), e4m3(-384.0f));
  // amax epsilon: an all-zero tensor with eps 0.5 gets scale 896.
  QuantConfig cfg = QuantConfig::fp8_current();
  cfg.amax_epsilon = 0.5f;
  q = run(bf16_from(1, 4, {0, 0, 0, 0}), cfg);
  EXPECT_EQ(q.rowwise_scale_inv.ptr<float>()[0], 1.0f / 896);
}

TEST(QuantFp8Current, ZerosInfNanSubnormals) {
  // All zeros: amax 0 → scale 1, codes 0.
  QuantizedTensor q = run(make_bf16(65, 80, fill_fn(Fill::kZeros, 1)), QuantConfig::fp8_current());
  EXPECT_EQ(q.rowwise_scale_inv.ptr<float>()[0], 1.0f);
  EXPECT_EQ(q.amax.ptr<float>()[0], 0.0f);
  for (int64_t i = 0; i < 65 * 80; ++i) ASSERT_EQ(code_at(q.rowwise_data, i), 0u);
  // NaN is ignored by the amax: [NaN, 2] → amax 2, scale 224; NaN → 0x7F.
  q = run(bf16_from(1, 2, {kNaN, 2}), QuantConfig::fp8_current());
  EXPECT_EQ(q.amax.ptr<float>()[0], 2.0f);
  EXPECT_EQ(q.rowwise_scale_inv.ptr<float>()[0], 1.0f / 224);
  EXPECT_EQ(code_at(q.rowwise_data, 0), 0x7Fu);
  EXPECT_EQ(code_at(q.rowwise_data, 1), 0x7Eu);
  // An inf makes the amax inf → scale 1; inf saturates to ±448, finite values cast unscaled.
  q = run(bf16_from(1, 3, {kInf, -kInf, 3}), QuantConfig::fp8_current());
  EXPECT_EQ(q.rowwise_scale_inv.ptr<float>()[0], 1.0f);
  EXPECT_EQ(code_at(q.rowwise_data, 0), 0x7Eu);
  EXPECT_EQ(code_at(q.rowwise_data, 1), 0xFEu);
  EXPECT_EQ(code_at(q.rowwise_data, 2), e4m3(3));
  // Subnormal bf16 inputs: 448 / amax overflows → FLT_MAX (current scaling); pow2 → 2^127.
  const Tensor sub = make_bf16(65, 80, fill_fn(Fill::kSubnormal, 2));
  q = run(sub, QuantConfig::fp8_current());
  EXPECT_EQ(q.rowwise_scale_inv.ptr<float>()[0], 1.0f / std::numeric_limits<float>::max());
  check_round_trip(q, Usage::kRowwise, source_f32(sub, false));
  q = run(sub, QuantConfig::fp8_current(DType::kE4M3, true));
  EXPECT_EQ(q.rowwise_scale_inv.ptr<float>()[0], pow2f(-127));
  check_round_trip(q, Usage::kRowwise, source_f32(sub, false));
}

TEST(QuantFp8Current, ColumnwiseIsExactTranspose) {
  const Tensor x = make_bf16(65, 80, fill_fn(Fill::kGaussian, 3));
  const QuantizedTensor q = run(x, QuantConfig::fp8_current(DType::kE5M2));
  ASSERT_EQ(q.columnwise_data.shape(), (Shape{80, 65}));
  for (int64_t i = 0; i < 65; ++i) {
    for (int64_t j = 0; j < 80; ++j) {
      ASSERT_EQ(code_at(q.columnwise_data, j * 65 + i), code_at(q.rowwise_data, i * 80 + j));
    }
  }
  EXPECT_EQ(q.columnwise_scale_inv.ptr<float>()[0], q.rowwise_scale_inv.ptr<float>()[0]);
}

TEST(QuantFp8Current, RoundTripBounds) {
  const int64_t shapes[][2] = {{1, 16}, {65, 80}, {993, 512}};
  for (auto [m, k] : shapes) {
    for (Fill fill : {Fill::kGaussian, Fill::kHeavyTailed, Fill::kSpecials, Fill::kNearMax}) {
      for (DType t : {DType::kE4M3, DType::kE5M2}) {
        for (bool pow2 : {false, true}) {
          const Tensor x = make_bf16(m, k, fill_fn(fill, m * 7 + k, 448));
          const QuantizedTensor q = run(x, QuantConfig::fp8_current(t, pow2));
          const RoundTripStats st = check_round_trip(q, Usage::kRowwise, source_f32(x, false));
          check_round_trip(q, Usage::kColumnwise, source_f32(x, true));
          EXPECT_GT(st.checked, 0);
          EXPECT_LE(st.max_rel_normal, std::ldexp(1.0, -(minifloat_spec(t).mbits + 1)) * 1.0001);
        }
      }
    }
  }
}

TEST(QuantFp8Current, F32InputAndStrides) {
  // f32 input, and a transposed (strided) view of it, quantize like their contiguous copies.
  const Tensor xf = make_f32(48, 40, fill_fn(Fill::kGaussian, 4));
  const QuantizedTensor q = run(xf, QuantConfig::fp8_current());
  const TensorView xt(xf.data(), DType::kF32, {40, 48}, {1, 40}, Device::cpu());
  const QuantizedTensor qt = run(xt, QuantConfig::fp8_current());
  for (int64_t i = 0; i < 48; ++i) {
    for (int64_t j = 0; j < 40; ++j) {
      ASSERT_EQ(code_at(qt.rowwise_data, j * 48 + i), code_at(q.rowwise_data, i * 40 + j));
    }
  }
}

TEST(QuantFp8Current, RoundedF32SourceEqualsItsBf16Copy) {
  // round_source_to_bf16: an f32 source quantizes like its bf16 rounding, in every mode (the test
  // data leaves the bf16 grid, so the f32 values themselves quantize differently).
  const Tensor xf = make_f32(64, 128, [](int64_t i, int64_t j) {
    return float(std::sin(0.37 * double(i * 128 + j)) * 3.0 * (1.0 + 1e-3 * double(j)));
  });
  const Tensor xb =
      make_bf16(64, 128, [&](int64_t i, int64_t j) { return xf.ptr<float>()[i * 128 + j]; });
  const QuantConfig cfgs[] = {QuantConfig::fp8_current(), QuantConfig::fp8_block_128x128(),
                              QuantConfig::fp8_block_1x128(), QuantConfig::mx(),
                              QuantConfig::nvfp4_weight()};
  for (QuantConfig cfg : cfgs) {
    SCOPED_TRACE(scaling_mode_name(cfg.mode));
    const QuantizedTensor want = run(xb, cfg);
    const QuantizedTensor plain = run(xf, cfg);
    cfg.round_source_to_bf16 = true;
    const QuantizedTensor got = run(xf, cfg);
    ASSERT_EQ(got.rowwise_data.nbytes(), want.rowwise_data.nbytes());
    EXPECT_EQ(0, std::memcmp(got.rowwise_data.data(), want.rowwise_data.data(),
                             static_cast<size_t>(want.rowwise_data.nbytes())));
    EXPECT_EQ(0, std::memcmp(got.rowwise_scale_inv.data(), want.rowwise_scale_inv.data(),
                             static_cast<size_t>(want.rowwise_scale_inv.nbytes())));
    // Per tensor, the scale follows the amax, which the rounding moves.
    if (cfg.mode == ScalingMode::kPerTensor) {
      EXPECT_NE(plain.rowwise_scale_inv.ptr<float>()[0], want.rowwise_scale_inv.ptr<float>()[0]);
    }
  }
}

// --- block scaling ----------------------------------------------------------------------------

TEST(QuantFp8Block, HandComputed1x128) {
  // [2, 130]: row 0 = 448 at j=0, 1 at j=129; row 1 = 3 at j=5.
  const Tensor x = make_bf16(2, 130, [](int64_t i, int64_t j) {
    if (i == 0 && j == 0) return 448.0f;
    if (i == 0 && j == 129) return 1.0f;
    if (i == 1 && j == 5) return 3.0f;
    return 0.0f;
  });
  const QuantizedTensor q = run(x, QuantConfig::fp8_block_1x128());
  // VEC128 rowwise scales [ceil(130/128), pad4(2)] = [2, 4]: (r, kb) at kb · 4 + r.
  ASSERT_EQ(q.rowwise_scale_inv.shape(), (Shape{2, 4}));
  const float* s = q.rowwise_scale_inv.ptr<float>();
  EXPECT_EQ(s[0 * 4 + 0], 1.0f);        // amax 448 → scale 1
  EXPECT_EQ(s[0 * 4 + 1], 1.0f / 128);  // amax 3 → RN(448/3) = 149.3 → pow2 128
  EXPECT_EQ(s[1 * 4 + 0], 1.0f / 256);  // amax 1 (partial block of 2) → 448 → 256
  EXPECT_EQ(s[1 * 4 + 1], 1.0f);        // all-zero partial block → scale 1
  EXPECT_EQ(s[2], 0.0f);                // padding rows are zero
  EXPECT_EQ(s[7], 0.0f);
  EXPECT_EQ(code_at(q.rowwise_data, 129), e4m3(256));
  EXPECT_EQ(code_at(q.rowwise_data, 130 + 5), e4m3(384));
  // Columnwise: data [130, 2] (transposed), blocks along M (2 rows, one partial block), scales
  // [ceil(2/128), pad4(130)] = [1, 132]: column j of x → entry j.
  ASSERT_EQ(q.columnwise_data.shape(), (Shape{130, 2}));
  ASSERT_EQ(q.columnwise_scale_inv.shape(), (Shape{1, 132}));
  const float* st = q.columnwise_scale_inv.ptr<float>();
  EXPECT_EQ(st[0], 1.0f);          // column 0: amax 448
  EXPECT_EQ(st[5], 1.0f / 128);    // column 5: amax 3
  EXPECT_EQ(st[129], 1.0f / 256);  // column 129: amax 1
  EXPECT_EQ(st[1], 1.0f);          // zero column
  EXPECT_EQ(st[130], 0.0f);        // padding
  EXPECT_EQ(code_at(q.columnwise_data, 5 * 2 + 1), e4m3(384));
}

TEST(QuantFp8Block, ColumnwiseEqualsRowwiseOfTranspose) {
  // The 1×128 columnwise copy is quantized from the source along M: it must equal the rowwise
  // quantization of x^T, scales included (same VEC128 layout with the roles swapped).
  const Tensor x = make_bf16(300, 200, fill_fn(Fill::kHeavyTailed, 5));
  const QuantizedTensor q = run(x, QuantConfig::fp8_block_1x128());
  const TensorView xt(x.data(), DType::kBF16, {200, 300}, {1, 200}, Device::cpu());
  QuantConfig row_only = QuantConfig::fp8_block_1x128();
  row_only.columnwise = false;
  const QuantizedTensor qt = run(xt, row_only);
  ASSERT_EQ(q.columnwise_data.shape(), qt.rowwise_data.shape());
  ASSERT_EQ(q.columnwise_scale_inv.shape(), qt.rowwise_scale_inv.shape());
  for (int64_t i = 0; i < 200 * 300; ++i) {
    ASSERT_EQ(code_at(q.columnwise_data, i), code_at(qt.rowwise_data, i));
  }
  for (int64_t i = 0; i < qt.rowwise_scale_inv.numel(); ++i) {
    ASSERT_EQ(q.columnwise_scale_inv.ptr<float>()[i], qt.rowwise_scale_inv.ptr<float>()[i]);
  }
}

TEST(QuantFp8Block, ValueForInfIsInputMax) {
  // A subnormal block amax overflows RN(448/amax): the scale becomes the max finite of the
  // input dtype (bf16 0x7F7F0000, f32 FLT_MAX) — visible without pow2.
  const float tiny = pow2f(-130);
  QuantConfig cfg = QuantConfig::fp8_block_1x128();
  cfg.pow2_scales = false;
  cfg.columnwise = false;
  QuantizedTensor q = run(make_bf16(1, 16, [&](int64_t, int64_t) { return tiny; }), cfg);
  EXPECT_EQ(q.rowwise_scale_inv.ptr<float>()[0], 1.0f / f32_from_bits(0x7F7F0000u));
  q = run(make_f32(1, 16, [&](int64_t, int64_t) { return tiny; }), cfg);
  EXPECT_EQ(q.rowwise_scale_inv.ptr<float>()[0], 1.0f / std::numeric_limits<float>::max());
  // Default pow2: both become 2^127, scale_inv 2^-127.
  q = run(make_bf16(1, 16, [&](int64_t, int64_t) { return tiny; }), QuantConfig::fp8_block_1x128());
  EXPECT_EQ(q.rowwise_scale_inv.ptr<float>()[0], pow2f(-127));
  EXPECT_EQ(code_at(q.rowwise_data, 0), e4m3(tiny * pow2f(127)));
}

TEST(QuantFp8Block, Tiles128x128) {
  // [200, 300] → 2 × 3 tiles; BLK128 scales [2, pad4(3)] = [2, 4], transposed [3, pad4(2)].
  const Tensor x = make_bf16(200, 300, [](int64_t i, int64_t j) {
    return static_cast<float>((i / 128) * 3 + (j / 128) + 1) * ((i + j) % 2 ? 1.0f : -0.5f);
  });
  const QuantizedTensor q = run(x, QuantConfig::fp8_block_128x128());
  ASSERT_EQ(q.rowwise_scale_inv.shape(), (Shape{2, 4}));
  ASSERT_EQ(q.columnwise_scale_inv.shape(), (Shape{3, 4}));
  for (int rb = 0; rb < 2; ++rb) {
    for (int kb = 0; kb < 3; ++kb) {
      const float amax = static_cast<float>(rb * 3 + kb + 1);
      const float s = compute_scale_from_amax(amax, 448, true, 0, f32_from_bits(0x7F7F0000u));
      EXPECT_EQ(q.rowwise_scale_inv.ptr<float>()[blk128_scale_index(rb, kb, 3)], 1.0f / s);
      EXPECT_EQ(q.columnwise_scale_inv.ptr<float>()[blk128_scale_index(kb, rb, 2)], 1.0f / s);
    }
  }
  EXPECT_EQ(q.rowwise_scale_inv.ptr<float>()[3], 0.0f);  // padding
  // The columnwise copy is the exact transpose.
  for (int64_t i = 0; i < 200; ++i) {
    for (int64_t j = 0; j < 300; ++j) {
      ASSERT_EQ(code_at(q.columnwise_data, j * 200 + i), code_at(q.rowwise_data, i * 300 + j));
    }
  }
}

TEST(QuantFp8Block, RoundTripBounds) {
  const int64_t shapes[][2] = {{1, 16}, {65, 80}, {993, 512}, {130, 260}};
  const Fill fills[] = {Fill::kGaussian,  Fill::kHeavyTailed, Fill::kZeros,
                        Fill::kSubnormal, Fill::kNearMax,     Fill::kSpecials};
  for (auto [m, k] : shapes) {
    for (Fill fill : fills) {
      for (ScalingMode mode : {ScalingMode::kBlock1x128, ScalingMode::kBlock128x128}) {
        for (DType t : {DType::kE4M3, DType::kE5M2}) {
          const Tensor x = make_bf16(m, k, fill_fn(fill, m + 31 * k, 448));
          QuantConfig cfg = mode == ScalingMode::kBlock1x128 ? QuantConfig::fp8_block_1x128(t)
                                                             : QuantConfig::fp8_block_128x128(t);
          if (m * k > 100000 && (fill != Fill::kGaussian)) cfg.columnwise = false;  // keep fast
          const QuantizedTensor q = run(x, cfg);
          const RoundTripStats st = check_round_trip(q, Usage::kRowwise, source_f32(x, false));
          if (cfg.columnwise) check_round_trip(q, Usage::kColumnwise, source_f32(x, true));
          EXPECT_LE(st.max_rel_normal, std::ldexp(1.0, -(minifloat_spec(t).mbits + 1)));
        }
      }
    }
  }
}

}  // namespace
}  // namespace lowbit
