// NVFP4 (E2M1 + UE4M3 per 16 + fp32 amax): 1×16 and 16×16 blocks, Hadamard columnwise copies,
// stochastic rounding — formats.md §2.6, §5.
#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <limits>

#include "lowbit/core/philox.h"
#include "lowbit/quant/e2m1_fast.h"
#include "lowbit/quant/hadamard16.h"
#include "lowbit/quant/scale_math.h"
#include "quant/quant_test_util.h"

namespace lowbit {
namespace {

using namespace quant_test;

QuantizedTensor run(const TensorView& x, const QuantConfig& cfg, Context* ctx_in = nullptr) {
  Context local(Device::cpu());
  Context& ctx = ctx_in ? *ctx_in : local;
  QuantizedTensor q;
  quantize(ctx, x, cfg, q);
  q.validate();
  return q;
}

QuantConfig rowwise_only(QuantConfig c) {
  c.columnwise = false;
  return c;
}

// RHT(x^T) as f32 values of bf16 results: [K, M].
std::vector<float> rht_transposed(const TensorView& x) {
  const int64_t m = x.size(0), k = x.size(1);
  std::vector<float> out(static_cast<size_t>(m * k));
  for (int64_t j = 0; j < k; ++j) {
    for (int64_t i0 = 0; i0 < m; i0 += 16) {
      float v[16];
      for (int t = 0; t < 16; ++t) v[t] = value_at(x, i0 + t, j);
      rht16_apply_f32(v);
      for (int t = 0; t < 16; ++t) out[static_cast<size_t>(j * m + i0 + t)] = v[t];
    }
  }
  return out;
}

TEST(QuantNvfp4, WorkedExample) {
  // One row, two blocks; global amax A = 10 (formats.md §2.6, values hand-computed in the
  // kernel's order: S_enc = 268.8, k = 44.8; block 0: b = 10 → sd = 448 (0x7E),
  // m = 0x3F199999 ≈ 0.6; block 1: b = 2 → RN(89.6) → sd = 88 (0x6B), m ≈ 3.0545).
  const float row[32] = {10,   3.3f,  -1.7f, 0.1f, 2.5f, -0.0f, 0.0f, 7.0f,  0,    0,    0,
                         0,    0,     0,     0,    0,    2.0f,  1.0f, -0.5f, 0.3f, 0.2f, -0.09f,
                         1.6f, 0.65f, 0,     0,    0,    0,     0,    0,     0,    0};
  const Tensor x = bf16_from(1, 32, std::vector<float>(row, row + 32));
  const QuantizedTensor q = run(x, rowwise_only(QuantConfig::nvfp4_activation()));
  EXPECT_EQ(q.amax.ptr<float>()[0], 10.0f);
  ASSERT_EQ(q.rowwise_scale_inv.shape(), (Shape{1, 2}));
  EXPECT_EQ(q.rowwise_scale_inv.ptr<uint8_t>()[0], 0x7E);
  EXPECT_EQ(q.rowwise_scale_inv.ptr<uint8_t>()[1], 0x6B);
  // Codes: 10·m = 5.9999995 → 6 (7); 3.296875·m = 1.978 → 2 (4); -1.021 → -1 (A); 0.06 → 0;
  // 2.5·m = 1.4999999 → 1.5 (3); -0 → 8; 0; 7·m = 4.2 → 4 (6). Block 1: 6.109 saturates to 6
  // (7); 3.05 → 3 (5); -1.527 → -1.5 (B); 0.919 → 1 (2); 0.61 → 0.5 (1); -0.274 → -0.5 (9);
  // 4.89 → 4 (6); 1.98 → 2 (4).
  const uint8_t expected[16] = {0x47, 0x0A, 0x83, 0x60, 0, 0, 0, 0,
                                0x57, 0x2B, 0x91, 0x46, 0, 0, 0, 0};
  ASSERT_EQ(q.rowwise_data.nbytes(), 16);
  for (int b = 0; b < 16; ++b) EXPECT_EQ(q.rowwise_data.ptr<uint8_t>()[b], expected[b]) << b;
  // Dequantized: q · RN(RN(sd · A) · RN(1/2688)); block 0 factor 0x3FD55556.
  const Tensor d = dequantize(q, Usage::kRowwise);
  EXPECT_EQ(d.ptr<float>()[0], 6.0f * f32_from_bits(0x3FD55556u));
  EXPECT_EQ(d.ptr<float>()[16], 6.0f * f32_from_bits(0x3EA79E7Au));
}

TEST(QuantNvfp4, ShapeRules) {
  Context ctx(Device::cpu());
  QuantizedTensor q;
  // 65 × 80: rowwise fine (K = 80), columnwise needs M % 16.
  const Tensor x = make_bf16(65, 80, fill_fn(Fill::kGaussian, 1));
  try {
    quantize(ctx, x, QuantConfig::nvfp4_activation(), q);
    FAIL() << "65x80 columnwise accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("M = 65 must be a multiple of 16"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(quantize(ctx, x, rowwise_only(QuantConfig::nvfp4_activation()), q));
  // 1 × 16: rowwise fine; 16×16 tiles need both dims.
  const Tensor one = make_bf16(1, 16, fill_fn(Fill::kGaussian, 1));
  EXPECT_NO_THROW(quantize(ctx, one, rowwise_only(QuantConfig::nvfp4_gradient()), q));
  EXPECT_THROW(quantize(ctx, one, QuantConfig::nvfp4_weight(), q), UserError);
  EXPECT_THROW(quantize(ctx, make_bf16(16, 24, fill_fn(Fill::kGaussian, 1)),
                        rowwise_only(QuantConfig::nvfp4_activation()), q),
               UserError);
  // The Hadamard transform takes bf16 input.
  EXPECT_THROW(quantize(ctx, make_f32(16, 16, fill_fn(Fill::kGaussian, 1)),
                        QuantConfig::nvfp4_activation(), q),
               UserError);
  // And only exists for nvfp4_1x16.
  QuantConfig w = QuantConfig::nvfp4_weight();
  w.hadamard_columnwise = true;
  EXPECT_THROW(quantize(ctx, make_bf16(16, 16, fill_fn(Fill::kGaussian, 1)), w, q), UserError);
}

TEST(QuantNvfp4, ZerosAndSpecials) {
  // All zeros: A = 0 → S_enc = 1, every block scale 0, codes 0, dequantized 0.
  QuantizedTensor q = run(make_bf16(32, 32, fill_fn(Fill::kZeros, 1)), QuantConfig::nvfp4_weight());
  EXPECT_EQ(q.amax.ptr<float>()[0], 0.0f);
  for (int64_t i = 0; i < q.rowwise_data.nbytes(); ++i)
    ASSERT_EQ(q.rowwise_data.ptr<uint8_t>()[i], 0);
  for (int64_t i = 0; i < q.rowwise_scale_inv.numel(); ++i) {
    ASSERT_EQ(q.rowwise_scale_inv.ptr<uint8_t>()[i], 0);
  }
  const Tensor d = dequantize(q, Usage::kColumnwise);
  for (int64_t i = 0; i < d.numel(); ++i) ASSERT_EQ(d.ptr<float>()[i], 0.0f);
  // inf: A = inf → S_enc = 1; the inf block gets sd = 448 and the inf element +6 (0x7);
  // NaN elements encode to +max (0x7, CUDA's rule) and do not enter the amax.
  const Tensor x = make_bf16(1, 32, [](int64_t, int64_t j) {
    if (j == 0) return std::numeric_limits<float>::infinity();
    if (j == 16) return std::numeric_limits<float>::quiet_NaN();
    return 1.0f;
  });
  q = run(x, rowwise_only(QuantConfig::nvfp4_activation()));
  EXPECT_TRUE(std::isinf(q.amax.ptr<float>()[0]));
  EXPECT_EQ(q.rowwise_scale_inv.ptr<uint8_t>()[0], 0x7E);
  EXPECT_EQ(code_at(q.rowwise_data, 0), 0x7u);
  EXPECT_EQ(code_at(q.rowwise_data, 16), 0x7u);
  // Block 1's amax is 1: sd = ue4m3(RN(1 · RN(1/6))) and its finite elements round normally.
  const float k_inf = nvfp4_global_scale(std::numeric_limits<float>::infinity()).k;
  EXPECT_EQ(k_inf, f32_from_bits(0x3E2AAAABu));  // S_enc = 1 → k = RN(1/6)
  EXPECT_EQ(q.rowwise_scale_inv.ptr<uint8_t>()[1], nvfp4_block_scale(1.0f, k_inf));
}

TEST(QuantNvfp4, Tiles16x16) {
  const Tensor x = make_bf16(32, 48, [](int64_t i, int64_t j) {
    return static_cast<float>((i / 16) * 3 + (j / 16) + 1) * std::sin(0.37f * (i * 48 + j));
  });
  const QuantizedTensor q = run(x, QuantConfig::nvfp4_weight());
  ASSERT_EQ(q.rowwise_scale_inv.shape(), (Shape{32, 3}));
  ASSERT_EQ(q.columnwise_scale_inv.shape(), (Shape{48, 2}));
  ASSERT_EQ(q.columnwise_data.shape(), (Shape{48, 32}));
  const Nvfp4GlobalScale g = nvfp4_global_scale(q.amax.ptr<float>()[0]);
  EXPECT_EQ(q.columnwise_amax.ptr<float>()[0], q.amax.ptr<float>()[0]);
  for (int64_t mb = 0; mb < 2; ++mb) {
    for (int64_t kb = 0; kb < 3; ++kb) {
      float t_amax = 0;
      for (int64_t i = mb * 16; i < mb * 16 + 16; ++i) {
        for (int64_t j = kb * 16; j < kb * 16 + 16; ++j)
          t_amax = amax_combine(t_amax, value_at(x, i, j));
      }
      const uint8_t sd = nvfp4_block_scale(t_amax, g.k);
      for (int64_t t = 0; t < 16; ++t) {  // replicated in the 16 rows of the tile
        EXPECT_EQ(q.rowwise_scale_inv.ptr<uint8_t>()[(mb * 16 + t) * 3 + kb], sd);
        EXPECT_EQ(q.columnwise_scale_inv.ptr<uint8_t>()[(kb * 16 + t) * 2 + mb], sd);
      }
    }
  }
  for (int64_t i = 0; i < 32; ++i) {
    for (int64_t j = 0; j < 48; ++j) {
      ASSERT_EQ(code_at(q.columnwise_data, j * 32 + i), code_at(q.rowwise_data, i * 48 + j));
    }
  }
}

TEST(QuantNvfp4, HadamardColumnwiseCopy) {
  const Tensor x = make_bf16(64, 32, fill_fn(Fill::kHeavyTailed, 21));
  const QuantizedTensor q = run(x, QuantConfig::nvfp4_activation());
  EXPECT_TRUE(q.columnwise_hadamard);
  // Reference: RHT(x^T) rounded to bf16, then a plain rowwise 1×16 quantization of it.
  const std::vector<float> t = rht_transposed(x);  // [32, 64]
  const Tensor tb = bf16_from(32, 64, t);
  const QuantizedTensor r = run(tb, rowwise_only(QuantConfig::nvfp4_activation()));
  EXPECT_EQ(q.columnwise_amax.ptr<float>()[0], r.amax.ptr<float>()[0]);  // post-RHT amax
  EXPECT_NE(q.columnwise_amax.ptr<float>()[0], q.amax.ptr<float>()[0]);
  for (int64_t i = 0; i < 32 * 64 / 2; ++i) {
    ASSERT_EQ(q.columnwise_data.ptr<uint8_t>()[i], r.rowwise_data.ptr<uint8_t>()[i]) << i;
  }
  for (int64_t i = 0; i < 32 * 4; ++i) {
    ASSERT_EQ(q.columnwise_scale_inv.ptr<uint8_t>()[i], r.rowwise_scale_inv.ptr<uint8_t>()[i]);
  }
  // Transforming the dequantized copy back (· H^T) approximates x^T.
  const Tensor d = dequantize(q, Usage::kColumnwise);  // [32, 64] = RHT(x^T) approx
  double err2 = 0, ref2 = 0;
  for (int64_t j = 0; j < 32; ++j) {
    for (int64_t i0 = 0; i0 < 64; i0 += 16) {
      for (int a = 0; a < 16; ++a) {
        double back = 0;
        for (int b = 0; b < 16; ++b) back += d.ptr<float>()[j * 64 + i0 + b] * rht16_entry(a, b);
        const double ref = value_at(x, i0 + a, j);
        err2 += (back - ref) * (back - ref);
        ref2 += ref * ref;
      }
    }
  }
  EXPECT_LT(std::sqrt(err2 / ref2), 0.2);
}

TEST(QuantNvfp4, StochasticRoundingIndexAndStreams) {
  // Element (r, c) of a copy draws the random byte i % 16 of Philox block i / 16 (i = r · cols + c
  // in the copy's own orientation: rowwise [M, K] with `offset`, the transposed columnwise [K, M]
  // with offset + 1), which e2m1_encode_sr gets as the top byte of rbits over the midpoint
  // 0x800000.
  const auto rbits = [](uint64_t offset, uint64_t i) {
    const Philox4 b = philox_block(1234, offset, i / 16);
    const uint32_t byte = (b.v[(i % 16) / 4] >> (8 * (i % 4))) & 0xFFu;
    return (byte << 24) | 0x800000u;
  };
  const Tensor x = make_bf16(32, 48, fill_fn(Fill::kGaussian, 5));
  QuantConfig cfg = QuantConfig::nvfp4_gradient();
  cfg.hadamard_columnwise = false;
  cfg.sr_key = RngKey{1234, 77};
  const QuantizedTensor q = run(x, cfg);
  const Nvfp4GlobalScale g = nvfp4_global_scale(q.amax.ptr<float>()[0]);
  for (int64_t i = 0; i < 32; ++i) {
    for (int64_t j = 0; j < 48; ++j) {
      const uint8_t sd = q.rowwise_scale_inv.ptr<uint8_t>()[i * 3 + j / 16];
      const float m = nvfp4_block_multiplier(sd, g.s_dec);
      const uint32_t expect = e2m1_encode_sr(mul_rn(value_at(x, i, j), m),
                                             rbits(77, static_cast<uint64_t>(i * 48 + j)));
      ASSERT_EQ(code_at(q.rowwise_data, i * 48 + j), expect) << i << "," << j;
      const uint8_t sdt = q.columnwise_scale_inv.ptr<uint8_t>()[j * 2 + i / 16];
      const float mt = nvfp4_block_multiplier(sdt, g.s_dec);
      const uint32_t expect_t =
          e2m1_encode_sr(mul_rn(value_at(x, i, j), mt), rbits(78, uint64_t(j * 32 + i)));
      ASSERT_EQ(code_at(q.columnwise_data, j * 32 + i), expect_t) << i << "," << j;
    }
  }
  // Same key → same codes; context-drawn keys advance the offset, set_seed replays.
  const QuantizedTensor q2 = run(x, cfg);
  for (int64_t b = 0; b < q.rowwise_data.nbytes(); ++b) {
    ASSERT_EQ(q.rowwise_data.ptr<uint8_t>()[b], q2.rowwise_data.ptr<uint8_t>()[b]);
  }
  cfg.sr_key.reset();
  Context ctx(Device::cpu());
  ctx.set_seed(99);
  const QuantizedTensor a = run(x, cfg, &ctx);
  const QuantizedTensor b = run(x, cfg, &ctx);
  ctx.set_seed(99);
  const QuantizedTensor a2 = run(x, cfg, &ctx);
  int differ = 0;
  for (int64_t i = 0; i < a.rowwise_data.nbytes(); ++i) {
    differ += a.rowwise_data.ptr<uint8_t>()[i] != b.rowwise_data.ptr<uint8_t>()[i];
    ASSERT_EQ(a.rowwise_data.ptr<uint8_t>()[i], a2.rowwise_data.ptr<uint8_t>()[i]);
  }
  EXPECT_GT(differ, 0);
}

TEST(QuantNvfp4, StochasticRoundingIsUnbiased) {
  // Rows [6, v_1 .. v_15]: A = 6 makes every block scale 448 and the multiplier ≈ 1, so the
  // values are rounded between adjacent E2M1 magnitudes. Mean over many rows and calls must
  // match the value within a few standard errors; round-to-nearest is visibly biased.
  const float vals[15] = {0.3f, 0.74f, 1.1f,   1.3f,  1.9f,  2.2f,  2.9f, 3.3f,
                          4.7f, 5.5f,  -0.13f, -1.7f, -2.6f, -3.9f, 0.55f};
  const int64_t rows = 4096;
  const Tensor x =
      make_bf16(rows, 16, [&](int64_t, int64_t j) { return j == 0 ? 6.0f : vals[j - 1]; });
  QuantConfig cfg = rowwise_only(QuantConfig::nvfp4_gradient());
  double sum[16] = {}, sum2[16] = {};
  const int calls = 4;
  for (int call = 0; call < calls; ++call) {
    cfg.sr_key = RngKey{42, static_cast<uint64_t>(10 * call)};
    const QuantizedTensor q = run(x, cfg);
    const Tensor d = dequantize(q, Usage::kRowwise);
    for (int64_t i = 0; i < rows; ++i) {
      for (int j = 1; j < 16; ++j) {
        const double v = d.ptr<float>()[i * 16 + j];
        sum[j] += v;
        sum2[j] += v * v;
      }
    }
  }
  const double n = static_cast<double>(rows) * calls;
  QuantConfig rn_cfg = rowwise_only(QuantConfig::nvfp4_activation());
  const Tensor d_rn = dequantize(run(x, rn_cfg), Usage::kRowwise);
  for (int j = 1; j < 16; ++j) {
    const double target = value_at(x, 0, j);
    const double mean = sum[j] / n;
    const double var = std::max(sum2[j] / n - mean * mean, 1e-12);
    const double se = std::sqrt(var / n);
    EXPECT_LE(std::fabs(mean - target), 5 * se + 1e-5 * std::fabs(target))
        << "value " << target << " mean " << mean << " se " << se;
    // Round to nearest: deterministic, error up to half a gap — much larger than 5 SE here.
    const double rn_bias = std::fabs(d_rn.ptr<float>()[j] - target);
    if (rn_bias > 0.05) EXPECT_GT(rn_bias, 5 * se) << target;
  }
}

TEST(QuantNvfp4, RandomByteRoundsUpInProportion) {
  // E2M1 rounds with one random byte (sr_bits_of_byte: the byte over the midpoint of the low 24
  // bits). Over the 256 bytes, the number that round |x| up is 256 · frac to within one half, in
  // every region of the encoder (quantum 0.5 below 2, 1 in [2, 4), 2 above; below 0.5 the lower
  // neighbour is 0).
  const float xs[] = {0.01f, 0.2f,  0.3f,  0.49f, 0.51f,  0.62f, 0.99f, 1.01f, 1.2f,
                      1.49f, 1.74f, 2.05f, 2.5f,  3.3f,   3.97f, 4.1f,  4.6f,  5.2f,
                      5.99f, 0.25f, 0.75f, 1.25f, 1.625f, 2.25f, 4.25f, 5.5f,  0.126f};
  for (const float x : xs) {
    const float q = x < 2.0f ? 0.5f : (x < 4.0f ? 1.0f : 2.0f);
    const double lo = std::floor(double(x) / q) * q;
    const double frac = (double(x) - lo) / q;
    int up = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      const float v = decode(DType::kE2M1, e2m1_encode_sr(x, sr_bits_of_byte(b)));
      ASSERT_TRUE(v == float(lo) || v == float(lo + q)) << x << " byte " << b << " gave " << v;
      up += v == float(lo + q);
    }
    EXPECT_LE(std::fabs(up - 256.0 * frac), 0.5 + 1e-9) << x << ": " << up << " of 256 up";
    // The same for -x, mirrored.
    int up_neg = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      up_neg += decode(DType::kE2M1, e2m1_encode_sr(-x, sr_bits_of_byte(b))) == -float(lo + q);
    }
    EXPECT_EQ(up_neg, up) << x;
  }
}

TEST(QuantNvfp4, Fp8StochasticRoundingIsUnbiased) {
  // The same SR path serves FP8: per-tensor E4M3 with scale 1 (amax 448).
  const float vals[7] = {0.3f, 1.1f, 100.5f, -7.3f, 0.013f, 250.0f, -33.3f};
  const int64_t rows = 8192;
  const Tensor x =
      make_f32(rows, 8, [&](int64_t, int64_t j) { return j == 0 ? 448.0f : vals[j - 1]; });
  QuantConfig cfg = QuantConfig::fp8_current();
  cfg.columnwise = false;
  cfg.stochastic_rounding = true;
  cfg.sr_key = RngKey{7, 3};
  const Tensor d = dequantize(run(x, cfg), Usage::kRowwise);
  for (int j = 1; j < 8; ++j) {
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < rows; ++i) {
      const double v = d.ptr<float>()[i * 8 + j];
      s += v;
      s2 += v * v;
    }
    const double mean = s / rows, se = std::sqrt(std::max(s2 / rows - mean * mean, 1e-12) / rows);
    EXPECT_LE(std::fabs(mean - vals[j - 1]), 5 * se + 1e-6 * std::fabs(vals[j - 1])) << vals[j - 1];
  }
}

