// quant_clip_stats() on the CPU: hand-made cases with known saturation and underflow per mode,
// and on random heavy-tailed data a recount from dequantize() (checks each mode's scale
// indexing).
#include <gtest/gtest.h>

#include "quant_test_util.h"

namespace lowbit {
namespace {

using quant_test::bf16_from;
using quant_test::kNaN;
using quant_test::make_bf16;
using quant_test::run;

std::pair<int64_t, int64_t> counts_of(const Tensor& x, const QuantizedTensor& q) {
  Context ctx(Device::cpu());
  Tensor c = Tensor::zeros({2}, DType::kI64, Device::cpu());
  quant_clip_stats(ctx, x, q, c);
  return {c.ptr<int64_t>()[0], c.ptr<int64_t>()[1]};
}

TEST(QuantClipStats, DelayedScalingSaturatesAboveTheFormatMaxAndFlushesTinyValues) {
  // Scale 1 (a fresh state): 500 and -600 are clipped to ±448; 448 is exact and 460 merely
  // rounds to it; 1e-6 is below half the smallest E4M3 subnormal (2^-10) and becomes 0; 0 and
  // NaN count as neither.
  DelayedScalingState st(DelayedScalingConfig{}, ScalingPass::kForward, 1);
  const Tensor x =
      bf16_from(1, 10, {500.0f, 448.0f, 1e-6f, 0.0f, kNaN, -600.0f, 1.0f, -3e-7f, 460.0f, -456.0f});
  const QuantizedTensor q = run(x, QuantConfig::fp8_delayed(st, 0));
  EXPECT_EQ(counts_of(x, q), std::make_pair(int64_t(2), int64_t(2)));
}

TEST(QuantClipStats, CurrentScalingNeverSaturates) {
  const Tensor x = bf16_from(1, 4, {1e5f, -3.0f, 1e-30f, 2.0f});
  const QuantizedTensor q = run(x, QuantConfig::fp8_current());
  const auto [sat, under] = counts_of(x, q);
  EXPECT_EQ(sat, 0);
  EXPECT_EQ(under, 1);  // 1e-30 · (448 / 1e5) is far below E4M3's smallest subnormal
}

TEST(QuantClipStats, MxBlockFlushesValuesFarBelowItsAmax) {
  // Row 0's 1×32 block has amax 1000: the E8M0 scale is 4 (ceil rule), so 1e-9 becomes 0.
  const Tensor x = make_bf16(32, 32, [](int64_t i, int64_t j) {
    return i == 0 && j == 0 ? 1000.0f : i == 0 && j == 1 ? 1e-9f : 1.0f;
  });
  const QuantizedTensor q = run(x, QuantConfig::mx(DType::kE4M3));
  EXPECT_EQ(counts_of(x, q), std::make_pair(int64_t(0), int64_t(1)));
}

TEST(QuantClipStats, CountsAgreeWithDequantizeInEveryMode) {
  // Heavy-tailed data; recount from the dequantized rowwise copy and the codes.
  const Tensor x = make_bf16(256, 256, [](int64_t i, int64_t j) {
    const float u = philox_uniform(7, 0, uint64_t(i * 256 + j)) + 1e-7f;
    const float g = philox_uniform(7, 1, uint64_t(i * 256 + j)) - 0.5f;
    return g * std::exp(16.0f * (u - 0.5f)) * (j % 17 == 0 ? 1e-6f : 1.0f);
  });
  DelayedScalingState st(DelayedScalingConfig{}, ScalingPass::kForward, 1);
  const std::vector<std::pair<const char*, QuantConfig>> cfgs = {
      {"fp8_delayed", QuantConfig::fp8_delayed(st, 0)},
      {"fp8_current", QuantConfig::fp8_current()},
      {"fp8_block_1x128", QuantConfig::fp8_block_1x128()},
      {"fp8_block_128x128", QuantConfig::fp8_block_128x128()},
      {"mxfp8", QuantConfig::mx(DType::kE4M3)},
      {"mxfp8_floor", QuantConfig::mx(DType::kE4M3, MxScaleRounding::kFloor)},
      {"mxfp4", QuantConfig::mx(DType::kE2M1)},
      {"nvfp4_activation", QuantConfig::nvfp4_activation()},
      {"nvfp4_weight", QuantConfig::nvfp4_weight()},
  };
  for (const auto& [name, cfg] : cfgs) {
    const QuantizedTensor q = run(x, cfg);
    const Tensor d = dequantize(q, Usage::kRowwise);  // [256, 256] f32
    const uint32_t sign = q.dtype == DType::kE2M1 ? 0x8 : 0x80;
    const uint32_t top = q.dtype == DType::kE2M1 ? 0x7 : q.dtype == DType::kE5M2 ? 0x7B : 0x7E;
    // Max plus half its spacing, relative to the max: 464/448 (E4M3), 7/6 (E2M1).
    const float beyond = q.dtype == DType::kE2M1 ? 7.0f / 6.0f : 464.0f / 448.0f;
    int64_t sat = 0, under = 0;
    for (int64_t i = 0; i < 256 * 256; ++i) {
      const float xv = bf16_to_f32(x.ptr<uint16_t>()[i]);
      const float dv = d.ptr<float>()[i];  // what the element became
      const uint32_t mag = quant_test::code_at(q.rowwise_data, i) & ~sign;
      if (!std::isfinite(xv)) continue;
      if (xv != 0.0f && dv == 0.0f) ++under;
      if (mag == top && std::fabs(xv) > std::fabs(dv) * beyond * (1 + 1e-6f)) ++sat;
    }
    const auto got = counts_of(x, q);
    EXPECT_EQ(got.first, sat) << name;
    EXPECT_EQ(got.second, under) << name;
    if (std::string(name) == "fp8_delayed") EXPECT_GT(sat, 0) << "the data exceeds 448";
    EXPECT_GT(under, 0) << name;
  }
}

TEST(QuantClipStats, RejectsMismatchedInputs) {
  const Tensor x = make_bf16(4, 32, [](int64_t, int64_t) { return 1.0f; });
  QuantConfig cfg = QuantConfig::fp8_current();
  cfg.rowwise = false;
  cfg.columnwise = true;
  const QuantizedTensor colonly = run(x, cfg);
  Context ctx(Device::cpu());
  Tensor c = Tensor::zeros({2}, DType::kI64, Device::cpu());
  EXPECT_THROW(quant_clip_stats(ctx, x, colonly, c), UserError);
  const QuantizedTensor q = run(x, QuantConfig::fp8_current());
  const Tensor other = make_bf16(4, 64, [](int64_t, int64_t) { return 1.0f; });
  EXPECT_THROW(quant_clip_stats(ctx, other, q, c), UserError);
  Tensor bad = Tensor::zeros({2}, DType::kI32, Device::cpu());
  EXPECT_THROW(quant_clip_stats(ctx, x, q, bad), UserError);
}

}  // namespace
}  // namespace lowbit
