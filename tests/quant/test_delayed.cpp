// FP8 delayed scaling: amax history, scale updates, HYBRID format (formats.md §2.1, §2.2).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "quant/quant_test_util.h"

namespace lowbit {
namespace {

using namespace quant_test;

std::vector<float> history_col(const DelayedScalingState& st, int slot) {
  std::vector<float> h;
  for (int64_t r = 0; r < st.history_len(); ++r) h.push_back(st.history_at(r, slot));
  return h;
}

// Element-wise equality that treats NaN == NaN.
void expect_history(const DelayedScalingState& st, int slot, const std::vector<float>& want,
                    int step) {
  const std::vector<float> got = history_col(st, slot);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << "step " << step << " row " << i;
    } else {
      EXPECT_EQ(got[i], want[i]) << "step " << step << " row " << i;
    }
  }
}

// One scripted step: record `amax` (0 = slot unused), or inject a NaN through the reduction hook
// (NaN never enters through record_amax: the amax max skips NaN like TE's).
void step(DelayedScalingState& st, float amax) {
  if (std::isnan(amax)) {
    st.reduce_amax([](const TensorView& row) { row.ptr<float>()[0] = kNaN; });
  } else if (amax != 0.0f) {
    st.record_amax(0, amax);
  }
  st.reduce_amax({});  // one rank: no-op
  st.update();
}

TEST(QuantDelayedScaling, InitialState) {
  DelayedScalingState st({}, ScalingPass::kForward, 3);
  EXPECT_EQ(st.history_len(), 1024);
  EXPECT_EQ(st.amax_history().shape(), (Shape{1024, 3}));
  EXPECT_EQ(st.dtype(), DType::kE4M3);
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(st.scale_at(s), 1.0f);
    EXPECT_EQ(st.scale_inv().ptr<float>()[s], 1.0f);
    EXPECT_EQ(st.history_at(0, s), 0.0f);
    EXPECT_EQ(st.history_at(1023, s), 0.0f);
  }
}

TEST(QuantDelayedScaling, ScriptedMaxAlgorithm) {
  DelayedScalingConfig cfg;
  cfg.history_len = 4;
  DelayedScalingState st(cfg, ScalingPass::kForward, 1);  // E4M3, fmax 448
  struct Expect {
    float amax;
    std::vector<float> history;
    float scale;
  };
  const Expect script[] = {
      // 2 → rotated in at L-1; max 2 → 448/2.
      {2.0f, {0, 0, 0, 2}, 224.0f},
      // unused (amax 0) → not rotated, scale kept.
      {0.0f, {0, 0, 0, 2}, 224.0f},
      // inf → rotated; max window = inf → not finite → scale kept.
      {kInf, {0, 0, 2, kInf}, 224.0f},
      // NaN (NaN != 0 rotates); fmaxf skips it, window max still inf → kept.
      {kNaN, {0, 2, kInf, kNaN}, 224.0f},
      {1.0f, {0, kInf, kNaN, 1}, 224.0f},
      {0.5f, {0, kNaN, 1, 0.5f}, 224.0f},
      // inf left the window: max(NaN skipped, 1, 0.5, 0.25) = 1 → 448.
      {0.25f, {0, 1, 0.5f, 0.25f}, 448.0f},
      {0.25f, {0, 0.5f, 0.25f, 0.25f}, 448.0f},  // 1 is still in the window
      {1e-38f, {0, 0.25f, 0.25f, 1e-38f}, 896.0f},
  };
  int n = 0;
  for (const Expect& e : script) {
    step(st, e.amax);
    expect_history(st, 0, e.history, n);
    EXPECT_EQ(st.scale_at(0), e.scale) << "step " << n;
    EXPECT_EQ(st.scale_inv().ptr<float>()[0], 1.0f / e.scale) << "step " << n;
    ++n;
  }
  // Once only the tiny amax 1e-38 is left in the window, 448 / 1e-38 overflows fp32 → FLT_MAX.
  step(st, 1e-38f);
  EXPECT_EQ(st.scale_at(0), 1792.0f);
  step(st, 1e-38f);
  step(st, 1e-38f);
  EXPECT_EQ(st.scale_at(0), std::numeric_limits<float>::max());
}

TEST(QuantDelayedScaling, ScriptedMostRecentAndMargin) {
  DelayedScalingConfig cfg;
  cfg.history_len = 4;
  cfg.algo = AmaxComputeAlgo::kMostRecent;
  cfg.margin = 1;  // scaled max 448 / 2 = 224
  DelayedScalingState st(cfg, ScalingPass::kForward, 1);
  const float amaxes[] = {2.0f, 0.0f, kInf, kNaN, 1.0f, 0.5f, 0.25f};
  const float scales[] = {112.0f, 112.0f, 112.0f, 112.0f, 224.0f, 448.0f, 896.0f};
  for (int i = 0; i < 7; ++i) {
    step(st, amaxes[i]);
    EXPECT_EQ(st.scale_at(0), scales[i]) << "step " << i;
  }
  expect_history(st, 0, {0, 1, 0.5f, 0.25f}, 7);
}