TEST(QuantNvfp4, TinyAmaxShrinksTowardZero) {
  // With A below 2688 / FLT_MAX (≈ 7.9e-36), S_enc = RN(2688/A) overflows to FLT_MAX, S_dec is an
  // fp32 subnormal and the block multipliers RN(1/RN(sd · S_dec)) overflow and clamp at FLT_MAX
  // (§2.6 order): the elements come out far below their true scaled size (here at 0.05–0.6 % of
  // it, a few percent flushed to 0). The format cannot represent such a tensor; what must hold is
  // that nothing is amplified (every element shrinks by 64× or more, its sign kept where not 0)
  // and nothing turns non-finite.
  const Tensor x = make_bf16(64, 80, fill_fn(Fill::kSubnormal, 3));
  QuantConfig cfg = QuantConfig::nvfp4_activation();
  const QuantizedTensor q = run(x, cfg);
  EXPECT_EQ(nvfp4_global_scale(q.amax.ptr<float>()[0]).s_enc, std::numeric_limits<float>::max());
  for (Usage u : {Usage::kRowwise, Usage::kColumnwise}) {
    SCOPED_TRACE(u == Usage::kRowwise ? "rowwise" : "columnwise");
    const Tensor d = dequantize(q, u);
    const std::vector<float> ref = u == Usage::kRowwise ? source_f32(x, false) : rht_transposed(x);
    int64_t nonzero = 0;
    for (int64_t i = 0; i < d.numel(); ++i) {
      const float v = d.ptr<float>()[i], r = ref[static_cast<size_t>(i)];
      ASSERT_TRUE(std::isfinite(v)) << i;
      ASSERT_LE(64.0 * std::fabs(v), std::fabs(double(r))) << i << ": " << v << " from " << r;
      if (v != 0.0f) ASSERT_EQ(std::signbit(v), std::signbit(r)) << i;
      nonzero += v != 0.0f;
    }
    EXPECT_GT(nonzero, 0);  // shrunk, not all flushed: the bound above is not met by zeros alone
  }
}

