// MX block scaling (E8M0 per 32): MXFP8, MXFP6, MXFP4 — formats.md §2.5.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "lowbit/quant/layout.h"
#include "quant/quant_test_util.h"

namespace lowbit {
namespace {

using namespace quant_test;

TEST(QuantMx, ShapeMustHoldWholeBlocks) {
  Context ctx(Device::cpu());
  QuantizedTensor q;
  const Tensor x65 = make_bf16(65, 80, fill_fn(Fill::kGaussian, 1));
  try {
    quantize(ctx, x65, QuantConfig::mx(), q);
    FAIL() << "65x80 accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 32"), std::string::npos) << e.what();
  }
  EXPECT_THROW(quantize(ctx, make_bf16(1, 16, fill_fn(Fill::kGaussian, 1)), QuantConfig::mx(), q),
               UserError);
  // Rowwise only needs K % 32 == 0: 993 × 512 is fine.
  QuantConfig row = QuantConfig::mx();
  row.columnwise = false;
  EXPECT_NO_THROW(quantize(ctx, make_bf16(993, 512, fill_fn(Fill::kGaussian, 1)), row, q));
  // Columnwise only needs M % 32 == 0.
  QuantConfig col = QuantConfig::mx();
  col.rowwise = false;
  EXPECT_NO_THROW(quantize(ctx, make_bf16(64, 48, fill_fn(Fill::kGaussian, 1)), col, q));
  EXPECT_THROW(quantize(ctx, make_bf16(64, 47, fill_fn(Fill::kGaussian, 1)),
                        QuantConfig::mx(DType::kE2M1), q),
               UserError);
}

TEST(QuantMx, CeilVersusFloorExample) {
  // One block of 32 with amax 15 = 1.875 · 2^3 (significand above E4M3's 1.75):
  //   ceil (TE):  e = 127 - 4, multiplier 16: 15 → 240 = 1.875 · 2^7 → code 0x77, no clipping;
  //   floor (OCP): e = 127 - 5, multiplier 32: 15 → 480 → saturates to 448 (0x7E).
  const Tensor x = make_bf16(1, 32, [](int64_t, int64_t j) { return j == 0 ? 15.0f : 1.0f; });
  QuantConfig cfg = QuantConfig::mx(DType::kE4M3, MxScaleRounding::kCeil);
  cfg.columnwise = false;
  QuantizedTensor q = run(x, cfg);
  EXPECT_EQ(q.rowwise_scale_inv.ptr<uint8_t>()[0], 123);
  EXPECT_EQ(code_at(q.rowwise_data, 0), 0x77u);
  EXPECT_EQ(code_at(q.rowwise_data, 1), encode_rn(DType::kE4M3, 16.0f));
  cfg.mx_rounding = MxScaleRounding::kFloor;
  q = run(x, cfg);
  EXPECT_EQ(q.rowwise_scale_inv.ptr<uint8_t>()[0], 122);
  EXPECT_EQ(code_at(q.rowwise_data, 0), 0x7Eu);
  EXPECT_EQ(code_at(q.rowwise_data, 1), encode_rn(DType::kE4M3, 32.0f));
}

TEST(QuantMx, ZeroInfNanBlocks) {
  // Row 0: zeros → scale 0x00, codes 0. Row 1: an inf → 0xFE (ceil), finite values flush,
  // inf saturates. Row 2: NaN only → amax 0 → 0x00, NaN codes 0x7F. Row 3: NaN + 2 → NaN
  // ignored: scale from amax 2.
  const Tensor x = make_bf16(4, 32, [](int64_t i, int64_t j) {
    if (i == 1) return j == 3 ? kInf : 1.0f;
    if (i == 2) return kNaN;
    if (i == 3) return j == 0 ? kNaN : 2.0f;
    return 0.0f;
  });
  QuantConfig cfg = QuantConfig::mx();
  cfg.columnwise = false;
  const QuantizedTensor q = run(x, cfg);
  const uint8_t* s = q.rowwise_scale_inv.ptr<uint8_t>();
  EXPECT_EQ(s[0], 0x00);
  EXPECT_EQ(s[1], 0xFE);
  EXPECT_EQ(s[2], 0x00);
  EXPECT_EQ(s[3], mx_scale_ceil(2.0f, 448));
  for (int j = 0; j < 32; ++j) EXPECT_EQ(code_at(q.rowwise_data, j), 0u);
  EXPECT_EQ(code_at(q.rowwise_data, 32 + 3), 0x7Eu);
  EXPECT_EQ(code_at(q.rowwise_data, 32 + 0), 0u);  // 1 · 2^-127 → 0
  EXPECT_EQ(code_at(q.rowwise_data, 64), 0x7Fu);
  EXPECT_EQ(code_at(q.rowwise_data, 96), 0x7Fu);
  // Floor rule: inf amax → NaN scale.
  cfg.mx_rounding = MxScaleRounding::kFloor;
  EXPECT_EQ(run(x, cfg).rowwise_scale_inv.ptr<uint8_t>()[1], 0xFF);
}

