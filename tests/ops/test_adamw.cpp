// Multi-tensor AdamW, CPU twin: several steps against a float64 evaluation of PyTorch's AdamW
// formula (weight-decay exemptions, grad_scale, eps-dominated elements), the exact fp32
// operation order of one step, the bf16 compute copy, the skip guard, gaps between segments left
// alone, and the argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "lowbit/formats.h"
#include "lowbit/ops.h"
#include "ops/op_harness.h"

namespace lowbit {
namespace {

// One arena on the host: master, grad, m, v [P] f32, compute [P] bf16, grad_scale [1] f32,
// skip [1] i32.
struct Arena {
  Tensor master, grad, m, v, compute, scale, skip;
  explicit Arena(int64_t p) {
    master = Tensor::zeros({p}, DType::kF32, Device::cpu());
    grad = Tensor::zeros({p}, DType::kF32, Device::cpu());
    m = Tensor::zeros({p}, DType::kF32, Device::cpu());
    v = Tensor::zeros({p}, DType::kF32, Device::cpu());
    compute = Tensor::zeros({p}, DType::kBF16, Device::cpu());
    scale = Tensor::zeros({1}, DType::kF32, Device::cpu());
    skip = Tensor::zeros({1}, DType::kI32, Device::cpu());
    scale.ptr<float>()[0] = 1.0f;
  }
  void step(Context& ctx, const std::vector<ParamSegment>& segs, const AdamWConfig& cfg) {
    const TensorView c = compute.view();
    adamw_step(ctx, master, grad, m, v, &c, segs, cfg, scale, skip);
  }
};

double gauss(uint64_t seed, uint64_t stream, int64_t i) {
  const double u1 = philox_uniform(seed, stream, 2 * uint64_t(i)) + 0x1p-25;
  const double u2 = philox_uniform(seed, stream, 2 * uint64_t(i) + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// Segments with gaps between them (elements 37..39, 41..63, 1105..1109 belong to none), one of
// a single element, one empty, two exempt from weight decay; the last holds tiny gradients
// (see grad_at) where eps dominates the denominator.
const std::vector<ParamSegment> kSegments = {{0, 37, true},   {40, 1, false},    {64, 1000, true},
                                             {1064, 0, true}, {1064, 41, false}, {1105, 0, false}};
constexpr int64_t kP = 1110;

float grad_at(int step, int64_t i) {
  const double g = gauss(77, uint64_t(step), i);
  return static_cast<float>(i >= 1064 ? 1e-9 * g : g);
}

// Compact bf16 copies (ParamSegment::compute_offset): the same master, m, v as the copies at
// the master's offsets, each copy at its own offset, kNoCompute segments without one, and
// overlapping or out-of-range copies rejected.
TEST(AdamW, CompactComputeCopiesGoToTheirOffsets) {
  Context ctx(Device::cpu());
  Arena same(kP), compact(kP);
  for (Arena* a : {&same, &compact}) {
    for (int64_t i = 0; i < kP; ++i) {
      a->master.ptr<float>()[i] = static_cast<float>(gauss(8, 0, i));
      a->grad.ptr<float>()[i] = grad_at(1, i);
    }
  }
  std::vector<ParamSegment> segs = kSegments;
  std::vector<int64_t> at(segs.size(), -1);
  int64_t next = 5;  // not a multiple of 4
  for (size_t i = 0; i < segs.size(); ++i) {
    if (i == 2) {
      segs[i].compute_offset = ParamSegment::kNoCompute;
      continue;
    }
    segs[i].compute_offset = at[i] = next;
    next += segs[i].numel;
  }
  AdamWConfig cfg;
  same.step(ctx, kSegments, cfg);
  compact.step(ctx, segs, cfg);
  EXPECT_EQ(std::memcmp(same.master.data(), compact.master.data(), same.master.nbytes()), 0);
  EXPECT_EQ(std::memcmp(same.v.data(), compact.v.data(), same.v.nbytes()), 0);
  std::vector<bool> written(kP, false);
  for (size_t i = 0; i < segs.size(); ++i) {
    if (at[i] < 0) continue;
    for (int64_t e = 0; e < segs[i].numel; ++e) {
      ASSERT_EQ(compact.compute.ptr<uint16_t>()[at[i] + e],
                same.compute.ptr<uint16_t>()[segs[i].offset + e]);
      written[at[i] + e] = true;
    }
  }
  for (int64_t e = 0; e < kP; ++e) {
    if (!written[e]) ASSERT_EQ(compact.compute.ptr<uint16_t>()[e], 0) << e;  // untouched
  }
  // Two copies over the same elements, and a copy past the end of compute.
  std::vector<ParamSegment> bad = segs;
  bad[1].compute_offset = bad[0].compute_offset;
  EXPECT_THROW(compact.step(ctx, bad, cfg), UserError);
  bad = segs;
  bad[4].compute_offset = kP - 3;
  EXPECT_THROW(compact.step(ctx, bad, cfg), UserError);
}

TEST(AdamW, MatchesFloat64PyTorchFormulaOverSteps) {
  Context ctx(Device::cpu());
  Arena a(kP);
  for (int64_t i = 0; i < kP; ++i) a.master.ptr<float>()[i] = static_cast<float>(gauss(5, 0, i));
  a.scale.ptr<float>()[0] = 0.5f;
  AdamWConfig cfg;
  cfg.lr = 1e-2f;
  cfg.beta1 = 0.9f;
  cfg.beta2 = 0.95f;
  cfg.eps = 1e-8f;
  cfg.weight_decay = 0.1f;
  std::vector<double> p(kP), m(kP, 0.0), v(kP, 0.0), upd_sum(kP, 0.0), gmax(kP, 0.0);
  for (int64_t i = 0; i < kP; ++i) p[i] = a.master.ptr<float>()[i];
  const std::vector<float> initial(a.master.ptr<float>(), a.master.ptr<float>() + kP);
  const int kSteps = 6;
  for (int step = 1; step <= kSteps; ++step) {
    for (int64_t i = 0; i < kP; ++i) a.grad.ptr<float>()[i] = grad_at(step, i);
    cfg.step = step;
    a.step(ctx, kSegments, cfg);
    // PyTorch's AdamW in float64 (the config's fp32 values widened).
    const double lr = cfg.lr, b1 = cfg.beta1, b2 = cfg.beta2, eps = cfg.eps, wd = cfg.weight_decay;
    const double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
    for (const ParamSegment& s : kSegments) {
      for (int64_t i = s.offset; i < s.offset + s.numel; ++i) {
        const double g = double(a.grad.ptr<float>()[i]) * 0.5;
        if (s.weight_decay) p[i] *= 1 - lr * wd;
        m[i] = b1 * m[i] + (1 - b1) * g;
        v[i] = b2 * v[i] + (1 - b2) * g * g;
        const double u = lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + eps);
        p[i] -= u;
        upd_sum[i] += std::fabs(u) + lr * wd * std::fabs(p[i]);
        gmax[i] = std::max(gmax[i], std::fabs(g));
      }
    }
  }
  std::vector<bool> in_segment(kP, false);
  for (const ParamSegment& s : kSegments) {
    for (int64_t i = s.offset; i < s.offset + s.numel; ++i) in_segment[i] = true;
  }
  for (int64_t i = 0; i < kP; ++i) {
    const float got_p = a.master.ptr<float>()[i];
    if (!in_segment[i]) {  // gaps: untouched
      ASSERT_EQ(got_p, initial[i]) << i;
      ASSERT_EQ(a.m.ptr<float>()[i], 0.0f) << i;
      ASSERT_EQ(a.compute.ptr<uint16_t>()[i], 0) << i;
      continue;
    }
    // fp32 rounding: a few ulps of p per step, and a relative 1e-5 of each update (whose fp32
    // evaluation is ~10 roundings, and whose m may have cancelled).
    const double bp = kSteps * 0x1p-22 * std::fabs(p[i]) + 1e-5 * upd_sum[i];
    ASSERT_LE(std::fabs(got_p - p[i]), bp) << "master[" << i << "]: " << got_p << " vs " << p[i];
    const double bm = 1e-5 * (std::fabs(m[i]) + gmax[i]);
    ASSERT_LE(std::fabs(a.m.ptr<float>()[i] - m[i]), bm) << "m[" << i << "]";
    ASSERT_LE(std::fabs(a.v.ptr<float>()[i] - v[i]), 1e-5 * v[i]) << "v[" << i << "]";
    ASSERT_EQ(a.compute.ptr<uint16_t>()[i], f32_to_bf16_rn(got_p)) << "compute[" << i << "]";
  }
  // The eps-dominated segment moved by much less than lr per step, the others by about lr.
  EXPECT_LT(std::fabs(a.master.ptr<float>()[1064] - initial[1064]), 0.5 * kSteps * cfg.lr);
  EXPECT_GT(std::fabs(a.master.ptr<float>()[100] - initial[100]), 0.1 * cfg.lr);
}

// Forces one fp32 rounding per operation (a volatile round trip cannot be fused into an FMA);
// the fused steps are explicit std::fma calls.
float rn(float x) {
  volatile float r = x;
  return r;
}

// One step of the documented fp32 order (src/ops/adamw_impl.h), operation by operation.
void documented_step(float& p, float& m, float& v, float grad, float scale, bool decay,
                     const AdamWConfig& c) {
  const double lr = c.lr, wd = c.weight_decay, t = double(c.step);
  const float decay_f = float(1.0 - lr * wd), w1 = float(1.0 - double(c.beta1));
  const float w2 = float(1.0 - double(c.beta2));
  const float c2 = float(std::sqrt(1.0 - std::pow(double(c.beta2), t)));
  const float s1 = float(-(lr / (1.0 - std::pow(double(c.beta1), t))));
  const float g = rn(grad * scale);
  if (decay) p = rn(p * decay_f);
  if (w1 < 0.5f) {
    m = std::fma(w1, rn(g - m), m);
  } else {
    m = std::fma(rn(w1 - 1.0f), rn(g - m), g);
  }
  v = std::fma(rn(w2 * g), g, rn(v * c.beta2));
  const float d = rn(rn(std::sqrt(v) / c2) + c.eps);
  p = rn(p + rn(rn(s1 * m) / d));
}

TEST(AdamW, FollowsTheDocumentedFp32OperationOrder) {
  Context ctx(Device::cpu());
  for (const float beta1 : {0.9f, 0.3f}) {  // 0.3: torch.lerp's other branch (weight ≥ 0.5)
    Arena a(kP);
    AdamWConfig cfg;
    cfg.lr = 3e-3f;
    cfg.beta1 = beta1;
    cfg.beta2 = 0.999f;
    cfg.weight_decay = 0.05f;
    cfg.step = 7;
    a.scale.ptr<float>()[0] = 0.37f;
    std::vector<float> p(kP), m(kP), v(kP);
    for (int64_t i = 0; i < kP; ++i) {
      p[i] = a.master.ptr<float>()[i] = float(gauss(9, 0, i));
      m[i] = a.m.ptr<float>()[i] = float(0.1 * gauss(9, 1, i));
      v[i] = a.v.ptr<float>()[i] = float(0.01 * std::fabs(gauss(9, 2, i)));
      a.grad.ptr<float>()[i] = grad_at(3, i);
    }
    a.step(ctx, kSegments, cfg);
    for (const ParamSegment& s : kSegments) {
      for (int64_t i = s.offset; i < s.offset + s.numel; ++i) {
        documented_step(p[i], m[i], v[i], a.grad.ptr<float>()[i], 0.37f, s.weight_decay, cfg);
        ASSERT_EQ(f32_bits(a.master.ptr<float>()[i]), f32_bits(p[i])) << "master " << i;
        ASSERT_EQ(f32_bits(a.m.ptr<float>()[i]), f32_bits(m[i])) << "m " << i;
        ASSERT_EQ(f32_bits(a.v.ptr<float>()[i]), f32_bits(v[i])) << "v " << i;
      }
    }
  }
}

TEST(AdamW, WeightDecayOnlyWhereTheSegmentAsksForIt) {
  // Zero gradients and moments: the Adam term is 0 / eps = 0, leaving the decay alone.
  Context ctx(Device::cpu());
  Arena a(kP);
  for (int64_t i = 0; i < kP; ++i) a.master.ptr<float>()[i] = float(gauss(3, 0, i));
  const std::vector<float> before(a.master.ptr<float>(), a.master.ptr<float>() + kP);
  AdamWConfig cfg;
  cfg.lr = 0.5f;
  cfg.weight_decay = 0.1f;
  a.step(ctx, kSegments, cfg);
  const float decay = float(1.0 - 0.5 * double(0.1f));
  for (const ParamSegment& s : kSegments) {
    for (int64_t i = s.offset; i < s.offset + s.numel; ++i) {
      const float want = s.weight_decay ? before[i] * decay : before[i];
      ASSERT_EQ(a.master.ptr<float>()[i], want) << i;
    }
  }
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.data());
  return std::vector<uint8_t>(p, p + t.nbytes());
}

TEST(AdamW, SkipLeavesEverythingUntouched) {
  Context ctx(Device::cpu());
  Arena a(kP);
  for (int64_t i = 0; i < kP; ++i) {
    a.master.ptr<float>()[i] = float(gauss(1, 0, i));
    a.grad.ptr<float>()[i] = i == 70 ? NAN : float(gauss(1, 1, i));
    a.compute.ptr<uint16_t>()[i] = 0x1234;
  }
  a.skip.ptr<int32_t>()[0] = 1;
  const auto p0 = bytes_of(a.master), m0 = bytes_of(a.m), v0 = bytes_of(a.v);
  const auto c0 = bytes_of(a.compute);
  AdamWConfig cfg;
  a.step(ctx, kSegments, cfg);
  EXPECT_EQ(bytes_of(a.master), p0);
  EXPECT_EQ(bytes_of(a.m), m0);
  EXPECT_EQ(bytes_of(a.v), v0);
  EXPECT_EQ(bytes_of(a.compute), c0);
  // Without the guard the NaN gradient spreads into its element only.
  a.skip.ptr<int32_t>()[0] = 0;
  a.step(ctx, kSegments, cfg);
  EXPECT_TRUE(std::isnan(a.master.ptr<float>()[70]));
  EXPECT_TRUE(std::isfinite(a.master.ptr<float>()[71]));
}

TEST(AdamW, WithoutComputeCopyAndWithGradScaleZero) {
  // grad_scale 0 (clipping to nothing) equals a zero gradient; compute may be omitted.
  Context ctx(Device::cpu());
  Arena a(kP), b(kP);
  for (int64_t i = 0; i < kP; ++i) {
    a.master.ptr<float>()[i] = b.master.ptr<float>()[i] = float(gauss(4, 0, i));
    a.grad.ptr<float>()[i] = float(gauss(4, 1, i));
  }
  a.scale.ptr<float>()[0] = 0.0f;
  AdamWConfig cfg;
  adamw_step(ctx, a.master, a.grad, a.m, a.v, nullptr, kSegments, cfg, a.scale, a.skip);
  b.step(ctx, kSegments, cfg);
  EXPECT_EQ(bytes_of(a.master), bytes_of(b.master));
  EXPECT_EQ(bytes_of(a.m), bytes_of(b.m));
  EXPECT_EQ(bytes_of(a.compute), std::vector<uint8_t>(kP * 2, 0));
}

template <typename Fn>
std::string user_error(Fn fn) {
  try {
    fn();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(AdamW, BadInputsAreUserErrors) {
  Context ctx(Device::cpu());
  Arena a(100);
  AdamWConfig cfg;
  auto run = [&](const std::vector<ParamSegment>& segs, const AdamWConfig& c) {
    return user_error([&] { a.step(ctx, segs, c); });
  };
  EXPECT_EQ(run({{0, 100, true}}, cfg), "");
  std::string msg = run({{90, 11, true}}, cfg);
  EXPECT_NE(msg.find("segment 0 (offset 90, numel 11) does not lie inside master of 100"),
            std::string::npos)
      << msg;
  msg = run({{0, 10, true}, {50, 5, true}, {9, 2, false}}, cfg);
  EXPECT_NE(msg.find("segments 0 (offset 0, numel 10) and 2 (offset 9, numel 2) overlap"),
            std::string::npos)
      << msg;
  msg = run({{-1, 3, true}}, cfg);
  EXPECT_NE(msg.find("does not lie inside"), std::string::npos) << msg;
  AdamWConfig bad = cfg;
  bad.step = 0;
  EXPECT_NE(run({{0, 100, true}}, bad).find("step must be at least 1"), std::string::npos);
  bad = cfg;
  bad.beta2 = 1.0f;
  EXPECT_NE(run({{0, 100, true}}, bad).find("beta2 must be in [0, 1)"), std::string::npos);
  bad = cfg;
  bad.lr = NAN;
  EXPECT_NE(run({{0, 100, true}}, bad).find("lr must be finite"), std::string::npos);

  Tensor short_grad = Tensor::zeros({99}, DType::kF32, Device::cpu());
  msg = user_error([&] {
    adamw_step(ctx, a.master, short_grad, a.m, a.v, nullptr, {{0, 10, true}}, cfg, a.scale, a.skip);
  });
  EXPECT_NE(msg.find("grad has shape [99] but master has [100]"), std::string::npos) << msg;
  Tensor c32 = Tensor::zeros({100}, DType::kF32, Device::cpu());
  const TensorView c32v = c32.view();
  msg = user_error([&] {
    adamw_step(ctx, a.master, a.grad, a.m, a.v, &c32v, {{0, 10, true}}, cfg, a.scale, a.skip);
  });
  EXPECT_NE(msg.find("compute must be bf16"), std::string::npos) << msg;
  msg = user_error([&] {
    adamw_step(ctx, a.master, a.grad, a.m, a.m, nullptr, {{0, 10, true}}, cfg, a.scale, a.skip);
  });
  EXPECT_NE(msg.find("m and v share storage"), std::string::npos) << msg;
  Tensor skip_f32 = Tensor::zeros({1}, DType::kF32, Device::cpu());
  msg = user_error([&] {
    adamw_step(ctx, a.master, a.grad, a.m, a.v, nullptr, {{0, 10, true}}, cfg, a.scale, skip_f32);
  });
  EXPECT_NE(msg.find("skip must be i32"), std::string::npos) << msg;
  Tensor two = Tensor::zeros({2}, DType::kF32, Device::cpu());
  msg = user_error([&] {
    adamw_step(ctx, a.master, a.grad, a.m, a.v, nullptr, {{0, 10, true}}, cfg, two, a.skip);
  });
  EXPECT_NE(msg.find("grad_scale must hold exactly one element"), std::string::npos) << msg;
}

}  // namespace
}  // namespace lowbit