TEST(QuantNvfp4, RoundTripBounds) {
  struct Case {
    int64_t m, k;
    QuantConfig cfg;
  };
  const Case cases[] = {
      {1, 16, rowwise_only(QuantConfig::nvfp4_activation())},
      {65, 80, rowwise_only(QuantConfig::nvfp4_gradient())},
      {64, 80, QuantConfig::nvfp4_activation()},
      {64, 80, QuantConfig::nvfp4_weight()},
      {64, 80, QuantConfig::nvfp4_gradient()},
      {992, 512, QuantConfig::nvfp4_activation()},
      {993, 512, rowwise_only(QuantConfig::nvfp4_gradient())},
  };
  const Fill fills[] = {Fill::kGaussian,  Fill::kHeavyTailed, Fill::kZeros,
                        Fill::kSubnormal, Fill::kNearMax,     Fill::kSpecials};
  for (const Case& c : cases) {
    for (Fill fill : fills) {
      if (c.m * c.k > 100000 && fill != Fill::kGaussian && fill != Fill::kHeavyTailed) continue;
      if (fill == Fill::kSubnormal) continue;  // TinyAmaxShrinksTowardZero
      const Tensor x = make_bf16(c.m, c.k, fill_fn(fill, c.m + c.k, 6.0f));
      const QuantizedTensor q = run(x, c.cfg);
      if (fill == Fill::kSpecials && q.has_rowwise()) {
        // An inf element makes A = inf: S_enc = 1 for quantization, but the dequantization
        // factor sd · A / 2688 is infinite for the whole tensor (TE's formula).
        EXPECT_TRUE(std::isinf(q.amax.ptr<float>()[0]));
      }
      // Every finite element is bounded — or, with an inf in the tensor, none is (its factor is
      // infinite by definition): the counts say which, so that neither can pass vacuously.
      const auto finite = [](const std::vector<float>& v) {
        return int64_t(std::count_if(v.begin(), v.end(), [](float f) { return std::isfinite(f); }));
      };
      const bool inf_amax = fill == Fill::kSpecials;
      if (q.has_rowwise()) {
        const bool sr = c.cfg.stochastic_rounding;
        const std::vector<float> ref = source_f32(x, false);
        const RoundTripStats st = check_round_trip(q, Usage::kRowwise, ref, sr);
        EXPECT_LE(st.max_rel_normal, sr ? 0.5 : 0.25);  // E2M1: 2^-(1+1), SR a whole quantum
        EXPECT_EQ(inf_amax ? st.nonfinite_factor : st.checked, finite(ref));
        if (fill == Fill::kGaussian || fill == Fill::kHeavyTailed) EXPECT_GT(st.normal, 0);
      }
      if (q.has_columnwise()) {
        const std::vector<float> ref =
            q.columnwise_hadamard ? rht_transposed(x) : source_f32(x, true);
        const RoundTripStats st =
            check_round_trip(q, Usage::kColumnwise, ref, c.cfg.stochastic_rounding);
        EXPECT_EQ(inf_amax ? st.nonfinite_factor : st.checked, finite(ref));
      }
    }
  }
}