// The columnwise copy is stored transposed and equals, code for code and scale for scale, the
// rowwise quantization of x^T.
TEST(QuantMx, ColumnwiseIsTheRowwiseCopyOfTheTranspose) {
  const Tensor x = make_bf16(64, 96, fill_fn(Fill::kHeavyTailed, 9));
  const QuantizedTensor q = run(x, QuantConfig::mx(DType::kE5M2));
  ASSERT_EQ(q.columnwise_data.shape(), (Shape{96, 64}));
  ASSERT_EQ(q.columnwise_scale_inv.shape(), (Shape{96, 2}));
  const TensorView xt(x.data(), DType::kBF16, {96, 64}, {1, 96}, Device::cpu());
  QuantConfig row = QuantConfig::mx(DType::kE5M2);
  row.columnwise = false;
  const QuantizedTensor qt = run(xt, row);  // [96, 64], scales [96, 2]
  for (int64_t i = 0; i < 96 * 64; ++i) {
    ASSERT_EQ(code_at(q.columnwise_data, i), code_at(qt.rowwise_data, i)) << i;
  }
  for (int64_t i = 0; i < 96 * 2; ++i) {
    ASSERT_EQ(q.columnwise_scale_inv.ptr<uint8_t>()[i], qt.rowwise_scale_inv.ptr<uint8_t>()[i])
        << i;
  }
}

// MXFP4 packs two codes per byte along each copy's rows: an odd K is fine for a columnwise-only
// copy (packed along M), and refused for the rowwise one.
TEST(QuantMx, Fp4OddKOnlyForTheColumnwiseCopy) {
  const Tensor x = make_bf16(64, 33, fill_fn(Fill::kGaussian, 5));
  QuantConfig cfg = QuantConfig::mx(DType::kE2M1);
  cfg.rowwise = false;
  const QuantizedTensor q = run(x, cfg);
  EXPECT_EQ(q.columnwise_data.shape(), (Shape{33, 64}));
  EXPECT_EQ(q.columnwise_data.nbytes(), 33 * 32);
  check_round_trip(q, Usage::kColumnwise, source_f32(x, true));
  cfg.rowwise = true;
  Context ctx(Device::cpu());
  QuantizedTensor out;
  EXPECT_THROW(quantize(ctx, x.view(), cfg, out), UserError);
}

TEST(QuantMx, Fp4PackingAndFp6Codes) {
  // MXFP4: amax 6 → e = 127 (ceil(log2(6/6)) = 0): codes are plain e2m1, even index low nibble.
  const Tensor x = make_bf16(1, 32, [](int64_t, int64_t j) {
    const float v[4] = {6.0f, -0.5f, 1.5f, 3.0f};
    return v[j % 4];
  });
  QuantConfig cfg = QuantConfig::mx(DType::kE2M1);
  cfg.columnwise = false;
  QuantizedTensor q = run(x, cfg);
  ASSERT_EQ(q.rowwise_data.nbytes(), 16);
  EXPECT_EQ(q.rowwise_scale_inv.ptr<uint8_t>()[0], 127);
  EXPECT_EQ(q.rowwise_data.ptr<uint8_t>()[0], 0x97);  // low: 6 → 0x7, high: -0.5 → 0x9
  EXPECT_EQ(q.rowwise_data.ptr<uint8_t>()[1], 0x53);  // low: 1.5 → 0x3, high: 3 → 0x5
  // MXFP6 E2M3 (max 7.5 = 1.875 · 2^2): amax 7.5 → e = 127; E3M2 (max 28): 6/28 → 2^-2.
  cfg.dtype = DType::kE2M3;
  q = run(x, cfg);
  EXPECT_EQ(q.rowwise_scale_inv.ptr<uint8_t>()[0], 127);
  EXPECT_EQ(code_at(q.rowwise_data, 0), encode_rn(DType::kE2M3, 6.0f));
  cfg.dtype = DType::kE3M2;
  q = run(x, cfg);
  EXPECT_EQ(q.rowwise_scale_inv.ptr<uint8_t>()[0], 127 - 2);
  EXPECT_EQ(code_at(q.rowwise_data, 0), encode_rn(DType::kE3M2, 24.0f));
  // Floor rule for E2M1 (emax 2): amax 6 → floor(log2 6) - 2 = 0 → 127 as well.
  cfg.dtype = DType::kE2M1;
  cfg.mx_rounding = MxScaleRounding::kFloor;
  EXPECT_EQ(run(x, cfg).rowwise_scale_inv.ptr<uint8_t>()[0], 127);
}