TEST(QuantDelayedScaling, HybridFormatAndChecks) {
  DelayedScalingState bwd({}, ScalingPass::kBackward, 2);
  EXPECT_EQ(bwd.dtype(), DType::kE5M2);
  EXPECT_EQ(bwd.fmax(), 57344.0f);
  bwd.record_amax(1, 4.0f);
  bwd.update();
  EXPECT_EQ(bwd.scale_at(1), 14336.0f);
  EXPECT_EQ(bwd.scale_at(0), 1.0f);  // unused slot: untouched
  DelayedScalingConfig e4;
  e4.format = Fp8Format::kE4M3;
  EXPECT_EQ(DelayedScalingState(e4, ScalingPass::kBackward, 1).dtype(), DType::kE4M3);
  DelayedScalingConfig e5;
  e5.format = Fp8Format::kE5M2;
  EXPECT_THROW(DelayedScalingState(e5, ScalingPass::kForward, 1), UserError);
  DelayedScalingConfig bad;
  bad.history_len = 0;
  EXPECT_THROW(DelayedScalingState(bad, ScalingPass::kForward, 1), UserError);
  EXPECT_THROW(DelayedScalingState({}, ScalingPass::kForward, 0), UserError);
}

TEST(QuantDelayedScaling, ReductionHookAndInterval) {
  DelayedScalingConfig cfg;
  cfg.history_len = 3;
  cfg.update_interval = 2;
  DelayedScalingState st(cfg, ScalingPass::kForward, 2);
  st.record_amax(0, 1.0f);
  st.record_amax(0, 0.5f);  // max within a step
  // Another rank saw larger amaxes: the hook reduces row 0 (MAX) in place.
  const std::vector<float> other = {4.0f, 2.0f};
  const auto all_reduce_max = [&](const TensorView& row) {
    ASSERT_EQ(row.shape, (Shape{2}));
    for (int s = 0; s < 2; ++s) row.ptr<float>()[s] = std::max(row.ptr<float>()[s], other[s]);
  };
  st.reduce_amax(all_reduce_max);
  EXPECT_EQ(st.history_at(0, 0), 4.0f);
  st.update();  // first call of an interval of 2: nothing happens, amaxes keep accumulating
  EXPECT_EQ(st.scale_at(0), 1.0f);
  EXPECT_EQ(st.history_at(0, 1), 2.0f);
  st.record_amax(1, 8.0f);
  st.update();  // second call: roll and update
  EXPECT_EQ(st.scale_at(0), 112.0f);
  EXPECT_EQ(st.scale_at(1), 56.0f);
  EXPECT_EQ(st.history_at(2, 0), 4.0f);
  EXPECT_EQ(st.history_at(0, 0), 0.0f);
  EXPECT_EQ(st.update_calls(), 2);
}

TEST(QuantDelayedScaling, QuantizeUsesStaleScaleAndRecordsAmax) {
  DelayedScalingConfig cfg;
  cfg.history_len = 8;
  DelayedScalingState st(cfg, ScalingPass::kForward, 1);
  Context ctx(Device::cpu());
  const Tensor x = bf16_from(1, 4, {1000, -3, 0.5f, 470});
  QuantizedTensor q;
  quantize(ctx, x, QuantConfig::fp8_delayed(st, 0), q);
  q.validate();
  // Scale 1 (initial): 1000 and 470 exceed 448 and saturate (TE's satfinite cast).
  EXPECT_EQ(q.rowwise_scale_inv.ptr<float>()[0], 1.0f);
  EXPECT_EQ(code_at(q.rowwise_data, 0), 0x7Eu);
  EXPECT_EQ(code_at(q.rowwise_data, 3), 0x7Eu);
  EXPECT_EQ(code_at(q.rowwise_data, 1), encode_rn(DType::kE4M3, -3.0f));
  EXPECT_EQ(st.history_at(0, 0), 1000.0f);
  st.update();
  EXPECT_EQ(st.scale_at(0), 448.0f / 1000.0f);
  quantize(ctx, x, QuantConfig::fp8_delayed(st, 0), q);
  EXPECT_EQ(q.rowwise_scale_inv.ptr<float>()[0], 1.0f / (448.0f / 1000.0f));
  EXPECT_EQ(code_at(q.rowwise_data, 0), encode_rn(DType::kE4M3, 1000.0f * (448.0f / 1000.0f)));
  // The columnwise copy shares the scale and is the exact transpose ([3, 5]: distinct codes, so
  // that an untransposed copy cannot pass).
  std::vector<float> vals;
  for (int i = 0; i < 15; ++i) vals.push_back(float(i * 13 % 29) - 14.0f);
  const Tensor x35 = bf16_from(3, 5, vals);
  QuantizedTensor qt;
  quantize(ctx, x35, QuantConfig::fp8_delayed(st, 0), qt);
  qt.validate();
  ASSERT_EQ(qt.columnwise_data.shape()[0], 5);
  ASSERT_EQ(qt.columnwise_data.shape()[1], 3);
  EXPECT_EQ(qt.columnwise_scale_inv.ptr<float>()[0], qt.rowwise_scale_inv.ptr<float>()[0]);
  for (int64_t r = 0; r < 3; ++r) {
    for (int64_t c = 0; c < 5; ++c) {
      EXPECT_EQ(code_at(qt.columnwise_data, c * 3 + r), code_at(qt.rowwise_data, r * 5 + c))
          << r << ", " << c;
    }
  }
  EXPECT_NE(code_at(qt.columnwise_data, 1), code_at(qt.rowwise_data, 1));
  // Mismatched dtype, pow2 and slot range are rejected.
  QuantConfig bad = QuantConfig::fp8_delayed(st, 0);
  bad.dtype = DType::kE5M2;
  EXPECT_THROW(quantize(ctx, x, bad, q), UserError);
  bad = QuantConfig::fp8_delayed(st, 0);
  bad.pow2_scales = true;
  EXPECT_THROW(quantize(ctx, x, bad, q), UserError);
  bad = QuantConfig::fp8_delayed(st, 1);
  EXPECT_THROW(quantize(ctx, x, bad, q), UserError);
}

}  // namespace
}  // namespace lowbit