// e2m1_rn_fast (the kernels' E2M1 encoder) equals the codec: every fp32 pattern whose exponent
// lies within 2^-10 .. 2^9 (all decision points, both signs), every 251st pattern elsewhere, and
// the specials. (The whole fp32 range, 2^32 patterns, was checked once offline: no difference.)
TEST(QuantNvfp4, FastE2m1EncoderEqualsCodec) {
  int64_t bad = 0;
  auto check = [&](uint32_t b) {
    const float x = f32_from_bits(b);
    const uint32_t got = e2m1_rn_fast(x), want = encode_rn(DType::kE2M1, x);
    if (got != want && ++bad <= 8)
      ADD_FAILURE() << std::hex << "x=0x" << b << " fast " << got << " codec " << want;
  };
  for (uint32_t sign : {0u, 0x80000000u}) {
    for (uint32_t b = (127u - 10u) << 23; b < (127u + 10u) << 23; ++b) check(sign | b);
  }
  for (uint64_t b = 0; b < (uint64_t(1) << 32); b += 251) check(uint32_t(b));
  for (uint32_t b :
       {0x00000000u, 0x80000000u, 0x00000001u, 0x80000001u, 0x7F800000u, 0xFF800000u, 0x7F7FFFFFu,
        0xFF7FFFFFu, 0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFFFFFFFFu}) {
    check(b);
  }
  EXPECT_EQ(bad, 0);
}