TEST(QuantMx, RoundTripBounds) {
  const int64_t shapes[][2] = {{32, 32}, {64, 96}, {992, 512}};
  const Fill fills[] = {Fill::kGaussian,  Fill::kHeavyTailed, Fill::kZeros,
                        Fill::kSubnormal, Fill::kNearMax,     Fill::kSpecials};
  const DType types[] = {DType::kE4M3, DType::kE5M2, DType::kE3M2, DType::kE2M3, DType::kE2M1};
  for (auto [m, k] : shapes) {
    for (Fill fill : fills) {
      for (DType t : types) {
        for (MxScaleRounding r : {MxScaleRounding::kCeil, MxScaleRounding::kFloor}) {
          const bool big = m * k > 100000;
          if (big && (fill != Fill::kGaussian && fill != Fill::kHeavyTailed)) continue;
          const Tensor x = make_bf16(m, k, fill_fn(fill, m * 3 + k, dtype_max_finite(t)));
          QuantConfig cfg = QuantConfig::mx(t, r);
          const QuantizedTensor q = run(x, cfg);
          const RoundTripStats st = check_round_trip(q, Usage::kRowwise, source_f32(x, false));
          check_round_trip(q, Usage::kColumnwise, source_f32(x, true));
          EXPECT_LE(st.max_rel_normal, std::ldexp(1.0, -(minifloat_spec(t).mbits + 1)));
          if (r == MxScaleRounding::kCeil && fill != Fill::kSpecials) {
            // The ceil rule never clips: every scaled magnitude |x| / 2^(e-127) stays ≤ fmax.
            const std::vector<float> src = source_f32(x, false);
            for (int64_t i = 0; i < m * k; ++i) {
              const float xv = src[static_cast<size_t>(i)];
              if (!std::isfinite(xv)) continue;
              const float f = dequant_factor_at(q, Usage::kRowwise, i / k, i % k);
              ASSERT_LE(std::fabs(xv) / f, dtype_max_finite(t)) << i;
              if (i > 2000) break;  // a sample is enough
            }
          }
        }
      }
    }
  }
}

TEST(QuantMx, SwizzledScalesForBothOrientations) {
  const Tensor x = make_bf16(256, 160, fill_fn(Fill::kGaussian, 11));
  const QuantizedTensor q = run(x, QuantConfig::mx());
  // Rowwise [256, 5] → swizzled [256, 8]; columnwise (stored transposed) [160, 8] → [256, 8].
  const Tensor rs = gemm_block_scales(q, Usage::kRowwise);
  const Tensor cs = gemm_block_scales(q, Usage::kColumnwise);
  ASSERT_EQ(rs.shape(), (Shape{256, 8}));
  ASSERT_EQ(cs.shape(), (Shape{256, 8}));
  const uint8_t* r = q.rowwise_scale_inv.ptr<uint8_t>();
  const uint8_t* c = q.columnwise_scale_inv.ptr<uint8_t>();
  for (int64_t i = 0; i < 256; ++i) {
    for (int64_t b = 0; b < 5; ++b) {
      ASSERT_EQ(rs.ptr<uint8_t>()[swizzled_scale_offset(i, b, 8)], r[i * 5 + b]);
    }
  }
  for (int64_t j = 0; j < 160; ++j) {
    for (int64_t b = 0; b < 8; ++b) {
      ASSERT_EQ(cs.ptr<uint8_t>()[swizzled_scale_offset(j, b, 8)], c[j * 8 + b]);
    }
  }
  EXPECT_EQ(cs.ptr<uint8_t>()[swizzled_scale_offset(200, 0, 8)], 0);  // padding rows
}

}  // namespace
}  // namespace lowbit
