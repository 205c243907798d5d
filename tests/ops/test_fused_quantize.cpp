// rmsnorm_fwd_quantize and swiglu_fwd_quantize on the CPU: the contract (exactly the bytes of the
// op followed by quantize()) for every copy choice and several recipes, with and without the
// bf16 output, the delayed-scaling history, odd shapes, and the argument errors.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "lowbit/ops.h"
#include "lowbit/quant.h"
#include "ops/op_harness.h"
#include "ops/quant_compare.h"

namespace lowbit::test {
namespace {

constexpr float kEps = 1e-5f;

// [n, k] bf16 on the CPU: gaussian(stddev), with ±inf and NaN sprinkled when `specials`.
Tensor source(int64_t n, int64_t k, double stddev, uint64_t seed, bool specials) {
  Tensor t = Tensor::empty({n, k}, DType::kBF16, Device::cpu());
  for (int64_t i = 0; i < n * k; ++i) {
    double v = stddev * detail::philox_gauss(seed, 0, i);
    if (specials && i % 97 == 5) v = INFINITY;
    if (specials && i % 101 == 7) v = -INFINITY;
    if (specials && i % 89 == 3) v = NAN;
    t.ptr<uint16_t>()[i] = f32_to_bf16_rn(float(v));
  }
  return t;
}

// A recipe: how to build the config (given a delayed-scaling state when it uses one) and the
// multiple both dims must have.
struct Recipe {
  std::string name;
  bool delayed;
  ScalingPass pass;
  std::function<QuantConfig(DelayedScalingState*)> make;
  int64_t align;
};

std::vector<Recipe> recipes() {
  auto delayed = [](bool row, bool col) {
    return [row, col](DelayedScalingState* st) {
      QuantConfig c = QuantConfig::fp8_delayed(*st, 1);
      c.rowwise = row;
      c.columnwise = col;
      return c;
    };
  };
  std::vector<Recipe> r;
  r.push_back({"delayed_row", true, ScalingPass::kForward, delayed(true, false), 1});
  r.push_back({"delayed_col", true, ScalingPass::kForward, delayed(false, true), 1});
  r.push_back({"delayed_both", true, ScalingPass::kForward, delayed(true, true), 1});
  r.push_back({"delayed_e5m2", true, ScalingPass::kBackward, delayed(true, true), 1});
  r.push_back({"current", false, ScalingPass::kForward,
               [](DelayedScalingState*) { return QuantConfig::fp8_current(); }, 1});
  r.push_back({"block1x128", false, ScalingPass::kForward,
               [](DelayedScalingState*) { return QuantConfig::fp8_block_1x128(); }, 1});
  r.push_back({"mxfp8", false, ScalingPass::kForward,
               [](DelayedScalingState*) { return QuantConfig::mx(); }, 32});
  r.push_back({"nvfp4", false, ScalingPass::kForward,
               [](DelayedScalingState*) { return QuantConfig::nvfp4_activation(); }, 16});
  return r;
}

DelayedScalingState make_state(ScalingPass pass) {
  DelayedScalingConfig dc;
  dc.history_len = 4;
  DelayedScalingState st(dc, pass, 2, Device::cpu());
  prime_state(st, 1, 0.75f);  // scale 448 / 0.75: values above 0.75 saturate (E4M3)
  return st;
}

struct Shape2 {
  int64_t n, d;
};
const Shape2 kShapes[] = {{1, 16}, {65, 80}, {33, 24}, {64, 96}, {7, 513}, {3, 8}};

TEST(FusedQuantize, RmsNormIsTheComposition) {
  Context ctx(Device::cpu());
  for (const Shape2& s : kShapes) {
    for (const Recipe& rc : recipes()) {
      if (s.n % rc.align != 0 || s.d % rc.align != 0) continue;
      for (const bool specials : {false, true}) {
        SCOPED_TRACE(fmt::format("{}x{} {} {}", s.n, s.d, rc.name, specials ? "specials" : ""));
        const Tensor x = source(s.n, s.d, 2.0, 11, specials);
        const Tensor w =
            Tensor::copy_of(source(1, s.d, 0.5, 12, false).view().reshape({s.d}), Device::cpu());
        DelayedScalingState s_fused = make_state(rc.pass), s_ref = make_state(rc.pass),
                            s_absent = make_state(rc.pass);
        // The definition: rmsnorm_fwd, then quantize.
        Tensor y_ref = Tensor::empty({s.n, s.d}, DType::kBF16, Device::cpu());
        Tensor r_ref = Tensor::empty({s.n}, DType::kF32, Device::cpu());
        QuantizedTensor q_ref;
        rmsnorm_fwd(ctx, y_ref, r_ref, x, w, kEps);
        quantize(ctx, y_ref, rc.make(&s_ref), q_ref);
        // The fused op with y and rstd.
        Tensor y = Tensor::empty({s.n, s.d}, DType::kBF16, Device::cpu());
        Tensor r = Tensor::empty({s.n}, DType::kF32, Device::cpu());
        QuantizedTensor q;
        rmsnorm_fwd_quantize(ctx, y, r, x, w, kEps, rc.make(&s_fused), q);
        EXPECT_TRUE(same_quantized(q_ref, q));
        EXPECT_TRUE(same_bytes("y", y_ref, y));
        EXPECT_TRUE(same_bytes("rstd", r_ref, r));
        // Without them.
        QuantizedTensor q2;
        rmsnorm_fwd_quantize(ctx, TensorView(), TensorView(), x, w, kEps, rc.make(&s_absent), q2);
        EXPECT_TRUE(same_quantized(q_ref, q2));
        if (rc.delayed) {
          EXPECT_TRUE(same_bytes("history", s_ref.amax_history(), s_fused.amax_history()));
          EXPECT_TRUE(same_bytes("history", s_ref.amax_history(), s_absent.amax_history()));
          // The amax went into slot 1 of the current row; slot 0 untouched.
          EXPECT_EQ(s_fused.history_at(0, 0), 0.0f);
          EXPECT_EQ(f32_bits(s_fused.history_at(0, 1)), f32_bits(q.amax.ptr<float>()[0]));
        }
      }
    }
  }
}

TEST(FusedQuantize, SwigluIsTheComposition) {
  Context ctx(Device::cpu());
  for (const Shape2& s : kShapes) {
    for (const Recipe& rc : recipes()) {
      if (s.n % rc.align != 0 || s.d % rc.align != 0) continue;
      for (const bool specials : {false, true}) {
        SCOPED_TRACE(fmt::format("{}x{} {} {}", s.n, s.d, rc.name, specials ? "specials" : ""));
        const Tensor gu = source(s.n, 2 * s.d, 3.0, 21, specials);  // [N, 2F]
        DelayedScalingState s_fused = make_state(rc.pass), s_ref = make_state(rc.pass),
                            s_absent = make_state(rc.pass);
        Tensor h_ref = Tensor::empty({s.n, s.d}, DType::kBF16, Device::cpu());
        QuantizedTensor q_ref;
        swiglu_fwd(ctx, h_ref, gu);
        quantize(ctx, h_ref, rc.make(&s_ref), q_ref);
        Tensor h = Tensor::empty({s.n, s.d}, DType::kBF16, Device::cpu());
        QuantizedTensor q;
        swiglu_fwd_quantize(ctx, h, gu, rc.make(&s_fused), q);
        EXPECT_TRUE(same_quantized(q_ref, q));
        EXPECT_TRUE(same_bytes("h", h_ref, h));
        QuantizedTensor q2;
        swiglu_fwd_quantize(ctx, TensorView(), gu, rc.make(&s_absent), q2);
        EXPECT_TRUE(same_quantized(q_ref, q2));
        if (rc.delayed) {
          EXPECT_TRUE(same_bytes("history", s_ref.amax_history(), s_fused.amax_history()));
          EXPECT_TRUE(same_bytes("history", s_ref.amax_history(), s_absent.amax_history()));
        }
      }
    }
  }
}

TEST(FusedQuantize, SwigluBackwardIsTheComposition) {
  Context ctx(Device::cpu());
  for (const Shape2& s : kShapes) {
    for (const Recipe& rc : recipes()) {
      if (s.n % rc.align != 0 || (2 * s.d) % rc.align != 0) continue;
      for (const bool specials : {false, true}) {
        SCOPED_TRACE(fmt::format("{}x{} {} {}", s.n, s.d, rc.name, specials ? "specials" : ""));
        const Tensor gu = source(s.n, 2 * s.d, 3.0, 23, specials);  // [N, 2F]
        const Tensor dy = source(s.n, s.d, 1.0, 24, specials);      // [N, F]
        DelayedScalingState s_fused = make_state(rc.pass), s_ref = make_state(rc.pass),
                            s_absent = make_state(rc.pass);
        Tensor d_ref = Tensor::empty({s.n, 2 * s.d}, DType::kBF16, Device::cpu());
        QuantizedTensor q_ref;
        swiglu_bwd(ctx, d_ref, dy, gu);
        quantize(ctx, d_ref, rc.make(&s_ref), q_ref);
        Tensor d = Tensor::empty({s.n, 2 * s.d}, DType::kBF16, Device::cpu());
        QuantizedTensor q;
        swiglu_bwd_quantize(ctx, d, dy, gu, rc.make(&s_fused), q);
        EXPECT_TRUE(same_quantized(q_ref, q));
        EXPECT_TRUE(same_bytes("dgate_up", d_ref, d));
        QuantizedTensor q2;
        swiglu_bwd_quantize(ctx, TensorView(), dy, gu, rc.make(&s_absent), q2);
        EXPECT_TRUE(same_quantized(q_ref, q2));
        if (rc.delayed) {
          EXPECT_TRUE(same_bytes("history", s_ref.amax_history(), s_fused.amax_history()));
          EXPECT_TRUE(same_bytes("history", s_ref.amax_history(), s_absent.amax_history()));
        }
      }
    }
  }
}

// swiglu_bwd_quantize_with_h: both results equal the two ops run one after the other, for every
// recipe of h (the down linear's input, forward state) and of dgate_up (backward state).
TEST(FusedQuantize, SwigluBackwardWithHIsTheComposition) {
  Context ctx(Device::cpu());
  const std::vector<Recipe> rs = recipes();
  for (const Shape2& s : kShapes) {
    for (const Recipe& rc : rs) {
      const Recipe& rh = rs[(&rc - rs.data() + 2) % rs.size()];  // another recipe for h
      if (s.n % rc.align != 0 || (2 * s.d) % rc.align != 0) continue;
      if (s.n % rh.align != 0 || s.d % rh.align != 0) continue;
      SCOPED_TRACE(fmt::format("{}x{} dgate_up {} h {}", s.n, s.d, rc.name, rh.name));
      const Tensor gu = source(s.n, 2 * s.d, 3.0, 23, true);  // [N, 2F]
      const Tensor dy = source(s.n, s.d, 1.0, 24, true);      // [N, F]
      DelayedScalingState s_ref = make_state(rc.pass), s_with = make_state(rc.pass);
      DelayedScalingState h_ref = make_state(rh.pass), h_with = make_state(rh.pass);
      QuantizedTensor q_ref, qh_ref, q, qh;
      swiglu_fwd_quantize(ctx, TensorView(), gu, rh.make(&h_ref), qh_ref);
      swiglu_bwd_quantize(ctx, TensorView(), dy, gu, rc.make(&s_ref), q_ref);
      Tensor d = Tensor::empty({s.n, 2 * s.d}, DType::kBF16, Device::cpu());
      Tensor d_ref = Tensor::empty({s.n, 2 * s.d}, DType::kBF16, Device::cpu());
      swiglu_bwd(ctx, d_ref, dy, gu);
      swiglu_bwd_quantize_with_h(ctx, d, dy, gu, rc.make(&s_with), q, rh.make(&h_with), qh);
      EXPECT_TRUE(same_quantized(q_ref, q));
      EXPECT_TRUE(same_quantized(qh_ref, qh));
      EXPECT_TRUE(same_bytes("dgate_up", d_ref, d));
      if (rc.delayed)
        EXPECT_TRUE(same_bytes("history", s_ref.amax_history(), s_with.amax_history()));
      if (rh.delayed)
        EXPECT_TRUE(same_bytes("history", h_ref.amax_history(), h_with.amax_history()));
    }
  }
}

TEST(FusedQuantize, BadArgumentsAreUserErrors) {
  Context ctx(Device::cpu());
  const Device cpu = Device::cpu();
  Tensor x = Tensor::zeros({4, 8}, DType::kBF16, cpu), y = Tensor::zeros({4, 8}, DType::kBF16, cpu);
  Tensor w = Tensor::zeros({8}, DType::kBF16, cpu), rstd = Tensor::zeros({4}, DType::kF32, cpu);
  const QuantConfig cfg = QuantConfig::fp8_current();
  QuantizedTensor q;
  Tensor xf = Tensor::zeros({4, 8}, DType::kF32, cpu);
  EXPECT_TRUE(throws_user_error([&] { rmsnorm_fwd_quantize(ctx, y, rstd, xf, w, kEps, cfg, q); },
                                {"rmsnorm_fwd_quantize", "x must be bf16"}));
  Tensor y_t = Tensor::zeros({8, 4}, DType::kBF16, cpu);
  EXPECT_TRUE(throws_user_error([&] { rmsnorm_fwd_quantize(ctx, y_t, rstd, x, w, kEps, cfg, q); },
                                {"rmsnorm_fwd_quantize", "y has shape [8, 4]", "x has [4, 8]"}));
  Tensor yf = Tensor::zeros({4, 8}, DType::kF32, cpu);
  EXPECT_TRUE(throws_user_error([&] { rmsnorm_fwd_quantize(ctx, yf, rstd, x, w, kEps, cfg, q); },
                                {"y must be bf16"}));
  Tensor rstd3 = Tensor::zeros({3}, DType::kF32, cpu);
  EXPECT_TRUE(throws_user_error([&] { rmsnorm_fwd_quantize(ctx, y, rstd3, x, w, kEps, cfg, q); },
                                {"rstd [N] has 3 entries", "N = 4"}));
  Tensor w9 = Tensor::zeros({9}, DType::kBF16, cpu);
  EXPECT_TRUE(throws_user_error([&] { rmsnorm_fwd_quantize(ctx, y, rstd, x, w9, kEps, cfg, q); },
                                {"w [D] has 9 elements"}));
  EXPECT_TRUE(
      throws_user_error([&] { rmsnorm_fwd_quantize(ctx, y, rstd, x, w, -1.0f, cfg, q); }, {"eps"}));
  // The quantization config is checked by quantize(): MX needs whole blocks of 32 along D.
  EXPECT_TRUE(throws_user_error(
      [&] { rmsnorm_fwd_quantize(ctx, y, rstd, x, w, kEps, QuantConfig::mx(), q); },
      {"K = 8 must be a multiple of 32"}));
  QuantConfig none = cfg;
  none.rowwise = none.columnwise = false;
  EXPECT_TRUE(throws_user_error([&] { rmsnorm_fwd_quantize(ctx, y, rstd, x, w, kEps, none, q); },
                                {"ask for the rowwise copy"}));
  DelayedScalingState st(DelayedScalingConfig{}, ScalingPass::kForward, 2, cpu);
  QuantConfig bad_slot = QuantConfig::fp8_delayed(st, 0);
  bad_slot.delayed_slot = 5;
  EXPECT_TRUE(
      throws_user_error([&] { rmsnorm_fwd_quantize(ctx, y, rstd, x, w, kEps, bad_slot, q); },
                        {"slot 5 out of range"}));

  Tensor gu = Tensor::zeros({4, 16}, DType::kBF16, cpu);
  EXPECT_TRUE(throws_user_error([&] { swiglu_fwd_quantize(ctx, y_t, gu, cfg, q); },
                                {"swiglu_fwd_quantize", "gate_up must be [N, 2F]"}));
  Tensor gu_odd = Tensor::zeros({4, 15}, DType::kBF16, cpu);
  EXPECT_TRUE(throws_user_error([&] { swiglu_fwd_quantize(ctx, TensorView(), gu_odd, cfg, q); },
                                {"swiglu_fwd_quantize", "even number of columns"}));
  Tensor gu_f = Tensor::zeros({4, 16}, DType::kF32, cpu);
  EXPECT_TRUE(throws_user_error([&] { swiglu_fwd_quantize(ctx, y, gu_f, cfg, q); },
                                {"gate_up must be bf16"}));
  EXPECT_TRUE(
      throws_user_error([&] { swiglu_fwd_quantize(ctx, TensorView(), gu, QuantConfig::mx(), q); },
                        {"multiple of 32"}));

  // swiglu_bwd_quantize: dout [N, F] against gate_up [N, 2F], dgate_up like gate_up.
  Tensor dout = Tensor::zeros({4, 8}, DType::kBF16, cpu);
  EXPECT_TRUE(throws_user_error([&] { swiglu_bwd_quantize(ctx, TensorView(), y_t, gu, cfg, q); },
                                {"swiglu_bwd_quantize", "gate_up must be [N, 2F]"}));
  Tensor dgu_small = Tensor::zeros({4, 8}, DType::kBF16, cpu);
  EXPECT_TRUE(throws_user_error([&] { swiglu_bwd_quantize(ctx, dgu_small, dout, gu, cfg, q); },
                                {"swiglu_bwd_quantize", "dgate_up"}));
  Tensor dout_f = Tensor::zeros({4, 8}, DType::kF32, cpu);
  EXPECT_TRUE(throws_user_error([&] { swiglu_bwd_quantize(ctx, TensorView(), dout_f, gu, cfg, q); },
                                {"dout must be bf16"}));
  // swiglu_bwd_quantize_with_h: the same checks, and two distinct outputs.
  QuantizedTensor qh;
  EXPECT_TRUE(throws_user_error(
      [&] { swiglu_bwd_quantize_with_h(ctx, TensorView(), y_t, gu, cfg, q, cfg, qh); },
      {"swiglu_bwd_quantize_with_h", "gate_up must be [N, 2F]"}));
  EXPECT_TRUE(throws_user_error(
      [&] { swiglu_bwd_quantize_with_h(ctx, TensorView(), dout, gu, cfg, q, cfg, q); },
      {"swiglu_bwd_quantize_with_h", "different tensors"}));
  EXPECT_TRUE(throws_user_error(
      [&] {
        swiglu_bwd_quantize_with_h(ctx, TensorView(), dout, gu, cfg, q, QuantConfig::mx(), qh);
      },
      {"multiple of 32"}));
}

}  // namespace
}  // namespace lowbit::test