// e2m1_fast.h, round to nearest: the magnitude code of every non-NaN input equals the codec's
// (all patterns of |x| in [2^-10, 2^10) of both signs, a sparse sweep of the rest, the specials);
// NaN gives 7 (the kernels send NaN blocks to the codec).
TEST(QuantNvfp4, LinesE2m1EncoderEqualsCodec) {
  int64_t bad = 0;
  auto check = [&](uint32_t b) {
    const float x = f32_from_bits(b);
    const uint32_t want = f32_is_nan(x) ? 7u : (encode_rn(DType::kE2M1, x) & 7u);
    const uint32_t got = e2m1_rn_mag(x);
    if (got != want && ++bad <= 8)
      ADD_FAILURE() << std::hex << "x=0x" << b << " fast " << got << " codec " << want;
  };
  for (uint32_t sign : {0u, 0x80000000u}) {
    for (uint32_t b = (127u - 10u) << 23; b < (127u + 10u) << 23; ++b) check(sign | b);
  }
  for (uint64_t b = 0; b < (uint64_t(1) << 32); b += 251) check(uint32_t(b));
  for (uint32_t b :
       {0x00000000u, 0x80000000u, 0x00000001u, 0x80000001u, 0x007FFFFFu, 0x00800000u, 0x7F800000u,
        0xFF800000u, 0x7F7FFFFFu, 0xFF7FFFFFu, 0x7FC00000u, 0xFFFFFFFFu}) {
    check(b);
  }
  EXPECT_EQ(bad, 0);
}

