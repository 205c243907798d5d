// The fused op + quantize entry points on the CPU: the contract (exactly the bytes of the op
// followed by quantize()) for every copy choice and several recipes, with and without the bf16
// outputs, the delayed-scaling history, odd shapes, and the argument errors. On the CPU the fused
// ops are that composition, so these tests pin the API's plumbing (optional outputs, which slot
// of the history an amax lands in, argument checks); the fused CUDA kernels are compared with
// the same composition byte for byte in tests/gpu/test_ops_fused_quantize.cpp.
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

// rmsnorm_bwd_quantize: dx, dw and each optional quantized output equal rmsnorm_fwd_quantize
// (y), rmsnorm_bwd and quantize (dx) run one after the other, for every recipe of dx (the
// previous linear's dY, backward state) paired with another for y (forward state), with the
// residual aliasing dx or none.
TEST(FusedQuantize, RmsNormBackwardIsTheComposition) {
  Context ctx(Device::cpu());
  const std::vector<Recipe> rs = recipes();
  for (const Shape2& s : kShapes) {
    for (const Recipe& rc : rs) {
      const Recipe& ry = rs[(&rc - rs.data() + 3) % rs.size()];  // another recipe for y
      if (s.n % rc.align != 0 || s.d % rc.align != 0) continue;
      if (s.n % ry.align != 0 || s.d % ry.align != 0) continue;
      for (const int outputs : {1, 2, 3}) {  // bit 0: dx's codes, bit 1: y's
        const bool want_dx = outputs & 1, want_y = outputs & 2, residual = outputs != 2;
        SCOPED_TRACE(fmt::format("{}x{} dx {} y {}{}", s.n, s.d, want_dx ? rc.name : "-",
                                 want_y ? ry.name : "-", residual ? " residual" : ""));
        const Tensor x = source(s.n, s.d, 2.0, 31, true);
        const Tensor dout = source(s.n, s.d, 1.0, 32, true);
        const Tensor res = source(s.n, s.d, 0.5, 33, false);
        const Tensor w =
            Tensor::copy_of(source(1, s.d, 0.5, 34, false).view().reshape({s.d}), Device::cpu());
        Tensor rstd = Tensor::empty({s.n}, DType::kF32, Device::cpu());
        Tensor y0 = Tensor::empty({s.n, s.d}, DType::kBF16, Device::cpu());
        rmsnorm_fwd(ctx, y0, rstd, x, w, kEps);
        DelayedScalingState dx_ref = make_state(rc.pass), dx_st = make_state(rc.pass);
        DelayedScalingState y_ref = make_state(ry.pass), y_st = make_state(ry.pass);
        // The definition.
        Tensor d_ref = Tensor::copy_of(res.view(), Device::cpu());
        Tensor dw_ref = Tensor::zeros({s.d}, DType::kF32, Device::cpu());
        QuantizedTensor dxq_ref, yq_ref;
        if (want_y) rmsnorm_fwd_quantize(ctx, {}, {}, x, w, kEps, ry.make(&y_ref), yq_ref);
        rmsnorm_bwd(ctx, d_ref, dw_ref, dout, x, w, rstd, residual ? d_ref.view() : TensorView());
        if (want_dx) quantize(ctx, d_ref, rc.make(&dx_ref), dxq_ref);
        // The op.
        Tensor d = Tensor::copy_of(res.view(), Device::cpu());
        Tensor dw = Tensor::zeros({s.d}, DType::kF32, Device::cpu());
        QuantizedTensor dxq, yq;
        const QuantConfig dxc = rc.make(&dx_st), yc = ry.make(&y_st);
        rmsnorm_bwd_quantize(ctx, d, dw, dout, x, w, rstd, residual ? d.view() : TensorView(), kEps,
                             want_dx ? &dxc : nullptr, want_dx ? &dxq : nullptr,
                             want_y ? &yc : nullptr, want_y ? &yq : nullptr);
        EXPECT_TRUE(same_bytes("dx", d_ref, d));
        EXPECT_TRUE(same_bytes("dw", dw_ref, dw));
        if (want_dx) EXPECT_TRUE(same_quantized(dxq_ref, dxq));
        if (want_y) EXPECT_TRUE(same_quantized(yq_ref, yq));
        if (rc.delayed)
          EXPECT_TRUE(same_bytes("history", dx_ref.amax_history(), dx_st.amax_history()));
        if (ry.delayed)
          EXPECT_TRUE(same_bytes("history", y_ref.amax_history(), y_st.amax_history()));
      }
    }
  }
}

