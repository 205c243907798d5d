// rmsnorm_fwd_quantize and swiglu_fwd_quantize on the GPU. The contract is checked byte for byte
// twice: the fused kernel against the GPU composition (rmsnorm_fwd / swiglu_fwd, then quantize) —
// payloads, scale_inv, amax, the bf16 output and rstd, the delayed-scaling history — and its
// quantized bytes against the CPU twin of quantize() applied to the GPU's bf16 output. (The GPU
// and CPU twins of RMSNorm and SwiGLU themselves agree to a tolerance, not bit for bit: row sums in
// another order, expf; tests/gpu/test_ops_rmsnorm.cpp and test_ops_swiglu.cpp cover that.)
// Shapes reach partial tiles, the fallbacks (D % 8 != 0, very wide rows) and the model's sizes;
// fills reach zeros, large magnitudes (saturation) and ±inf/NaN. Bandwidth of fused vs unfused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "lowbit/ops.h"
#include "lowbit/quant.h"
#include "ops/op_harness.h"
#include "ops/quant_compare.h"
#include "ops/rmsnorm_impl.h"

namespace lowbit::test {
namespace {

constexpr float kEps = 1e-5f;
const Device kGpu = Device::cuda(0);

enum class Src { kGaussian, kZeros, kLarge, kSpecials };
const char* src_name(Src s) {
  switch (s) {
    case Src::kGaussian: return "gaussian";
    case Src::kZeros: return "zeros";
    case Src::kLarge: return "large";
    case Src::kSpecials: return "specials";
  }
  return "?";
}

// [n, k] bf16 on the CPU (filled by several threads: large tensors).
Tensor source(int64_t n, int64_t k, Src kind, double stddev, uint64_t seed) {
  Tensor t = Tensor::empty({n, k}, DType::kBF16, Device::cpu());
  uint16_t* p = t.ptr<uint16_t>();
  const int64_t total = n * k;
  auto fill = [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      double v = stddev * detail::philox_gauss(seed, 0, i);
      if (kind == Src::kZeros) v = 0.0;
      if (kind == Src::kLarge) v *= 1e30;  // x² overflows fp32; products saturate FP8
      if (kind == Src::kSpecials) {
        if (i % 97 == 5) v = INFINITY;
        if (i % 101 == 7) v = -INFINITY;
        if (i % 89 == 3) v = NAN;
      }
      p[i] = f32_to_bf16_rn(float(v));
    }
  };
  std::vector<std::thread> th;
  const int64_t parts = total > (1 << 20) ? 8 : 1;
  for (int64_t j = 0; j < parts; ++j)
    th.emplace_back(fill, total * j / parts, total * (j + 1) / parts);
  for (auto& t2 : th) t2.join();
  return t;
}

// A device view with kGuard elements of a byte pattern before and after it (and poison inside),
// to catch writes out of bounds; 16-byte alignment kept.
struct Guarded {
  static constexpr int64_t kGuard = 128;
  Tensor buf;
  TensorView view;
  int64_t guard_bytes = 0, view_bytes = 0;
  Guarded(Shape s, DType t) {
    const int64_t es = dtype_storage_bytes(t, 1);
    guard_bytes = kGuard * es;
    view_bytes = s.numel() * es;
    Tensor host = Tensor::empty({2 * guard_bytes + view_bytes}, DType::kU8, Device::cpu());
    std::memset(host.data(), 0xA5, size_t(host.nbytes()));
    buf = Tensor::copy_of(host.view(), kGpu);
    view = TensorView(buf.ptr<uint8_t>() + guard_bytes, t, s, kGpu);
  }
  ::testing::AssertionResult intact() const {
    const Tensor host = Tensor::copy_of(buf.view(), Device::cpu());
    const uint8_t* p = host.ptr<const uint8_t>();
    for (int64_t i = 0; i < guard_bytes; ++i) {
      if (p[i] != 0xA5 || p[guard_bytes + view_bytes + i] != 0xA5) {
        return ::testing::AssertionFailure() << "guard byte " << i << " overwritten";
      }
    }
    return ::testing::AssertionSuccess();
  }
};

struct Copies {
  bool row, col;
  const char* name;
};
const Copies kCopies[] = {{true, false, "row"}, {false, true, "col"}, {true, true, "row+col"}};

struct States {
  DelayedScalingState fused, unfused, cpu;
  explicit States(ScalingPass pass, float amax)
      : fused(config(), pass, 2, kGpu),
        unfused(config(), pass, 2, kGpu),
        cpu(config(), pass, 2, Device::cpu()) {
    for (DelayedScalingState* s : {&fused, &unfused, &cpu}) prime_state(*s, 1, amax);
  }
  static DelayedScalingConfig config() {
    DelayedScalingConfig c;
    c.history_len = 4;
    return c;
  }
};

QuantConfig make_cfg(bool delayed, DelayedScalingState& st, Copies cp) {
  QuantConfig c = delayed ? QuantConfig::fp8_delayed(st, 1) : QuantConfig::fp8_current(st.dtype());
  c.rowwise = cp.row;
  c.columnwise = cp.col;
  return c;
}

// The checks shared by both ops once the fused and unfused GPU results exist: fused == unfused
// (bytes), and fused == the CPU quantize() of the GPU's bf16 output.
void check_quantized(const QuantizedTensor& q_fused, const QuantizedTensor& q_unfused,
                     const Tensor& y_unfused, bool delayed, Copies cp, States& st) {
  EXPECT_TRUE(same_quantized(q_unfused, q_fused)) << "fused vs GPU composition";
  if (delayed) {
    EXPECT_TRUE(same_bytes("history", st.unfused.amax_history(), st.fused.amax_history()));
  }
  Context cpu_ctx(Device::cpu());
  const Tensor y_host = Tensor::copy_of(y_unfused.view(), Device::cpu());
  QuantizedTensor q_cpu;
  quantize(cpu_ctx, y_host, make_cfg(delayed, st.cpu, cp), q_cpu);
  EXPECT_TRUE(same_quantized(q_cpu, q_fused)) << "fused vs CPU quantize of the GPU's output";
  if (delayed) EXPECT_TRUE(same_bytes("history", st.cpu.amax_history(), st.fused.amax_history()));
}

void check_rmsnorm(int64_t n, int64_t d, Src src, Copies cp, bool delayed, bool with_y,
                   ScalingPass pass = ScalingPass::kForward) {
  SCOPED_TRACE(fmt::format("rmsnorm_fwd_quantize {}x{} {} {} {} {}{}", n, d, src_name(src), cp.name,
                           delayed ? "delayed" : "current", with_y ? "y+rstd" : "no y",
                           pass == ScalingPass::kBackward ? " e5m2" : ""));
  Context ctx(kGpu);
  const Tensor x = Tensor::copy_of(source(n, d, src, 2.0, 1), kGpu);
  const Tensor w = Tensor::copy_of(source(1, d, Src::kGaussian, 0.5, 2).view().reshape({d}), kGpu);
  States st(pass, 0.75f);  // scale fmax / 0.75: |y| above 0.75 saturates
  Guarded y(Shape{n, d}, DType::kBF16), rstd(Shape{n}, DType::kF32);
  QuantizedTensor q_f, q_u;
  rmsnorm_fwd_quantize(ctx, with_y ? y.view : TensorView(), with_y ? rstd.view : TensorView(), x, w,
                       kEps, make_cfg(delayed, st.fused, cp), q_f);
  Tensor y_u = Tensor::empty({n, d}, DType::kBF16, kGpu),
         r_u = Tensor::empty({n}, DType::kF32, kGpu);
  rmsnorm_fwd(ctx, y_u, r_u, x, w, kEps);
  quantize(ctx, y_u, make_cfg(delayed, st.unfused, cp), q_u);
  ctx.synchronize();
  if (with_y) {
    EXPECT_TRUE(same_bytes("y", y_u, y.view));
    EXPECT_TRUE(same_bytes("rstd", r_u, rstd.view));
  }
  EXPECT_TRUE(y.intact());
  EXPECT_TRUE(rstd.intact());
  check_quantized(q_f, q_u, y_u, delayed, cp, st);
}

void check_swiglu(int64_t n, int64_t f, Src src, Copies cp, bool delayed, bool with_h) {
  SCOPED_TRACE(fmt::format("swiglu_fwd_quantize {}x{} {} {} {} {}", n, f, src_name(src), cp.name,
                           delayed ? "delayed" : "current", with_h ? "h" : "no h"));
  Context ctx(kGpu);
  const Tensor gu = Tensor::copy_of(source(n, 2 * f, src, 3.0, 3), kGpu);  // [N, 2F]
  States st(ScalingPass::kForward, 0.75f);
  Guarded h(Shape{n, f}, DType::kBF16);
  QuantizedTensor q_f, q_u;
  swiglu_fwd_quantize(ctx, with_h ? h.view : TensorView(), gu, make_cfg(delayed, st.fused, cp),
                      q_f);
  Tensor h_u = Tensor::empty({n, f}, DType::kBF16, kGpu);
  swiglu_fwd(ctx, h_u, gu);
  quantize(ctx, h_u, make_cfg(delayed, st.unfused, cp), q_u);
  ctx.synchronize();
  if (with_h) EXPECT_TRUE(same_bytes("h", h_u, h.view));
  EXPECT_TRUE(h.intact());
  check_quantized(q_f, q_u, h_u, delayed, cp, st);
}

// swiglu_bwd_quantize (the gate_up linear's dY, E5M2 under HYBRID).
void check_swiglu_bwd(int64_t n, int64_t f, Src src, Copies cp, bool delayed, bool with_d) {
  SCOPED_TRACE(fmt::format("swiglu_bwd_quantize {}x{} {} {} {} {}", n, f, src_name(src), cp.name,
                           delayed ? "delayed" : "current", with_d ? "dgate_up" : "no dgate_up"));
  Context ctx(kGpu);
  const Tensor gu = Tensor::copy_of(source(n, 2 * f, src, 3.0, 3), kGpu);  // [N, 2F]
  const Tensor dy = Tensor::copy_of(source(n, f, src, 1.0, 4), kGpu);      // [N, F]
  States st(ScalingPass::kBackward, 0.75f);
  Guarded d(Shape{n, 2 * f}, DType::kBF16);
  QuantizedTensor q_f, q_u;
  swiglu_bwd_quantize(ctx, with_d ? d.view : TensorView(), dy, gu, make_cfg(delayed, st.fused, cp),
                      q_f);
  Tensor d_u = Tensor::empty({n, 2 * f}, DType::kBF16, kGpu);
  swiglu_bwd(ctx, d_u, dy, gu);
  quantize(ctx, d_u, make_cfg(delayed, st.unfused, cp), q_u);
  ctx.synchronize();
  if (with_d) EXPECT_TRUE(same_bytes("dgate_up", d_u, d.view));
  EXPECT_TRUE(d.intact());
  check_quantized(q_f, q_u, d_u, delayed, cp, st);
}

// swiglu_bwd_quantize_with_h: dgate_up's codes (E5M2 state) as above, and h's codes under a
// forward state (the down linear's input, columnwise for its wgrad), against the GPU
// composition swiglu_fwd + quantize and swiglu_bwd + quantize.
void check_swiglu_bwd_h(int64_t n, int64_t f, Src src, Copies cp, Copies cp_h, bool delayed) {
  SCOPED_TRACE(fmt::format("swiglu_bwd_quantize_with_h {}x{} {} dgate_up {} h {} {}", n, f,
                           src_name(src), cp.name, cp_h.name, delayed ? "delayed" : "current"));
  Context ctx(kGpu);
  const Tensor gu = Tensor::copy_of(source(n, 2 * f, src, 3.0, 3), kGpu);  // [N, 2F]
  const Tensor dy = Tensor::copy_of(source(n, f, src, 1.0, 4), kGpu);      // [N, F]
  States st(ScalingPass::kBackward, 0.75f), st_h(ScalingPass::kForward, 0.5f);
  QuantizedTensor q_f, q_u, h_f, h_u;
  swiglu_bwd_quantize_with_h(ctx, TensorView(), dy, gu, make_cfg(delayed, st.fused, cp), q_f,
                             make_cfg(delayed, st_h.fused, cp_h), h_f);
  Tensor d_u = Tensor::empty({n, 2 * f}, DType::kBF16, kGpu);
  Tensor hv_u = Tensor::empty({n, f}, DType::kBF16, kGpu);
  swiglu_fwd(ctx, hv_u, gu);
  quantize(ctx, hv_u, make_cfg(delayed, st_h.unfused, cp_h), h_u);
  swiglu_bwd(ctx, d_u, dy, gu);
  quantize(ctx, d_u, make_cfg(delayed, st.unfused, cp), q_u);
  ctx.synchronize();
  check_quantized(q_f, q_u, d_u, delayed, cp, st);
  check_quantized(h_f, h_u, hv_u, delayed, cp_h, st_h);
}

// The inputs of the RMSNorm backward checks on the GPU: x, dout and a residual [N, D], w [D], the
// dw gradient so far [D] (host), and rstd [N] and y [N, D] from rmsnorm_fwd.
struct RmsNormBwdInputs {
  Tensor x, dout, res0, w, dw0, rstd, y;
  RmsNormBwdInputs(Context& ctx, int64_t n, int64_t d, Src src)
      : x(Tensor::copy_of(source(n, d, src, 2.0, 1), kGpu)),
        dout(Tensor::copy_of(source(n, d, src, 1.0, 5), kGpu)),
        res0(Tensor::copy_of(source(n, d, src, 0.5, 6), kGpu)),
        w(Tensor::copy_of(source(1, d, Src::kGaussian, 0.5, 2).view().reshape({d}), kGpu)),
        dw0(Tensor::empty({d}, DType::kF32, Device::cpu())),
        rstd(Tensor::empty({n}, DType::kF32, kGpu)),
        y(Tensor::empty({n, d}, DType::kBF16, kGpu)) {
    for (int64_t i = 0; i < d; ++i) dw0.ptr<float>()[i] = 0.25f * float(i % 7) - 0.5f;
    rmsnorm_fwd(ctx, y, rstd, x, w, kEps);
  }
};

// rmsnorm_bwd_quantize: dx's codes (the previous linear's dY, E5M2 state, copies cp_dx; absent
// when cp_dx is null) and the forward's y remade (forward state, copies cp_y; absent when null),
// with the residual aliasing dx (the model's case) or none, against the GPU composition
// rmsnorm_fwd_quantize, rmsnorm_bwd, quantize: dx and dw (accumulated onto a non-zero start)
// byte for byte, guards intact, and each quantized copy against the CPU quantize() of the GPU's
// bf16 values.
void check_rmsnorm_bwd(int64_t n, int64_t d, Src src, const Copies* cp_dx, const Copies* cp_y,
                       bool delayed, bool residual, bool accumulate_dw = true) {
  SCOPED_TRACE(fmt::format("rmsnorm_bwd_quantize {}x{} {} dx {} y {} {} {} dw {}", n, d,
                           src_name(src), cp_dx ? cp_dx->name : "-", cp_y ? cp_y->name : "-",
                           delayed ? "delayed" : "current", residual ? "residual" : "no residual",
                           accumulate_dw ? "+=" : "="));
  Context ctx(kGpu);
  RmsNormBwdInputs in(ctx, n, d, src);
  const Tensor &x = in.x, &dout = in.dout, &res0 = in.res0, &w = in.w;
  Tensor &dw0 = in.dw0, &rstd = in.rstd, &y_u = in.y;
  States st_dx(ScalingPass::kBackward, 0.75f), st_y(ScalingPass::kForward, 0.5f);
  QuantConfig dxc_f, dxc_u, yc_f, yc_u;
  if (cp_dx) {
    dxc_f = make_cfg(delayed, st_dx.fused, *cp_dx);
    dxc_u = make_cfg(delayed, st_dx.unfused, *cp_dx);
  }
  if (cp_y) {
    yc_f = make_cfg(delayed, st_y.fused, *cp_y);
    yc_u = make_cfg(delayed, st_y.unfused, *cp_y);
  }
  // Fused: dx starts as the residual (aliased) or as poison (no residual).
  Guarded dx(Shape{n, d}, DType::kBF16);
  if (residual) copy_tensor(dx.view, res0.view());
  // Not accumulating: dw starts as NaN (it must be written outright), and the composition adds
  // to zeros.
  Tensor dw_f = Tensor::copy_of(dw0.view(), kGpu);
  if (!accumulate_dw) fill_bytes(dw_f, 0xFF);
  QuantizedTensor dxq_f, yq_f;
  rmsnorm_bwd_quantize(ctx, dx.view, dw_f, dout, x, w, rstd, residual ? dx.view : TensorView(),
                       kEps, cp_dx ? &dxc_f : nullptr, cp_dx ? &dxq_f : nullptr,
                       cp_y ? &yc_f : nullptr, cp_y ? &yq_f : nullptr, accumulate_dw);
  // The composition.
  Tensor dx_u = Tensor::copy_of(res0.view(), kGpu);
  Tensor dw_u = Tensor::copy_of(dw0.view(), kGpu);
  if (!accumulate_dw) fill_bytes(dw_u, 0);
  QuantizedTensor dxq_u, yq_u;
  if (cp_y) rmsnorm_fwd_quantize(ctx, TensorView(), TensorView(), x, w, kEps, yc_u, yq_u);
  rmsnorm_bwd(ctx, dx_u, dw_u, dout, x, w, rstd, residual ? dx_u.view() : TensorView());
  if (cp_dx) quantize(ctx, dx_u, dxc_u, dxq_u);
  ctx.synchronize();
  EXPECT_TRUE(same_bytes("dx", dx_u, dx.view));
  EXPECT_TRUE(same_bytes("dw", dw_u, dw_f));
  EXPECT_TRUE(dx.intact());
  if (cp_dx) check_quantized(dxq_f, dxq_u, dx_u, delayed, *cp_dx, st_dx);
  if (cp_y) check_quantized(yq_f, yq_u, y_u, delayed, *cp_y, st_y);
}

// The kernels behind rmsnorm_fwd_quantize_cuda / rmsnorm_bwd_quantize_cuda, each forced through
// its config, with several ring depths (1 stage: no row ahead; 2 and 4: the ring wraps around
// many times on the larger shapes).
struct RmsNormRun {
  ops_detail::RmsNormFp8Kernel kernel;
  int stages;
  const char* name;
};
const RmsNormRun kRmsNormFwdRuns[] = {{ops_detail::RmsNormFp8Kernel::kRegisters, 0, "registers"},
                                      {ops_detail::RmsNormFp8Kernel::kGroupRing, 0, "group ring"},
                                      {ops_detail::RmsNormFp8Kernel::kGroupRing, 1, "group ring 1"},
                                      {ops_detail::RmsNormFp8Kernel::kGroupRing, 2, "group ring 2"},
                                      {ops_detail::RmsNormFp8Kernel::kGroupRing, 4, "group ring 4"},
                                      {ops_detail::RmsNormFp8Kernel::kWarpRing, 0, "warp ring"},
                                      {ops_detail::RmsNormFp8Kernel::kWarpRing, 1, "warp ring 1"},
                                      {ops_detail::RmsNormFp8Kernel::kWarpRing, 2, "warp ring 2"},
                                      {ops_detail::RmsNormFp8Kernel::kWarpRing, 4, "warp ring 4"},
                                      {ops_detail::RmsNormFp8Kernel::kAuto, 0, "auto"}};
const RmsNormRun kRmsNormBwdRuns[] = {{ops_detail::RmsNormFp8Kernel::kRegisters, 0, "registers"},
                                      {ops_detail::RmsNormFp8Kernel::kGroupRing, 0, "group ring"},
                                      {ops_detail::RmsNormFp8Kernel::kGroupRing, 1, "group ring 1"},
                                      {ops_detail::RmsNormFp8Kernel::kGroupRing, 2, "group ring 2"},
                                      {ops_detail::RmsNormFp8Kernel::kGroupRing, 4, "group ring 4"},
                                      {ops_detail::RmsNormFp8Kernel::kAuto, 0, "auto"}};

// rmsnorm_fwd_quantize_cuda (delayed scaling) with every kernel of kRmsNormFwdRuns: y, rstd, the
// codes, scale_inv, amax and the history byte for byte those of the register kernel (the first run,
// itself checked against the composition by check_rmsnorm), guards intact. Up to D = 2048 every
// forced kernel fits its shared memory, so it must be the one that ran.
void check_rmsnorm_kernels(int64_t n, int64_t d, Src src, Copies cp,
                           ScalingPass pass = ScalingPass::kForward) {
  SCOPED_TRACE(fmt::format("rmsnorm_fwd_quantize kernels {}x{} {} {}{}", n, d, src_name(src),
                           cp.name, pass == ScalingPass::kBackward ? " e5m2" : ""));
  Context ctx(kGpu);
  const Tensor x = Tensor::copy_of(source(n, d, src, 2.0, 1), kGpu);
  const Tensor w = Tensor::copy_of(source(1, d, Src::kGaussian, 0.5, 2).view().reshape({d}), kGpu);
  Tensor y_ref, r_ref, hist_ref;
  QuantizedTensor q_ref;
  bool fused_ref = false;
  for (const RmsNormRun& run : kRmsNormFwdRuns) {
    SCOPED_TRACE(run.name);
    States st(pass, 0.75f);
    Guarded y(Shape{n, d}, DType::kBF16), rstd(Shape{n}, DType::kF32);
    QuantizedTensor q;
    ops_detail::RmsNormFp8Kernel ran = ops_detail::RmsNormFp8Kernel::kAuto;
    ops_detail::RmsNormFp8Config cfg;
    cfg.kernel = run.kernel;
    cfg.stages = run.stages;
    cfg.ran = &ran;
    const bool fused = ops_detail::rmsnorm_fwd_quantize_cuda(ctx, y.view, rstd.view, x, w, kEps,
                                                             make_cfg(true, st.fused, cp), q, &cfg);
    ctx.synchronize();
    if (&run == &kRmsNormFwdRuns[0]) {
      fused_ref = fused;
      if (!fused) return;  // the composition's case (D % 8, width, tile size): nothing to compare
      y_ref = Tensor::copy_of(y.view, Device::cpu());
      r_ref = Tensor::copy_of(rstd.view, Device::cpu());
      hist_ref = Tensor::copy_of(st.fused.amax_history().view(), Device::cpu());
      q_ref = std::move(q);
      continue;
    }
    ASSERT_EQ(fused, fused_ref);
    if (d <= 2048 && run.kernel != ops_detail::RmsNormFp8Kernel::kAuto) {
      EXPECT_EQ(int(ran), int(run.kernel));
    }
    EXPECT_TRUE(same_bytes("y", y_ref, y.view));
    EXPECT_TRUE(same_bytes("rstd", r_ref, rstd.view));
    EXPECT_TRUE(same_quantized(q_ref, q));
    EXPECT_TRUE(same_bytes("history", hist_ref, st.fused.amax_history()));
    EXPECT_TRUE(y.intact());
    EXPECT_TRUE(rstd.intact());
  }
}

// rmsnorm_bwd_quantize_cuda with every kernel of kRmsNormBwdRuns (dx's codes cp_dx, y's codes cp_y,
// the residual aliasing dx or none): dx, dw, both sets of codes and both histories byte for byte
// those of the register kernel (checked against the composition by check_rmsnorm_bwd).
void check_rmsnorm_bwd_kernels(int64_t n, int64_t d, Src src, const Copies* cp_dx,
                               const Copies* cp_y, bool residual) {
  SCOPED_TRACE(fmt::format("rmsnorm_bwd_quantize kernels {}x{} {} dx {} y {} {}", n, d,
                           src_name(src), cp_dx ? cp_dx->name : "-", cp_y ? cp_y->name : "-",
                           residual ? "residual" : "no residual"));
  Context ctx(kGpu);
  RmsNormBwdInputs in(ctx, n, d, src);
  const Tensor &x = in.x, &dout = in.dout, &res0 = in.res0, &w = in.w;
  Tensor &dw0 = in.dw0, &rstd = in.rstd, &y0 = in.y;
  Tensor dx_ref, dw_ref, hdx_ref, hy_ref;
  QuantizedTensor dxq_ref, yq_ref;
  bool fused_ref = false;
  for (const RmsNormRun& run : kRmsNormBwdRuns) {
    SCOPED_TRACE(run.name);
    States st_dx(ScalingPass::kBackward, 0.75f), st_y(ScalingPass::kForward, 0.5f);
    QuantConfig dxc, yc;
    if (cp_dx) dxc = make_cfg(true, st_dx.fused, *cp_dx);
    if (cp_y) yc = make_cfg(true, st_y.fused, *cp_y);
    Guarded dx(Shape{n, d}, DType::kBF16);
    if (residual) copy_tensor(dx.view, res0.view());
    Tensor dw = Tensor::copy_of(dw0.view(), kGpu);
    QuantizedTensor dxq, yq;
    ops_detail::RmsNormFp8Kernel ran = ops_detail::RmsNormFp8Kernel::kAuto;
    ops_detail::RmsNormFp8Config cfg;
    cfg.kernel = run.kernel;
    cfg.stages = run.stages;
    cfg.ran = &ran;
    const bool fused = ops_detail::rmsnorm_bwd_quantize_cuda(
        ctx, dx.view, dw, dout, x, w, rstd, residual ? dx.view : TensorView(), kEps,
        cp_dx ? &dxc : nullptr, cp_dx ? &dxq : nullptr, cp_y ? &yc : nullptr, cp_y ? &yq : nullptr,
        true, &cfg);
    ctx.synchronize();
    if (&run == &kRmsNormBwdRuns[0]) {
      fused_ref = fused;
      if (!fused) return;  // the composition's case: nothing to compare
      dx_ref = Tensor::copy_of(dx.view, Device::cpu());
      dw_ref = Tensor::copy_of(dw.view(), Device::cpu());
      hdx_ref = Tensor::copy_of(st_dx.fused.amax_history().view(), Device::cpu());
      hy_ref = Tensor::copy_of(st_y.fused.amax_history().view(), Device::cpu());
      dxq_ref = std::move(dxq);
      yq_ref = std::move(yq);
      continue;
    }
    ASSERT_EQ(fused, fused_ref);
    if (d <= 2048 && run.kernel != ops_detail::RmsNormFp8Kernel::kAuto) {
      EXPECT_EQ(int(ran), int(run.kernel));
    }
    EXPECT_TRUE(same_bytes("dx", dx_ref, dx.view));
    EXPECT_TRUE(same_bytes("dw", dw_ref, dw));
    EXPECT_TRUE(dx.intact());
    if (cp_dx) {
      EXPECT_TRUE(same_quantized(dxq_ref, dxq));
      EXPECT_TRUE(same_bytes("dx history", hdx_ref, st_dx.fused.amax_history()));
    }
    if (cp_y) {
      EXPECT_TRUE(same_quantized(yq_ref, yq));
      EXPECT_TRUE(same_bytes("y history", hy_ref, st_y.fused.amax_history()));
    }
  }
}

// rope_bwd_quantize (the qkv linear's dY, E5M2): dy [B, T, nH, Dh] with the first n_rot heads
// rotated back, dx written separately, in place or not at all, against the GPU composition
// (rope_bwd on those heads of a copy, then quantize): dx byte for byte, guards intact, codes.
void check_rope_bwd(int64_t b, int64_t t, int64_t nh, int64_t dh, int64_t n_rot, Src src, Copies cp,
                    bool delayed, int mode /*0 separate, 1 in place, 2 absent*/) {
  SCOPED_TRACE(fmt::format("rope_bwd_quantize {}x{}x{}x{} rot {} {} {} {} dx {}", b, t, nh, dh,
                           n_rot, src_name(src), cp.name, delayed ? "delayed" : "current",
                           mode == 0   ? "separate"
                           : mode == 1 ? "in place"
                                       : "absent"));
  Context ctx(kGpu);
  const int64_t n = b * t, w = nh * dh;
  const Shape shape{b, t, nh, dh};
  Tensor table = Tensor::empty({t, dh / 2, 2}, DType::kF32, kGpu);
  RopeConfig rc;
  rc.theta = 500000.0f;
  rope_table(ctx, table, rc);
  const Tensor dy0 = Tensor::copy_of(source(n, w, src, 1.0, 7), kGpu);  // [B·T, nH·Dh]
  States st(ScalingPass::kBackward, 0.75f);
  // Fused.
  Tensor dy = Tensor::copy_of(dy0.view(), kGpu);
  Guarded dx(Shape{n, w}, DType::kBF16);
  const TensorView dy4 = dy.view().reshape(shape);
  const TensorView dx4 = mode == 0 ? dx.view.reshape(shape) : mode == 1 ? dy4 : TensorView();
  QuantizedTensor q_f, q_u;
  rope_bwd_quantize(ctx, dx4, dy4, n_rot, table, make_cfg(delayed, st.fused, cp), q_f);
  // The composition.
  Tensor d_u = Tensor::copy_of(dy0.view(), kGpu);
  if (n_rot > 0) {
    const TensorView d4 = d_u.view().reshape(shape);
    const TensorView rot(d4.data, DType::kBF16, Shape{b, t, n_rot, dh}, d4.strides, kGpu);
    rope_bwd(ctx, rot, rot, table);
  }
  quantize(ctx, d_u, make_cfg(delayed, st.unfused, cp), q_u);
  ctx.synchronize();
  if (mode == 0) EXPECT_TRUE(same_bytes("dx", d_u, dx.view));
  if (mode == 1) EXPECT_TRUE(same_bytes("dx (in place)", d_u, dy));
  if (mode != 1) EXPECT_TRUE(same_bytes("dy unchanged", dy0, dy));
  EXPECT_TRUE(dx.intact());
  check_quantized(q_f, q_u, d_u, delayed, cp, st);
}

// attention_bwd_quantize_out (the projection's wgrad input, E4M3): q, k, v, dout from `src`
// (out and lse from attention_fwd), against attention_bwd followed by quantize(out) on the GPU:
// dq, dk, dv byte for byte (delta comes from the same arithmetic), the codes, the history.
void check_attention_bwd_out(int64_t b, int64_t t, int64_t h, int64_t hkv, int64_t dh, Src src,
                             Copies cp, bool delayed) {
  SCOPED_TRACE(fmt::format("attention_bwd_quantize_out {}x{}x{}/{}x{} {} {} {}", b, t, h, hkv, dh,
                           src_name(src), cp.name, delayed ? "delayed" : "current"));
  Context ctx(kGpu);
  const int64_t n = b * t, w = h * dh, wkv = hkv * dh;
  const float scale = 1.0f / std::sqrt(float(dh));
  const Shape sq{b, t, h, dh}, skv{b, t, hkv, dh};
  const Tensor q = Tensor::copy_of(source(n, w, Src::kGaussian, 1.0, 11), kGpu);
  const Tensor k = Tensor::copy_of(source(n, wkv, Src::kGaussian, 1.0, 12), kGpu);
  const Tensor v = Tensor::copy_of(source(n, wkv, src, 1.0, 13), kGpu);
  const Tensor dout = Tensor::copy_of(source(n, w, src, 1.0, 14), kGpu);
  Tensor out = Tensor::empty({n, w}, DType::kBF16, kGpu);
  Tensor lse = Tensor::empty({b, h, t}, DType::kF32, kGpu);
  attention_fwd(ctx, out.view().reshape(sq), lse, q.view().reshape(sq), k.view().reshape(skv),
                v.view().reshape(skv), scale);
  States st(ScalingPass::kForward, 0.75f);
  auto grads = [&] {
    std::vector<Tensor> g;
    g.push_back(Tensor::zeros({n, w}, DType::kBF16, kGpu));
    g.push_back(Tensor::zeros({n, wkv}, DType::kBF16, kGpu));
    g.push_back(Tensor::zeros({n, wkv}, DType::kBF16, kGpu));
    return g;
  };
  std::vector<Tensor> g_f = grads(), g_u = grads();
  QuantizedTensor q_f, q_u;
  attention_bwd_quantize_out(
      ctx, g_f[0].view().reshape(sq), g_f[1].view().reshape(skv), g_f[2].view().reshape(skv),
      dout.view().reshape(sq), q.view().reshape(sq), k.view().reshape(skv), v.view().reshape(skv),
      out.view().reshape(sq), lse, scale, make_cfg(delayed, st.fused, cp), q_f);
  attention_bwd(ctx, g_u[0].view().reshape(sq), g_u[1].view().reshape(skv),
                g_u[2].view().reshape(skv), dout.view().reshape(sq), q.view().reshape(sq),
                k.view().reshape(skv), v.view().reshape(skv), out.view().reshape(sq), lse, scale);
  quantize(ctx, out, make_cfg(delayed, st.unfused, cp), q_u);
  ctx.synchronize();
  EXPECT_TRUE(same_bytes("dq", g_u[0], g_f[0]));
  EXPECT_TRUE(same_bytes("dk", g_u[1], g_f[1]));
  EXPECT_TRUE(same_bytes("dv", g_u[2], g_f[2]));
  check_quantized(q_f, q_u, out, delayed, cp, st);
}

struct Shape2 {
  int64_t n, d;
};
// Small and odd: partial row tiles (N % 32, % 64, % 16 != 0), D % 8 != 0 (fallback), D > 16384
// (fallback), D = 8192 (columnwise tile too large for shared memory: fallback; rowwise fused).
const Shape2 kSmall[] = {{1, 16},  {65, 80},   {33, 24},   {100, 8},   {5, 1000},
                         {7, 513}, {3, 20000}, {48, 8192}, {130, 1000}};
// The 124m and 1b shapes.
const Shape2 kLarge[] = {{16384, 768}, {4096, 2048}};

TEST(GpuFusedQuantize, RmsNormSmallShapes) {
  ASSERT_GT(cuda_device_count(), 0) << "the GPU tests need a CUDA GPU (run them on a GPU host)";
  for (const Shape2& s : kSmall) {
    for (Src src : {Src::kGaussian, Src::kZeros, Src::kLarge, Src::kSpecials}) {
      for (const Copies& cp : kCopies) {
        for (bool delayed : {true, false}) check_rmsnorm(s.n, s.d, src, cp, delayed, true);
      }
    }
    check_rmsnorm(s.n, s.d, Src::kGaussian, kCopies[2], true, false);
    check_rmsnorm(s.n, s.d, Src::kSpecials, kCopies[2], true, true, ScalingPass::kBackward);
  }
}

TEST(GpuFusedQuantize, RmsNormModelShapes) {
  ASSERT_GT(cuda_device_count(), 0);
  for (const Shape2& s : kLarge) {
    for (Src src : {Src::kGaussian, Src::kSpecials}) {
      for (const Copies& cp : kCopies) {
        for (bool delayed : {true, false}) check_rmsnorm(s.n, s.d, src, cp, delayed, true);
      }
    }
    check_rmsnorm(s.n, s.d, Src::kGaussian, kCopies[0], true, false);
  }
}

TEST(GpuFusedQuantize, RmsNormBackwardSmallShapes) {
  ASSERT_GT(cuda_device_count(), 0);
  // kSmall, plus 5000 (two chunks per thread: one staged tile fits, two do not) and 4096 (two
  // tiles do not fit: the composition; one does).
  std::vector<Shape2> shapes(std::begin(kSmall), std::end(kSmall));
  shapes.push_back({40, 5000});
  shapes.push_back({96, 4096});
  for (const Shape2& s : shapes) {
    for (Src src : {Src::kGaussian, Src::kZeros, Src::kLarge, Src::kSpecials}) {
      // The model's case (dx row+col, y col, residual), then each output alone and other copies.
      check_rmsnorm_bwd(s.n, s.d, src, &kCopies[2], &kCopies[1], true, true);
      check_rmsnorm_bwd(s.n, s.d, src, &kCopies[2], nullptr, true, true);
      check_rmsnorm_bwd(s.n, s.d, src, nullptr, &kCopies[1], true, true);
      check_rmsnorm_bwd(s.n, s.d, src, &kCopies[0], &kCopies[2], true, false);
      check_rmsnorm_bwd(s.n, s.d, src, &kCopies[1], &kCopies[0], true, false);
    }
    check_rmsnorm_bwd(s.n, s.d, Src::kGaussian, &kCopies[2], &kCopies[1], true, true, false);
    check_rmsnorm_bwd(s.n, s.d, Src::kGaussian, nullptr, &kCopies[1], false, true, false);
    check_rmsnorm_bwd(s.n, s.d, Src::kGaussian, &kCopies[2], &kCopies[1], false, true);
  }
}

TEST(GpuFusedQuantize, RmsNormBackwardModelShapes) {
  ASSERT_GT(cuda_device_count(), 0);
  for (const Shape2& s : {Shape2{16384, 2048}, Shape2{16384, 768}}) {
    check_rmsnorm_bwd(s.n, s.d, Src::kGaussian, &kCopies[2], &kCopies[1], true, true);
    check_rmsnorm_bwd(s.n, s.d, Src::kGaussian, &kCopies[2], nullptr, true, false);
  }
}

// Every forward kernel (register, ring per group, warp per row; ring depths 1–4) gives the same
// bytes: D 8 (one-warp groups, 8 of them), 72 (a partial warp), 768 and 2048 (the model widths),
// 4096, 5000 (10 warps, 2 chunks per thread), 8192 and 16384 (2 and 4 chunks per thread; no
// columnwise tile), N off every tile and group multiple, and N large enough for several rows
// per warp and tiles per block (the rings wrap around).
TEST(GpuFusedQuantize, RmsNormKernelsAgree) {
  ASSERT_GT(cuda_device_count(), 0);
  const Shape2 shapes[] = {{1, 8},      {33, 8},      {100, 72},  {50001, 72},  {65, 768},
                           {1000, 768}, {16389, 768}, {77, 2048}, {4133, 2048}, {40, 4096},
                           {37, 5000},  {9, 8192},    {5, 16384}};
  for (const Shape2& s : shapes) {
    // The large shapes with the fills that reach every path (the CPU comparisons take time).
    const bool large = s.n * s.d > (int64_t(1) << 20);
    for (Src src : {Src::kGaussian, Src::kZeros, Src::kLarge, Src::kSpecials}) {
      if (large && (src == Src::kZeros || src == Src::kLarge)) continue;
      for (const Copies& cp : kCopies) check_rmsnorm_kernels(s.n, s.d, src, cp);
    }
    check_rmsnorm_kernels(s.n, s.d, Src::kSpecials, kCopies[2], ScalingPass::kBackward);
  }
}

// Every backward kernel (register, ring per group with depths 1–4) gives the same bytes, over
// the same widths (5000 and 4096: one staged tile fits, two do not), N off the tile and group
// multiples and N over 8192 (64-row blocks: two tiles per block).
TEST(GpuFusedQuantize, RmsNormBackwardKernelsAgree) {
  ASSERT_GT(cuda_device_count(), 0);
  const Shape2 shapes[] = {{1, 8},       {33, 8},    {100, 72},    {9000, 72}, {65, 768},
                           {16389, 768}, {77, 2048}, {8300, 2048}, {96, 4096}, {40, 5000}};
  for (const Shape2& s : shapes) {
    const bool large = s.n * s.d > (int64_t(1) << 20);
    for (Src src : {Src::kGaussian, Src::kZeros, Src::kLarge, Src::kSpecials}) {
      if (large && (src == Src::kZeros || src == Src::kLarge)) continue;
      check_rmsnorm_bwd_kernels(s.n, s.d, src, &kCopies[2], &kCopies[1], true);
      check_rmsnorm_bwd_kernels(s.n, s.d, src, &kCopies[0], nullptr, false);
      check_rmsnorm_bwd_kernels(s.n, s.d, src, nullptr, &kCopies[2], false);
    }
  }
}

TEST(GpuFusedQuantize, RopeBackwardSmallShapes) {
  ASSERT_GT(cuda_device_count(), 0);
  struct Heads {
    int64_t b, t, nh, dh, n_rot;
  };
  // Partial row tiles (B·T % 32 != 0), Dh 16 … 256, no rotated head, all rotated, Dh 8 (the
  // composition: fewer than 8 pairs per half).
  const Heads kHeads[] = {{1, 1, 2, 16, 1},   {2, 5, 3, 64, 2},  {3, 33, 6, 128, 4},
                          {1, 48, 5, 256, 5}, {2, 40, 4, 64, 0}, {1, 7, 3, 8, 2},
                          {2, 64, 12, 64, 10}};
  for (const Heads& h : kHeads) {
    for (Src src : {Src::kGaussian, Src::kZeros, Src::kLarge, Src::kSpecials}) {
      for (const Copies& cp : kCopies)
        check_rope_bwd(h.b, h.t, h.nh, h.dh, h.n_rot, src, cp, true, 2);
    }
    check_rope_bwd(h.b, h.t, h.nh, h.dh, h.n_rot, Src::kGaussian, kCopies[2], true, 0);
    check_rope_bwd(h.b, h.t, h.nh, h.dh, h.n_rot, Src::kSpecials, kCopies[2], true, 1);
    check_rope_bwd(h.b, h.t, h.nh, h.dh, h.n_rot, Src::kGaussian, kCopies[2], false, 2);
  }
}

TEST(GpuFusedQuantize, RopeBackwardModelShapes) {
  ASSERT_GT(cuda_device_count(), 0);
  // 1b (H 32, Hkv 8, Dh 64) and 8b-like (H 32, Hkv 8, Dh 128) qkv gradients, 8 × 2048 tokens.
  check_rope_bwd(8, 2048, 48, 64, 40, Src::kGaussian, kCopies[2], true, 2);
  check_rope_bwd(4, 2048, 48, 128, 40, Src::kGaussian, kCopies[2], true, 1);
}

TEST(GpuFusedQuantize, AttentionBackwardOutSmallShapes) {
  ASSERT_GT(cuda_device_count(), 0);
  struct Heads {
    int64_t b, t, h, hkv, dh;
  };
  // T % 32 == 0 (the fused pass) for Dh 64 and 128 and GQA groups 1–4; T = 40 (the composition).
  const Heads kHeads[] = {
      {1, 32, 2, 1, 64}, {2, 64, 4, 1, 128}, {3, 96, 6, 2, 64}, {2, 40, 2, 2, 64}};
  for (const Heads& hs : kHeads) {
    for (Src src : {Src::kGaussian, Src::kZeros, Src::kLarge, Src::kSpecials}) {
      for (const Copies& cp : kCopies)
        check_attention_bwd_out(hs.b, hs.t, hs.h, hs.hkv, hs.dh, src, cp, true);
    }
    check_attention_bwd_out(hs.b, hs.t, hs.h, hs.hkv, hs.dh, Src::kGaussian, kCopies[1], false);
  }
}

TEST(GpuFusedQuantize, AttentionBackwardOutModelShapes) {
  ASSERT_GT(cuda_device_count(), 0);
  // 1b (H 32, Hkv 8, Dh 64, 8 × 2048 tokens) and an 8b-like Dh 128 shape.
  check_attention_bwd_out(8, 2048, 32, 8, 64, Src::kGaussian, kCopies[1], true);
  check_attention_bwd_out(2, 2048, 32, 8, 128, Src::kGaussian, kCopies[2], true);
}

TEST(GpuFusedQuantize, SwigluSmallShapes) {
  ASSERT_GT(cuda_device_count(), 0);
  for (const Shape2& s : kSmall) {
    if (s.d > 8192) continue;
    for (Src src : {Src::kGaussian, Src::kZeros, Src::kLarge, Src::kSpecials}) {
      for (const Copies& cp : kCopies) {
        for (bool delayed : {true, false}) check_swiglu(s.n, s.d, src, cp, delayed, true);
      }
    }
    check_swiglu(s.n, s.d, Src::kGaussian, kCopies[2], true, false);
  }
}

TEST(GpuFusedQuantize, SwigluModelShapes) {
  ASSERT_GT(cuda_device_count(), 0);
  for (const Shape2& s : {Shape2{16384, 2048}, Shape2{4096, 8192}}) {
    for (Src src : {Src::kGaussian, Src::kSpecials}) {
      for (const Copies& cp : kCopies) check_swiglu(s.n, s.d, src, cp, true, true);
    }
    check_swiglu(s.n, s.d, Src::kGaussian, kCopies[2], false, false);
  }
}

TEST(GpuFusedQuantize, SwigluBackwardSmallShapes) {
  ASSERT_GT(cuda_device_count(), 0);
  for (const Shape2& s : kSmall) {
    if (s.d > 8192) continue;
    for (Src src : {Src::kGaussian, Src::kZeros, Src::kLarge, Src::kSpecials}) {
      for (const Copies& cp : kCopies) {
        for (bool delayed : {true, false}) check_swiglu_bwd(s.n, s.d, src, cp, delayed, true);
      }
    }
    check_swiglu_bwd(s.n, s.d, Src::kGaussian, kCopies[2], true, false);
  }
}

TEST(GpuFusedQuantize, SwigluBackwardModelShapes) {
  ASSERT_GT(cuda_device_count(), 0);
  for (const Shape2& s : {Shape2{16384, 2048}, Shape2{4096, 8192}}) {
    for (Src src : {Src::kGaussian, Src::kSpecials}) {
      for (const Copies& cp : kCopies) check_swiglu_bwd(s.n, s.d, src, cp, true, true);
    }
    check_swiglu_bwd(s.n, s.d, Src::kGaussian, kCopies[2], true, false);
  }
}

TEST(GpuFusedQuantize, SwigluBackwardWithHSmallShapes) {
  ASSERT_GT(cuda_device_count(), 0);
  for (const Shape2& s : kSmall) {
    if (s.d > 8192) continue;
    for (Src src : {Src::kGaussian, Src::kZeros, Src::kLarge, Src::kSpecials}) {
      for (const Copies& cp : kCopies) {
        // h columnwise (the model's case, fused) and row+col; rowwise only runs the composition.
        for (const Copies& cp_h : kCopies) check_swiglu_bwd_h(s.n, s.d, src, cp, cp_h, true);
      }
      check_swiglu_bwd_h(s.n, s.d, src, kCopies[2], kCopies[1], false);
    }
  }
}

TEST(GpuFusedQuantize, SwigluBackwardWithHModelShapes) {
  ASSERT_GT(cuda_device_count(), 0);
  // The model's case only (the CPU comparisons of large tensors are slow); specials and the
  // other copy choices run at the small shapes.
  for (const Shape2& s : {Shape2{16384, 2048}, Shape2{4096, 8192}}) {
    check_swiglu_bwd_h(s.n, s.d, Src::kGaussian, kCopies[2], kCopies[1], true);
  }
}

// Two fused calls on one state: the history keeps the max of both amaxes; results repeat exactly.
TEST(GpuFusedQuantize, RepeatsAndAccumulatesAmax) {
  ASSERT_GT(cuda_device_count(), 0);
  Context ctx(kGpu);
  const int64_t n = 1000, d = 768;
  const Tensor x1 = Tensor::copy_of(source(n, d, Src::kGaussian, 1.0, 5), kGpu);
  const Tensor x2 = Tensor::copy_of(source(n, d, Src::kGaussian, 3.0, 6), kGpu);
  const Tensor w = Tensor::copy_of(source(1, d, Src::kGaussian, 2.0, 7).view().reshape({d}), kGpu);
  States st(ScalingPass::kForward, 2.0f);
  QuantizedTensor a1, a2, b1, b2;
  rmsnorm_fwd_quantize(ctx, TensorView(), TensorView(), x1, w, kEps,
                       make_cfg(true, st.fused, kCopies[2]), a1);
  rmsnorm_fwd_quantize(ctx, TensorView(), TensorView(), x2, w, kEps,
                       make_cfg(true, st.fused, kCopies[2]), a2);
  rmsnorm_fwd_quantize(ctx, TensorView(), TensorView(), x1, w, kEps,
                       make_cfg(true, st.unfused, kCopies[2]), b1);
  rmsnorm_fwd_quantize(ctx, TensorView(), TensorView(), x2, w, kEps,
                       make_cfg(true, st.unfused, kCopies[2]), b2);
  ctx.synchronize();
  EXPECT_TRUE(same_quantized(a1, b1));
  EXPECT_TRUE(same_quantized(a2, b2));
  EXPECT_TRUE(same_bytes("history", st.fused.amax_history(), st.unfused.amax_history()));
  const float h = st.fused.history_at(0, 1);
  const float m1 = Tensor::copy_of(a1.amax.view(), Device::cpu()).ptr<float>()[0];
  const float m2 = Tensor::copy_of(a2.amax.view(), Device::cpu()).ptr<float>()[0];
  EXPECT_EQ(f32_bits(h), f32_bits(std::fmax(m1, m2)));
}

// Time of the fused op against the composition at the 124m / 1b widths (N = 16384), delayed
// scaling, without the bf16 output. GB/s over each path's own traffic; "eff" = the fused op's
// traffic over the path's time (comparable across the two paths).
TEST(GpuFusedQuantizePerf, Bandwidth) {
  ASSERT_GT(cuda_device_count(), 0);
  Context ctx(kGpu);
  const int64_t n = 16384;
  DelayedScalingState st(DelayedScalingConfig{}, ScalingPass::kForward, 2, kGpu);
  for (int64_t d : {768, 2048}) {
    const double copy = copy_gbps(ctx, n * d * 2);
    Tensor x = Tensor::copy_of(source(n, d, Src::kGaussian, 1.0, 1), kGpu);
    Tensor w = Tensor::copy_of(source(1, d, Src::kGaussian, 0.5, 2).view().reshape({d}), kGpu);
    Tensor y = Tensor::empty({n, d}, DType::kBF16, kGpu), r = Tensor::empty({n}, DType::kF32, kGpu);
    for (const Copies& cp : {kCopies[0], kCopies[2]}) {
      QuantConfig cfg = make_cfg(true, st, cp);
      const double codes = (cp.col ? 2.0 : 1.0) * n * d;
      const double fused_bytes = 2.0 * n * d + 2.0 * d + codes + 4.0 * n;
      const double unfused_bytes = fused_bytes + 2 * 2.0 * n * d;  // + y written and read back
      QuantizedTensor q;
      const Perf f = time_gpu(
          ctx, [&] { rmsnorm_fwd_quantize(ctx, TensorView(), r, x, w, kEps, cfg, q); },
          fused_bytes);
      const Perf u = time_gpu(
          ctx,
          [&] {
            rmsnorm_fwd(ctx, y, r, x, w, kEps);
            quantize(ctx, y, cfg, q);
          },
          unfused_bytes);
      std::printf(
          "rmsnorm+fp8 %-7s N=%ld D=%ld: copy %.0f GB/s | fused %s (%.0f%% of copy) | unfused %s "
          "(eff %.0f GB/s) | speed-up %.2fx\n",
          cp.name, long(n), long(d), copy, f.str().c_str(), 100 * f.gb_per_s / copy,
          u.str().c_str(), fused_bytes / (u.ms * 1e6), u.ms / f.ms);
    }
  }
  for (int64_t f_dim : {2048, 8192}) {
    const double copy = copy_gbps(ctx, n * f_dim * 2);
    Tensor gu = Tensor::copy_of(source(n, 2 * f_dim, Src::kGaussian, 1.0, 3), kGpu);
    Tensor h = Tensor::empty({n, f_dim}, DType::kBF16, kGpu);
    for (const Copies& cp : {kCopies[0], kCopies[2]}) {
      QuantConfig cfg = make_cfg(true, st, cp);
      const double fused_bytes = 4.0 * n * f_dim + (cp.col ? 2.0 : 1.0) * n * f_dim;
      const double unfused_bytes = fused_bytes + 2 * 2.0 * n * f_dim;
      QuantizedTensor q;
      const Perf f = time_gpu(
          ctx, [&] { swiglu_fwd_quantize(ctx, TensorView(), gu, cfg, q); }, fused_bytes);
      const Perf u = time_gpu(
          ctx,
          [&] {
            swiglu_fwd(ctx, h, gu);
            quantize(ctx, h, cfg, q);
          },
          unfused_bytes);
      std::printf(
          "swiglu+fp8  %-7s N=%ld F=%ld: copy %.0f GB/s | fused %s (%.0f%% of copy) | unfused %s "
          "(eff %.0f GB/s) | speed-up %.2fx\n",
          cp.name, long(n), long(f_dim), copy, f.str().c_str(), 100 * f.gb_per_s / copy,
          u.str().c_str(), fused_bytes / (u.ms * 1e6), u.ms / f.ms);
    }
    // The backward: reads gate_up and dout (6 bytes per F-element), writes 2 codes per copy.
    Tensor dy = Tensor::copy_of(source(n, f_dim, Src::kGaussian, 1.0, 4), kGpu);
    Tensor dgu = Tensor::empty({n, 2 * f_dim}, DType::kBF16, kGpu);
    DelayedScalingState sb(DelayedScalingConfig{}, ScalingPass::kBackward, 2, kGpu);
    for (const Copies& cp : {kCopies[2]}) {
      QuantConfig cfg = make_cfg(true, sb, cp);
      const double fused_bytes = 6.0 * n * f_dim + 2.0 * (cp.col ? 2.0 : 1.0) * n * f_dim;
      const double unfused_bytes = fused_bytes + 2 * 4.0 * n * f_dim;  // + dgate_up out and in
      QuantizedTensor q;
      const Perf f = time_gpu(
          ctx, [&] { swiglu_bwd_quantize(ctx, TensorView(), dy, gu, cfg, q); }, fused_bytes);
      const Perf u = time_gpu(
          ctx,
          [&] {
            swiglu_bwd(ctx, dgu, dy, gu);
            quantize(ctx, dgu, cfg, q);
          },
          unfused_bytes);
      std::printf(
          "swiglu bwd+fp8 %-7s N=%ld F=%ld: copy %.0f GB/s | fused %s (%.0f%% of copy) | unfused "
          "%s (eff %.0f GB/s) | speed-up %.2fx\n",
          cp.name, long(n), long(f_dim), copy, f.str().c_str(), 100 * f.gb_per_s / copy,
          u.str().c_str(), fused_bytes / (u.ms * 1e6), u.ms / f.ms);
    }
    // With h's columnwise codes remade in the same pass (the down linear's wgrad input), against
    // the backward plus the separate recompute pass it replaces (gate_up read twice).
    {
      QuantConfig cfg = make_cfg(true, sb, kCopies[2]);
      QuantConfig cfg_h = make_cfg(true, st, kCopies[1]);
      const double fused_bytes = 6.0 * n * f_dim + 4.0 * n * f_dim + 1.0 * n * f_dim;
      const double two_pass_bytes = fused_bytes + 4.0 * n * f_dim;
      QuantizedTensor q, qh;
      const Perf f = time_gpu(
          ctx, [&] { swiglu_bwd_quantize_with_h(ctx, TensorView(), dy, gu, cfg, q, cfg_h, qh); },
          fused_bytes);
      const Perf u = time_gpu(
          ctx,
          [&] {
            swiglu_fwd_quantize(ctx, TensorView(), gu, cfg_h, qh);
            swiglu_bwd_quantize(ctx, TensorView(), dy, gu, cfg, q);
          },
          two_pass_bytes);
      std::printf(
          "swiglu bwd+fp8+h col N=%ld F=%ld: copy %.0f GB/s | fused %s (%.0f%% of copy) | two "
          "passes %s (eff %.0f GB/s) | speed-up %.2fx\n",
          long(n), long(f_dim), copy, f.str().c_str(), 100 * f.gb_per_s / copy, u.str().c_str(),
          fused_bytes / (u.ms * 1e6), u.ms / f.ms);
    }
  }
}

}  // namespace
}  // namespace lowbit::test