// e2m1_fast.h, round to nearest by two lines (the binade change of fp32 at 2^24 as the E2M1
// quantum change at 4): the magnitude code of every non-NaN input equals the codec's, clamped for
// any input and unclamped (e2m1_rn_mag2_biased_below7) for |x| < 7. Every pattern of |x| in
// [2^-10, 2^10) of both signs, every pattern just below 7, a sparse sweep of the rest, the
// specials. (The quantize kernels rely on it; a host sweep of all 2^32 patterns agreed too.)
TEST(QuantNvfp4, TwoLineE2m1EncoderEqualsCodec) {
  int64_t bad = 0;
  auto check = [&](uint32_t b) {
    const float x = f32_from_bits(b);
    if (f32_is_nan(x)) return;
    const uint32_t want = encode_rn(DType::kE2M1, x) & 7u;
    const uint32_t got = e2m1_rn_mag2(x);
    if (got != want && ++bad <= 8)
      ADD_FAILURE() << std::hex << "x=0x" << b << " two-line " << got << " codec " << want;
    if (std::fabs(x) < 7.0f) {
      const uint32_t got7 = e2m1_rn_mag2_biased_below7(x) - kE2m1Magic2Bits;
      if (got7 != want && ++bad <= 8)
        ADD_FAILURE() << std::hex << "x=0x" << b << " unclamped " << got7 << " codec " << want;
    }
  };
  for (uint32_t sign : {0u, 0x80000000u}) {
    for (uint32_t b = (127u - 10u) << 23; b < (127u + 10u) << 23; ++b) check(sign | b);
    for (uint32_t b = 0x40DFFFFFu - 100000u; b <= 0x40E00000u; ++b) check(sign | b);  // up to 7
  }
  for (uint64_t b = 0; b < (uint64_t(1) << 32); b += 251) check(uint32_t(b));
  for (uint32_t b : {0x00000000u, 0x80000000u, 0x00000001u, 0x80000001u, 0x007FFFFFu, 0x00800000u,
                     0x7F800000u, 0xFF800000u, 0x7F7FFFFFu, 0xFF7FFFFFu}) {
    check(b);
  }
  EXPECT_EQ(bad, 0);
}

// The E2M1 stochastic rounding of e2m1_fast.h against references: from |x| = 1 up the codec
// (encode_sr) bit for bit; below 1 rounding t = RN(|x| + 1) between its E2M1 neighbours
// t0 = floor(2t)/2 and t0 + 0.5, up exactly when the fraction (t - t0) / 0.5, as 22 bits,
// exceeds r >> 10 (computed in double here). Checked at the codec's threshold in r, on both
// sides of it and at the ends of the range, for x over every binade of fp32 (subnormals, zero
// and inf included).
uint32_t e2m1_sr_reference(float x, uint32_t r) {
  const double a = std::fabs(double(x));
  if (a >= 1.0) return encode_sr(DType::kE2M1, x, r) & 7u;
  const double t = double(add_rn(float(a), 1.0f));  // in [1, 2]
  const double t0 = std::floor(2.0 * t) / 2.0;
  const auto frac22 = static_cast<uint64_t>((t - t0) / 0.5 * 4194304.0);  // exact: t has 23 bits
  const bool up = frac22 > uint64_t(r >> 10);
  return static_cast<uint32_t>(std::lround(2.0 * (t0 - 1.0))) + (up ? 1u : 0u);
}