// rope_bwd_quantize: dx and the codes equal a copy of dy with rope_bwd applied to its first
// n_rot heads, then quantize() of the [B·T, nH·Dh] matrix — with dx separate, in place (dx = dy)
// or absent.
TEST(FusedQuantize, RopeBackwardIsTheComposition) {
  Context ctx(Device::cpu());
  struct Heads {
    int64_t b, t, nh, dh, n_rot;
  };
  const Heads kHeads[] = {{2, 5, 3, 16, 2}, {1, 7, 4, 32, 4}, {3, 4, 2, 8, 0}, {1, 16, 6, 64, 5}};
  for (const Heads& hs : kHeads) {
    const int64_t n = hs.b * hs.t, w = hs.nh * hs.dh;
    Tensor table = Tensor::empty({hs.t, hs.dh / 2, 2}, DType::kF32, Device::cpu());
    rope_table(ctx, table, RopeConfig{});
    for (const Recipe& rc : recipes()) {
      if (n % rc.align != 0 || w % rc.align != 0) continue;
      for (const int mode : {0, 1, 2}) {  // dx separate, in place, absent
        SCOPED_TRACE(fmt::format("{}x{}x{}x{} rot {} {} dx {}", hs.b, hs.t, hs.nh, hs.dh, hs.n_rot,
                                 rc.name,
                                 mode == 0   ? "separate"
                                 : mode == 1 ? "in place"
                                             : "absent"));
        const Shape shape{hs.b, hs.t, hs.nh, hs.dh};
        const Tensor dy0 = source(n, w, 1.0, 41, true);  // [B·T, nH·Dh]
        DelayedScalingState s_ref = make_state(rc.pass), s_op = make_state(rc.pass);
        // The definition.
        Tensor d_ref = Tensor::copy_of(dy0.view(), Device::cpu());
        const TensorView d4 = d_ref.view().reshape(shape);
        if (hs.n_rot > 0) {
          const TensorView rot(d4.data, DType::kBF16, Shape{hs.b, hs.t, hs.n_rot, hs.dh},
                               d4.strides, Device::cpu());
          rope_bwd(ctx, rot, rot, table);
        }
        QuantizedTensor q_ref;
        quantize(ctx, d_ref, rc.make(&s_ref), q_ref);
        // The op.
        Tensor dy = Tensor::copy_of(dy0.view(), Device::cpu());
        Tensor dx = Tensor::empty({n, w}, DType::kBF16, Device::cpu());
        const TensorView dy4 = dy.view().reshape(shape);
        const TensorView dx4 = mode == 0   ? dx.view().reshape(shape)
                               : mode == 1 ? dy4
                                           : TensorView();
        QuantizedTensor q;
        rope_bwd_quantize(ctx, dx4, dy4, hs.n_rot, table, rc.make(&s_op), q);
        EXPECT_TRUE(same_quantized(q_ref, q));
        if (mode == 0) EXPECT_TRUE(same_bytes("dx", d_ref, dx));
        if (mode == 1) EXPECT_TRUE(same_bytes("dx (in place)", d_ref, dy));
        if (mode != 1) EXPECT_TRUE(same_bytes("dy unchanged", dy0, dy));
        if (rc.delayed)
          EXPECT_TRUE(same_bytes("history", s_ref.amax_history(), s_op.amax_history()));
      }
    }
  }
}

