// Gradient norm and clipping, CPU twin: per-segment norms against a long-double sum, the clip
// coefficient's cases (below / above the threshold, clipping off, inf and NaN giving skip = 1, a
// sum of squares beyond the fp32 range with a finite norm), a gradient whose norm is finite
// although its sum of squares is not representable in fp32 (clipped, not skipped), and the
// argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "lowbit/ops.h"
#include "ops/op_harness.h"
#include "user_error.h"

namespace lowbit {
namespace {

TEST(GradNorm, SegmentNormsMatchLongDouble) {
  // Sizes 0, 1, 7 and 100003, a gap, and values spanning several binades.
  const std::vector<ParamSegment> segs = {
      {0, 7, true}, {7, 1, false}, {8, 0, true}, {20, 100003, true}, {100023, 5, false}};
  const int64_t p = 100030;
  Tensor g = Tensor::empty({p}, DType::kF32, Device::cpu());
  for (int64_t i = 0; i < p; ++i) {
    const double u = philox_uniform(3, 0, uint64_t(i));
    const double sign = (philox_uint32(3, 1, uint64_t(i)) & 1) ? -1.0 : 1.0;
    g.ptr<float>()[i] = static_cast<float>(sign * std::ldexp(1.0 + u, int(i % 13) - 6));
  }
  Tensor ss = Tensor::empty({5}, DType::kF32, Device::cpu());
  Context ctx(Device::cpu());
  segment_norms(ctx, ss, g, segs);
  for (size_t s = 0; s < segs.size(); ++s) {
    long double want = 0;
    for (int64_t i = segs[s].offset; i < segs[s].offset + segs[s].numel; ++i) {
      want += static_cast<long double>(g.ptr<float>()[i]) * g.ptr<float>()[i];
    }
    // fp64 sums, an fp64 square root rounded once to fp32: within an fp32 ulp.
    const double norm = double(std::sqrt(want));
    EXPECT_LE(std::fabs(ss.ptr<float>()[s] - norm), 0x1p-23 * norm) << "segment " << s;
  }
  EXPECT_EQ(ss.ptr<float>()[2], 0.0f);
}

struct Clip {
  float norm, coef;
  int32_t skip;
};

Clip clip_of(const std::vector<float>& seg_norms, float max_norm) {  // seg_norms [S]
  Context ctx(Device::cpu());
  Tensor ss = Tensor::empty({int64_t(seg_norms.size())}, DType::kF32, Device::cpu());
  for (size_t i = 0; i < seg_norms.size(); ++i) ss.ptr<float>()[i] = seg_norms[i];
  Tensor norm = Tensor::empty({1}, DType::kF32, Device::cpu());
  Tensor coef = Tensor::empty({1}, DType::kF32, Device::cpu());
  Tensor skip = Tensor::empty({1}, DType::kI32, Device::cpu());
  clip_coefficient(ctx, norm, coef, skip, ss, max_norm);
  return {norm.ptr<float>()[0], coef.ptr<float>()[0], skip.ptr<int32_t>()[0]};
}

TEST(GradNorm, ClipCoefficientCases) {
  // Norm 5 (segment norms 3 and 4), below max_norm 10: no clipping.
  Clip c = clip_of({3.0f, 4.0f}, 10.0f);
  EXPECT_EQ(c.norm, 5.0f);
  EXPECT_EQ(c.coef, 1.0f);
  EXPECT_EQ(c.skip, 0);
  // Above: coef = max_norm / (norm + 1e-6), two fp32 roundings.
  c = clip_of({3.0f, 4.0f, 0.0f}, 1.0f);
  EXPECT_EQ(c.coef, 1.0f / (5.0f + 1e-6f));
  EXPECT_EQ(c.skip, 0);
  // Clipping off (max_norm ≤ 0): coef 1, the norm still reported.
  c = clip_of({10.0f}, 0.0f);
  EXPECT_EQ(c.norm, 10.0f);
  EXPECT_EQ(c.coef, 1.0f);
  c = clip_of({10.0f}, -1.0f);
  EXPECT_EQ(c.coef, 1.0f);
  // No segments: norm 0, coef 1.
  c = clip_of({}, 1.0f);
  EXPECT_EQ(c.norm, 0.0f);
  EXPECT_EQ(c.coef, 1.0f);
  EXPECT_EQ(c.skip, 0);
  // An inf or NaN segment: skip, coef 0.
  c = clip_of({1.0f, INFINITY}, 1.0f);
  EXPECT_EQ(c.norm, INFINITY);
  EXPECT_EQ(c.skip, 1);
  EXPECT_EQ(c.coef, 0.0f);
  c = clip_of({NAN, 1.0f}, 1.0f);
  EXPECT_TRUE(std::isnan(c.norm));
  EXPECT_EQ(c.skip, 1);
  EXPECT_EQ(c.coef, 0.0f);
  c = clip_of({NAN}, 0.0f);  // clipping off: coef 1, but the guard still fires
  EXPECT_EQ(c.skip, 1);
  EXPECT_EQ(c.coef, 1.0f);
  // Segment norms whose squares leave the fp32 range (2 · 1e40) but whose total norm does not:
  // clipped, not skipped.
  c = clip_of({1e20f, 1e20f}, 1.0f);
  EXPECT_EQ(c.skip, 0);
  EXPECT_EQ(c.norm, static_cast<float>(std::sqrt(2.0 * double(1e20f) * double(1e20f))));
  EXPECT_EQ(c.coef, 1.0f / (c.norm + 1e-6f));
  EXPECT_GT(c.coef, 0.0f);
  // A total norm beyond the fp32 range (segment norms 3e38): inf, skip.
  c = clip_of({3e38f, 3e38f}, 1.0f);
  EXPECT_EQ(c.norm, INFINITY);
  EXPECT_EQ(c.skip, 1);
}

TEST(GradNorm, NormOfSegmentsEndToEnd) {
  // A gradient with one inf: the segment holding it is inf, the norm too, skip is set.
  Context ctx(Device::cpu());
  Tensor g = Tensor::zeros({64}, DType::kF32, Device::cpu());
  for (int i = 0; i < 64; ++i) g.ptr<float>()[i] = 0.5f;
  g.ptr<float>()[40] = INFINITY;
  const std::vector<ParamSegment> segs = {{0, 32, true}, {32, 32, false}};
  Tensor ss = Tensor::empty({2}, DType::kF32, Device::cpu());
  segment_norms(ctx, ss, g, segs);
  EXPECT_EQ(ss.ptr<float>()[0], static_cast<float>(std::sqrt(8.0)));
  EXPECT_EQ(ss.ptr<float>()[1], INFINITY);
  const Clip c = clip_of({ss.ptr<float>()[0], ss.ptr<float>()[1]}, 1.0f);
  EXPECT_EQ(c.skip, 1);
}

TEST(GradNorm, ExplodingGradientIsClippedNotSkipped) {
  // 64 gradients of 1e20: each segment's sum of squares (3.2e41) is beyond fp32, its norm
  // (~5.7e20) and the total (8e20) are not. The step is clipped (coef = 1 / 8e20), not skipped.
  Context ctx(Device::cpu());
  Tensor g = Tensor::zeros({64}, DType::kF32, Device::cpu());
  for (int i = 0; i < 64; ++i) g.ptr<float>()[i] = 1e20f;
  const std::vector<ParamSegment> segs = {{0, 32, true}, {32, 32, false}};
  Tensor ss = Tensor::empty({2}, DType::kF32, Device::cpu());
  segment_norms(ctx, ss, g, segs);
  const double seg = std::sqrt(32.0) * double(1e20f);
  EXPECT_EQ(ss.ptr<float>()[0],
            static_cast<float>(std::sqrt(32.0 * double(1e20f) * double(1e20f))));
  EXPECT_NEAR(ss.ptr<float>()[1], seg, 1e-6 * seg);
  const Clip c = clip_of({ss.ptr<float>()[0], ss.ptr<float>()[1]}, 1.0f);
  EXPECT_EQ(c.skip, 0);
  EXPECT_NEAR(c.norm, 8.0 * double(1e20f), 1e-6 * 8e20);
  EXPECT_NEAR(c.coef, 1.0 / (8.0 * double(1e20f)), 1e-6 / 8e20);
}

TEST(GradNorm, ExplodingGradientStepIsAppliedClipped) {
  // The trainer's sequence (segment_norms, clip_coefficient, adamw_step with the coefficient as
  // grad_scale and the skip flag as guard) on gradients of 1e20: the step is applied, clipped to
  // norm 1, so that AdamW's first step moves every weight by lr (Adam normalises |g|) and decays
  // it.
  Context ctx(Device::cpu());
  const int64_t p = 64;
  Tensor g = Tensor::zeros({p}, DType::kF32, Device::cpu());
  Tensor master = Tensor::zeros({p}, DType::kF32, Device::cpu());
  Tensor m = Tensor::zeros({p}, DType::kF32, Device::cpu());
  Tensor v = Tensor::zeros({p}, DType::kF32, Device::cpu());
  for (int64_t i = 0; i < p; ++i) {
    g.ptr<float>()[i] = (i % 2 ? -1e20f : 1e20f);
    master.ptr<float>()[i] = 0.5f;
  }
  const std::vector<ParamSegment> segs = {{0, 32, true}, {32, 32, false}};
  Tensor norms = Tensor::empty({2}, DType::kF32, Device::cpu());
  Tensor norm = Tensor::empty({1}, DType::kF32, Device::cpu());
  Tensor coef = Tensor::empty({1}, DType::kF32, Device::cpu());
  Tensor skip = Tensor::empty({1}, DType::kI32, Device::cpu());
  segment_norms(ctx, norms, g, segs);
  clip_coefficient(ctx, norm, coef, skip, norms, 1.0f);
  ASSERT_EQ(skip.ptr<int32_t>()[0], 0);
  AdamWConfig cfg;
  cfg.lr = 1e-3f;
  cfg.weight_decay = 0.1f;
  cfg.step = 1;
  adamw_step(ctx, master, g, m, v, nullptr, segs, cfg, coef, skip);
  for (int64_t i = 0; i < p; ++i) {
    const float w = master.ptr<float>()[i];
    ASSERT_TRUE(std::isfinite(w)) << i;
    // 0.5 − lr · sign(g) (Adam's first step, |g| ≫ eps) − lr · wd · 0.5 where decay applies.
    const double want = 0.5 - 1e-3 * (i % 2 ? -1.0 : 1.0) - (i < 32 ? 1e-3 * 0.1 * 0.5 : 0.0);
    EXPECT_NEAR(w, want, 1e-6) << i;
  }
}

using test_util::user_error;

TEST(GradNorm, BadInputsAreUserErrors) {
  Context ctx(Device::cpu());
  Tensor g = Tensor::zeros({50}, DType::kF32, Device::cpu());
  Tensor ss = Tensor::zeros({2}, DType::kF32, Device::cpu());
  std::string msg = user_error([&] { segment_norms(ctx, ss, g, {{0, 10, true}}); });
  EXPECT_NE(msg.find("seg_norms [S] has 2 entries but 1 segments"), std::string::npos) << msg;
  msg = user_error([&] { segment_norms(ctx, ss, g, {{0, 10, true}, {45, 6, true}}); });
  EXPECT_NE(msg.find("segment 1 (offset 45, numel 6) does not lie inside grad of 50"),
            std::string::npos)
      << msg;
  msg = user_error([&] { segment_norms(ctx, ss, g, {{0, 10, true}, {5, 6, true}}); });
  EXPECT_NE(msg.find("overlap"), std::string::npos) << msg;
  Tensor g16 = Tensor::zeros({50}, DType::kBF16, Device::cpu());
  msg = user_error([&] { segment_norms(ctx, ss, g16, {{0, 10, true}, {10, 6, true}}); });
  EXPECT_NE(msg.find("grad must be f32"), std::string::npos) << msg;

  Tensor norm = Tensor::zeros({1}, DType::kF32, Device::cpu());
  Tensor coef = Tensor::zeros({1}, DType::kF32, Device::cpu());
  Tensor skip = Tensor::zeros({1}, DType::kI32, Device::cpu());
  msg = user_error([&] { clip_coefficient(ctx, norm, coef, skip, ss, NAN); });
  EXPECT_NE(msg.find("max_norm is NaN"), std::string::npos) << msg;
  msg = user_error([&] { clip_coefficient(ctx, norm, coef, coef, ss, 1.0f); });
  EXPECT_NE(msg.find("skip must be i32"), std::string::npos) << msg;
  Tensor two = Tensor::zeros({2}, DType::kF32, Device::cpu());
  msg = user_error([&] { clip_coefficient(ctx, two, coef, skip, ss, 1.0f); });
  EXPECT_NE(msg.find("norm must hold exactly one element"), std::string::npos) << msg;
}

}  // namespace
}  // namespace lowbit