TEST(QuantNvfp4, IntegerE2m1SrEncoderEqualsReference) {
  int64_t bad = 0, n = 0;
  auto check = [&](float x, uint32_t r) {
    ++n;
    const uint32_t want = e2m1_sr_reference(x, r);
    const uint32_t got = e2m1_sr_mag(x, r);
    if (got != want && ++bad <= 8) {
      ADD_FAILURE() << std::hex << "x=0x" << f32_bits(x) << " r=0x" << r << " fast " << got
                    << " codec " << want;
    }
  };
  // Largest r that still rounds up, by bisection on the codec (rounding up is monotone in r).
  auto last_up = [](float x) -> int64_t {
    const uint32_t down = encode_sr(DType::kE2M1, x, 0xFFFFFFFFu) & 7u;
    if ((encode_sr(DType::kE2M1, x, 0u) & 7u) == down) return -1;
    uint64_t lo = 0, hi = 0xFFFFFFFFull;  // up at lo, down at hi
    while (hi - lo > 1) {
      const uint64_t mid = (lo + hi) / 2;
      ((encode_sr(DType::kE2M1, x, uint32_t(mid)) & 7u) == down ? hi : lo) = mid;
    }
    return int64_t(lo);
  };
  auto check_x = [&](uint32_t bits) {
    const float x = f32_from_bits(bits);
    for (uint32_t r :
         {0u, 1u, 0x3FFu, 0x400u, 0x7FFFFFFFu, 0x80000000u, 0xFFFFFBFFu, 0xFFFFFFFFu}) {
      check(x, r);
    }
    check(x, philox_uint32(5, 6, bits));
    const int64_t t = last_up(x);
    for (int64_t d = -2; d <= 2; ++d) {
      if (t + d >= 0 && t + d <= 0xFFFFFFFFll) check(x, uint32_t(t + d));
    }
  };
  for (uint32_t sign : {0u, 0x80000000u}) {
    for (uint32_t e = 0; e < 255; ++e) {
      for (uint32_t m : {0u, 1u, 2u, 3u, 0x1FFu, 0x200u, 0x201u, 0x3FFu, 0x400u, 0x3FFFFFu,
                         0x400000u, 0x400001u, 0x5A5A5Au, 0x7FFFFEu, 0x7FFFFFu}) {
        check_x(sign | (e << 23) | m);
      }
    }
    check_x(sign | 0x7F800000u);
  }
  // Dense over the decision range: every 97th pattern of |x| in [2^-12, 16).
  for (uint32_t b = (127u - 12u) << 23; b < (127u + 4u) << 23; b += 97) check_x(b);
  EXPECT_EQ(bad, 0) << "of " << n;
}

// Packed words: magnitudes summed at their nibbles, signs gathered by byte permutes; equal to
// packing the codec's codes, for -0, tiny negatives, ties, inf and random values.
TEST(QuantNvfp4, PackedE2m1WordsEqualCodec) {
  const float specials[] = {0.0f,  -0.0f, 1e-40f, -1e-40f, 0.25f, -0.25f, 0.75f,    -1.25f,
                            1.75f, 2.5f,  -3.5f,  5.0f,    -6.0f, 7.0f,   INFINITY, -INFINITY};
  int64_t bad = 0;
  for (int it = 0; it < 20000; ++it) {
    float x[8];
    uint32_t r[8];
    for (int i = 0; i < 8; ++i) {
      const uint32_t u = philox_uint32(11, 0, uint64_t(8 * it + i));
      x[i] = (u & 3u) == 0 ? specials[(u >> 2) % 16]
                           : philox_uniform(12, 0, uint64_t(8 * it + i)) * 8.0f - 4.0f;
      if ((u & 0x30u) == 0) x[i] *= 1e-3f;
      r[i] = philox_uint32(13, 0, uint64_t(8 * it + i));
    }
    uint32_t want_rn = 0, want_sr = 0;
    for (int i = 0; i < 8; ++i) {
      want_rn |= encode_rn(DType::kE2M1, x[i]) << (4 * i);
      want_sr |= e2m1_encode_sr(x[i], r[i]) << (4 * i);
    }
    const uint32_t got_rn = e2m1_pack8_rn(x), got_sr = e2m1_pack8_sr(x, r);
    if ((got_rn != want_rn || got_sr != want_sr) && ++bad <= 8) {
      ADD_FAILURE() << std::hex << "rn 0x" << got_rn << " vs 0x" << want_rn << ", sr 0x" << got_sr
                    << " vs 0x" << want_sr;
    }
  }
  EXPECT_EQ(bad, 0);
}