// attention_bwd_quantize_out: attention_bwd's gradients, and the forward's output quantized as
// the projection's wgrad input, exactly as attention_bwd followed by quantize().
TEST(FusedQuantize, AttentionBackwardQuantizeOutIsTheComposition) {
  Context ctx(Device::cpu());
  const Device cpu = Device::cpu();
  struct Heads {
    int64_t b, t, h, hkv, dh;
  };
  const Heads kHeads[] = {{1, 5, 2, 1, 64}, {2, 32, 4, 2, 64}, {1, 16, 2, 2, 128}};
  for (const Heads& hs : kHeads) {
    const int64_t n = hs.b * hs.t, w = hs.h * hs.dh, wkv = hs.hkv * hs.dh;
    const float scale = 1.0f / std::sqrt(float(hs.dh));
    const Shape sq{hs.b, hs.t, hs.h, hs.dh}, skv{hs.b, hs.t, hs.hkv, hs.dh};
    const Tensor q = source(n, w, 1.0, 51, false), k = source(n, wkv, 1.0, 52, false);
    const Tensor v = source(n, wkv, 1.0, 53, false), dout = source(n, w, 1.0, 54, false);
    Tensor out = Tensor::empty({n, w}, DType::kBF16, cpu);
    Tensor lse = Tensor::empty({hs.b, hs.h, hs.t}, DType::kF32, cpu);
    attention_fwd(ctx, out.view().reshape(sq), lse, q.view().reshape(sq), k.view().reshape(skv),
                  v.view().reshape(skv), scale);
    for (const Recipe& rc : recipes()) {
      if (n % rc.align != 0 || w % rc.align != 0) continue;
      SCOPED_TRACE(fmt::format("{}x{}x{}/{}x{} {}", hs.b, hs.t, hs.h, hs.hkv, hs.dh, rc.name));
      DelayedScalingState s_ref = make_state(rc.pass), s_op = make_state(rc.pass);
      Tensor dq_ref = Tensor::empty({n, w}, DType::kBF16, cpu);
      Tensor dk_ref = Tensor::empty({n, wkv}, DType::kBF16, cpu);
      Tensor dv_ref = Tensor::empty({n, wkv}, DType::kBF16, cpu);
      attention_bwd(ctx, dq_ref.view().reshape(sq), dk_ref.view().reshape(skv),
                    dv_ref.view().reshape(skv), dout.view().reshape(sq), q.view().reshape(sq),
                    k.view().reshape(skv), v.view().reshape(skv), out.view().reshape(sq), lse,
                    scale);
      QuantizedTensor q_ref;
      quantize(ctx, out, rc.make(&s_ref), q_ref);
      Tensor dq = Tensor::empty({n, w}, DType::kBF16, cpu);
      Tensor dk = Tensor::empty({n, wkv}, DType::kBF16, cpu);
      Tensor dv = Tensor::empty({n, wkv}, DType::kBF16, cpu);
      QuantizedTensor q_op;
      attention_bwd_quantize_out(ctx, dq.view().reshape(sq), dk.view().reshape(skv),
                                 dv.view().reshape(skv), dout.view().reshape(sq),
                                 q.view().reshape(sq), k.view().reshape(skv), v.view().reshape(skv),
                                 out.view().reshape(sq), lse, scale, rc.make(&s_op), q_op);
      EXPECT_TRUE(same_quantized(q_ref, q_op));
      EXPECT_TRUE(same_bytes("dq", dq_ref, dq));
      EXPECT_TRUE(same_bytes("dk", dk_ref, dk));
      EXPECT_TRUE(same_bytes("dv", dv_ref, dv));
      if (rc.delayed) EXPECT_TRUE(same_bytes("history", s_ref.amax_history(), s_op.amax_history()));
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

  // rmsnorm_bwd_quantize: the outputs asked for, their pairing, and rmsnorm_bwd's own checks.
  Tensor dx = Tensor::zeros({4, 8}, DType::kBF16, cpu), dw = Tensor::zeros({8}, DType::kF32, cpu);
  QuantizedTensor q2;
  EXPECT_TRUE(throws_user_error(
      [&] {
        rmsnorm_bwd_quantize(ctx, dx, dw, y, x, w, rstd, dx, kEps, nullptr, nullptr, nullptr,
                             nullptr);
      },
      {"rmsnorm_bwd_quantize", "no quantized output", "rmsnorm_bwd"}));
  EXPECT_TRUE(throws_user_error(
      [&] {
        rmsnorm_bwd_quantize(ctx, dx, dw, y, x, w, rstd, dx, kEps, &cfg, nullptr, nullptr, nullptr);
      },
      {"dx_cfg and dx_out go together"}));
  EXPECT_TRUE(throws_user_error(
      [&] { rmsnorm_bwd_quantize(ctx, dx, dw, y, x, w, rstd, dx, kEps, &cfg, &q, &cfg, &q); },
      {"dx_out and y_out must be different"}));
  EXPECT_TRUE(throws_user_error(
      [&] {
        rmsnorm_bwd_quantize(ctx, dx, dw, y, xf, w, rstd, dx, kEps, &cfg, &q, nullptr, nullptr);
      },
      {"rmsnorm_bwd_quantize", "x must be bf16"}));
  Tensor dw_bad = Tensor::zeros({8}, DType::kBF16, cpu);
  EXPECT_TRUE(throws_user_error(
      [&] {
        rmsnorm_bwd_quantize(ctx, dx, dw_bad, y, x, w, rstd, dx, kEps, &cfg, &q, nullptr, nullptr);
      },
      {"rmsnorm_bwd_quantize", "dw"}));
  EXPECT_TRUE(throws_user_error(
      [&] {
        rmsnorm_bwd_quantize(ctx, dx, dw, y, x, w, rstd3, dx, kEps, nullptr, nullptr, &cfg, &q2);
      },
      {"rstd [N] has 3 entries"}));
  EXPECT_TRUE(throws_user_error(
      [&] {
        rmsnorm_bwd_quantize(ctx, dx, dw, y, x, w, rstd, dx, NAN, nullptr, nullptr, &cfg, &q2);
      },
      {"eps"}));

  // attention_bwd_quantize_out: attention_bwd's checks, and a contiguous out.
  {
    const Shape sq{1, 4, 2, 64}, skv{1, 4, 1, 64};
    Tensor aq = Tensor::zeros(sq, DType::kBF16, cpu), akv = Tensor::zeros(skv, DType::kBF16, cpu);
    Tensor alse = Tensor::zeros({1, 2, 4}, DType::kF32, cpu);
    Tensor wide = Tensor::zeros({1, 4, 4, 64}, DType::kBF16, cpu);  // heads 0-1 of it: strided
    const TensorView out_strided(wide.data(), DType::kBF16, sq, wide.view().strides, cpu);
    EXPECT_TRUE(throws_user_error(
        [&] {
          attention_bwd_quantize_out(ctx, aq, akv, akv, aq, aq, akv, akv, out_strided, alse, 0.125f,
                                     cfg, q);
        },
        {"attention_bwd_quantize_out", "out must be contiguous"}));
    Tensor alse_bad = Tensor::zeros({1, 2, 3}, DType::kF32, cpu);
    EXPECT_TRUE(throws_user_error(
        [&] {
          attention_bwd_quantize_out(ctx, aq, akv, akv, aq, aq, akv, akv, aq, alse_bad, 0.125f, cfg,
                                     q);
        },
        {"attention_bwd_quantize_out", "lse must be [1, 2, 4]"}));
  }

  // rope_bwd_quantize: heads, table, views.
  Tensor d4 = Tensor::zeros({1, 4, 3, 16}, DType::kBF16, cpu);
  Tensor tab = Tensor::zeros({4, 8, 2}, DType::kF32, cpu);
  EXPECT_TRUE(throws_user_error([&] { rope_bwd_quantize(ctx, TensorView(), d4, 4, tab, cfg, q); },
                                {"rope_bwd_quantize", "n_rot = 4", "nH = 3"}));
  Tensor tab_short = Tensor::zeros({2, 8, 2}, DType::kF32, cpu);
  EXPECT_TRUE(
      throws_user_error([&] { rope_bwd_quantize(ctx, TensorView(), d4, 2, tab_short, cfg, q); },
                        {"rope_bwd_quantize", "table has 2 positions"}));
  Tensor d4f = Tensor::zeros({1, 4, 3, 16}, DType::kF32, cpu);
  EXPECT_TRUE(throws_user_error([&] { rope_bwd_quantize(ctx, TensorView(), d4f, 2, tab, cfg, q); },
                                {"rope_bwd_quantize", "dy must be bf16"}));
  Tensor d4_other = Tensor::zeros({1, 4, 3, 8}, DType::kBF16, cpu);
  EXPECT_TRUE(throws_user_error([&] { rope_bwd_quantize(ctx, d4_other, d4, 2, tab, cfg, q); },
                                {"rope_bwd_quantize", "dx"}));

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