// The two-line packers: e2m1_pack8_rn2 (signs from the values, sign-replicating byte permutes)
// equals e2m1_pack8_rn and the codec; e2m1_pack8_rn2_bf16 (signs from the bf16 words of v for
// x = RN(v·m), m > 0) equals the codec for bf16 values of every kind (zeros of both signs,
// subnormals, infinities) and multipliers from the smallest subnormal to FLT_MAX; the unclamped
// (kBelow7) forms agree whenever every |x| < 7.
TEST(QuantNvfp4, TwoLinePackedE2m1WordsEqualCodec) {
  const float specials[] = {0.0f,   -0.0f, 1e-40f, -1e-40f,  0.25f,    -0.25f, 0.75f,
                            -1.25f, 1.75f, 2.5f,   -3.5f,    5.0f,     -6.0f,  6.9999995f,
                            -6.5f,  7.0f,  -7.0f,  INFINITY, -INFINITY};
  constexpr int kSpecials = int(sizeof(specials) / sizeof(specials[0]));
  int64_t bad = 0, below7 = 0;
  for (int it = 0; it < 200000; ++it) {
    // Arbitrary fp32 values (no NaN).
    float y[8];
    uint32_t want_y = 0;
    bool y7 = true;
    for (int i = 0; i < 8; ++i) {
      const uint32_t u = philox_uint32(31, 0, uint64_t(8 * it + i));
      y[i] = (u & 3u) == 0 ? specials[(u >> 2) % kSpecials]
                           : philox_uniform(32, 0, uint64_t(8 * it + i)) * 16.0f - 8.0f;
      if ((u & 0x30u) == 0) y[i] *= 1e-3f;
      want_y |= encode_rn(DType::kE2M1, y[i]) << (4 * i);
      y7 = y7 && std::fabs(y[i]) < 7.0f;
    }
    // bf16 values packed in pairs and products with a positive multiplier.
    uint32_t w[4];
    float x[8];
    const uint32_t um = philox_uint32(33, 0, uint64_t(it));
    const float m = um % 5 == 0 ? f32_max_finite()
                    : um % 5 == 1
                        ? f32_from_bits(1u + (um >> 12))  // subnormal
                        : std::ldexp(1.0f + float(um >> 9) * 0x1p-23f, int((um >> 3) % 40) - 20);
    uint32_t want_x = 0;
    bool x7 = true;
    for (int i = 0; i < 8; ++i) {
      const uint32_t u = philox_uint32(34, 0, uint64_t(8 * it + i));
      uint16_t b;
      switch (u % 5) {
        case 0: b = uint16_t(u >> 16); break;                 // any pattern
        case 1: b = (u & 0x100u) ? 0x8000u : 0x0000u; break;  // zeros
        case 2: b = uint16_t((u >> 16) & 0x807Fu); break;     // subnormals
        default: b = f32_to_bf16_rn(philox_uniform(35, 0, uint64_t(8 * it + i)) * 8.0f - 4.0f);
      }
      if ((b & 0x7FFFu) > 0x7F80u) b = 0xFF80u;  // NaN → -inf
      if (i % 2 == 0) {
        w[i / 2] = b;
      } else {
        w[i / 2] |= uint32_t(b) << 16;
      }
      x[i] = mul_rn(bf16_to_f32(b), m);
      want_x |= encode_rn(DType::kE2M1, x[i]) << (4 * i);
      x7 = x7 && std::fabs(x[i]) < 7.0f;
    }
    auto expect = [&](uint32_t got, uint32_t want, const char* what) {
      if (got != want && ++bad <= 8)
        ADD_FAILURE() << what << std::hex << ": 0x" << got << " vs 0x" << want;
    };
    expect(e2m1_pack8_rn2(y), want_y, "pack8_rn2");
    expect(e2m1_pack8_rn(y), want_y, "pack8_rn");
    expect(e2m1_pack8_rn2_bf16(x, w), want_x, "pack8_rn2_bf16");
    if (y7) expect(e2m1_pack8_rn2<true>(y), want_y, "pack8_rn2<below7>");
    if (x7) {
      ++below7;
      expect(e2m1_pack8_rn2_bf16<true>(x, w), want_x, "pack8_rn2_bf16<below7>");
    }
  }
  EXPECT_EQ(bad, 0);
  EXPECT_GT(below7, 1000);
}

// The kernels' fused first butterfly stage gives the same fp32 values (bit for bit, NaN as NaN)
// as rht16_butterfly_f32, over chunks mixing normal values, subnormals, zeros of both signs,
// values near the bf16 max and infinities.
TEST(QuantNvfp4, FusedHadamardButterflyEqualsPlain) {
  int64_t bad = 0;
  for (int it = 0; it < 50000; ++it) {
    float a[16], b[16];
    for (int i = 0; i < 16; ++i) {
      const uint64_t idx = uint64_t(16 * it + i);
      const uint32_t u = philox_uint32(21, 0, idx);
      const uint16_t bits = uint16_t(philox_uint32(22, 0, idx) >> 16);
      float v;
      switch (u % 8) {
        case 0: v = bf16_to_f32(bits); break;  // any pattern: NaN, inf, subnormal, huge
        case 1: v = (u & 0x100u) ? -0.0f : 0.0f; break;
        case 2: v = bf16_to_f32(uint16_t(bits & 0x807Fu)); break;              // bf16 subnormals
        case 3: v = bf16_to_f32(uint16_t(0x7F00u | (bits & 0x807Fu))); break;  // near max
        case 4: v = (u & 0x100u) ? -INFINITY : INFINITY; break;
        default: v = bf16_to_f32(f32_to_bf16_rn(philox_uniform(23, 0, idx) * 4.0f - 2.0f));
      }
      a[i] = b[i] = v;
    }
    rht16_butterfly_f32(a);
    rht16_butterfly_f32_fused(b);
    for (int i = 0; i < 16; ++i) {
      const bool same = f32_is_nan(a[i]) ? f32_is_nan(b[i]) : f32_bits(a[i]) == f32_bits(b[i]);
      if (!same && ++bad <= 8) {
        ADD_FAILURE() << std::hex << "it " << std::dec << it << " i " << i << std::hex
                      << ": plain 0x" << f32_bits(a[i]) << " fused 0x" << f32_bits(b[i]);
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

}  // namespace
}  // namespace lowbit
