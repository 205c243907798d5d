// Op test harness: one generic way to fill inputs, run an op on the CPU twin and on the CUDA
// kernel, compare the results with a tolerance derived from the formats, guard every buffer
// against out-of-bounds writes, check backward ops by finite differences, and time kernels.
// Header-only; used by the CPU tests (tests/ops/*.cpp) and the GPU tests (tests/gpu/*.cpp, as
// #include "ops/op_harness.h"). Everything is in namespace lowbit::test.
//
// ---- Describing an op case -------------------------------------------------------------------
//   OpCase c;
//   c.name = "rmsnorm_fwd 65x80";
//   c.args = {in("x", DType::kBF16, {65, 80}, Fill::gaussian()),
//             in("w", DType::kBF16, {80}, Fill::gaussian(0.5, 1.0)),
//             out("out", DType::kBF16, {65, 80}, tol_reduction(DType::kBF16, 80)),
//             out("rstd", DType::kF32, {65}, tol_reduction(DType::kF32, 80))};
//   c.run = [](Context& ctx, const Args& a) { rmsnorm_fwd(ctx, a["out"], a["rstd"], a["x"],
//                                                         a["w"], 1e-5f); };
// Roles: in (read only: every byte must be unchanged afterwards), out (starts as poison, all
// bytes 0xFF = NaN for floats, unless a fill is given), inout (filled, then compared). An arg
// may be a strided view (`strides`, in elements); the gaps between its elements are guarded
// like the regions before and after it.
//
// ---- Fills (deterministic: keyed by the seed, the arg's position and the element index) -------
//   Fill::gaussian(stddev, mean)  Fill::uniform(lo, hi)  Fill::zeros()  Fill::constant(v)
//   Fill::ints(lo, hi)            integers uniform in [lo, hi) (token ids, targets)
//   Fill::large(mag)              ±mag·[0.25, 1] (default 3e38, near the bf16/f32 max)
//   Fill::small()                 ±2^[-133, -119]: bf16 subnormals and the smallest normals
//   Fill::specials(stddev)        gaussian with +inf, -inf and NaN sprinkled (always ≥ 1 each
//                                 when the tensor has ≥ 3 elements)
//   Fill::custom(name, fn)        fn(flat index) -> value, e.g. a fixed token pattern (fn
//                                 must be pure: large tensors are filled by several threads)
//   standard_fills()              {gaussian, zeros, large, small, specials}
// Values are generated in double and stored with the arg's dtype rounding (bf16: RN).
//
// ---- Tolerances (Tol: |got - want| <= abs + rel·|want| + rel_max·max|want|) -----------------
//   Tol::exact()                  identical values (and zero signs); NaN matches any NaN
//   tol_rounded(out, fp32_ops)    an fp32 computation rounded once to `out`: one ulp of `out`
//                                 (2·u) + fp32_ops·u_f32 + the format's smallest subnormal step
//   tol_reduction(out, terms)     as tol_rounded, plus terms·u_f32 relative to the tensor's max
//                                 |want| for sums over `terms` values taken in another order
// u = unit roundoff = 2^-(mantissa bits + 1): f32 2^-24, bf16 2^-8, f16 2^-11. Every check fails
// on any NaN/inf difference first: NaN must meet NaN, inf the same inf. Tol::nmse adds a
// whole-tensor NMSE bound on top of the element bound (for attention-like outputs).
//
// ---- Running and comparing -------------------------------------------------------------------
//   EXPECT_TRUE(compare_cpu_gpu(c));            // GPU kernel vs CPU twin, same inputs (GPU only)
//   OpRun r = run_op(c, Device::cpu());        // one run; r.values("out"), r.initial("x"),
//   EXPECT_TRUE(r.intact());                    //   guards / gaps / inputs untouched
//   EXPECT_TRUE(expect_close("out", r.shape("out"), r.values("out"), want, tol));
//   EXPECT_TRUE(throws_user_error([&] { op(...); }, {"rmsnorm_fwd", "w [D]"}));
// compare_cpu_gpu reports the first mismatch with its coordinates, both values and the bound,
// plus how many elements differ and the largest difference.
//
// ---- Finite-difference gradient check (CPU, tiny shapes) -------------------------------------
//   GradCase g;  g.args = {...};  g.forward = ...;  g.backward = ...;
//   g.loss  = {{"out", "dout"}};                 // L = Σ dout·out (dout: random weights r)
//   g.grads = {{"x", "dx"}, {"w", "dw"}};        // backward must write dL/dx into dx, ...
//   EXPECT_TRUE(check_gradients(g));
// Gradient args are zeroed before `backward` (so += accumulators give the plain gradient).
// Each checked input element is perturbed by ±h and ±2h (h a power of two, exact in the
// dtype) and dL/dx is the fourth-order stencil (8(L₊₁ − L₋₁) − (L₊₂ − L₋₂)) / 12h, L summed in
// double. Run it on f32 tensors (the CPU twins accept f32): the forward then rounds only in fp32
// and the bound is rtol·(|fd| + 0.1·max|fd|) plus the forward's rounding noise estimated from
// the outputs that moved (1.5 · 16·u(dtype)·Σ|r·out| / h). `forward` must not modify its inputs.
//
// ---- Performance (GPU) -----------------------------------------------------------------------
//   Perf p = time_op(ctx, c, bytes_moved, flops);   // cudaEvents over warm-up + iterations
//   double peak = copy_gbps(ctx, bytes);            // device-to-device copy, the reference
//   std::printf("%s\n", p.str().c_str());
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "lowbit/core.h"
#include "lowbit/core/cuda_check.h"
#include "lowbit/formats.h"

namespace lowbit::test {

// ---- fills ---------------------------------------------------------------------------------

struct Fill {
  enum class Kind {
    kGaussian,
    kUniform,
    kConstant,
    kInts,
    kLarge,
    kSmall,
    kSpecials,
    kPoison,
    kCustom
  };
  Kind kind = Kind::kGaussian;
  double a = 1.0, b = 0.0;  // gaussian: stddev, mean; uniform/ints: lo, hi; constant/large: value
  std::string label;        // for messages
  std::function<double(int64_t)> fn;

  static Fill gaussian(double stddev = 1.0, double mean = 0.0) {
    return {Kind::kGaussian, stddev, mean, fmt::format("gaussian({}, {})", stddev, mean), {}};
  }
  static Fill uniform(double lo, double hi) {
    return {Kind::kUniform, lo, hi, fmt::format("uniform[{}, {})", lo, hi), {}};
  }
  static Fill constant(double v) {
    return {Kind::kConstant, v, 0, fmt::format("const({})", v), {}};
  }
  static Fill zeros() { return {Kind::kConstant, 0, 0, "zeros", {}}; }
  static Fill ints(int64_t lo, int64_t hi) {
    return {Kind::kInts, double(lo), double(hi), fmt::format("ints[{}, {})", lo, hi), {}};
  }
  static Fill large(double magnitude = 3e38) {
    return {Kind::kLarge, magnitude, 0, fmt::format("large({:g})", magnitude), {}};
  }
  static Fill small() { return {Kind::kSmall, 0, 0, "small", {}}; }
  static Fill specials(double stddev = 1.0) { return {Kind::kSpecials, stddev, 0, "specials", {}}; }
  static Fill poison() { return {Kind::kPoison, 0, 0, "poison", {}}; }
  static Fill custom(std::string name, std::function<double(int64_t)> f) {
    return {Kind::kCustom, 0, 0, std::move(name), std::move(f)};
  }
  const std::string& name() const { return label; }
};

inline std::vector<Fill> standard_fills() {
  return {Fill::gaussian(), Fill::zeros(), Fill::large(), Fill::small(), Fill::specials()};
}

// ---- tolerances ----------------------------------------------------------------------------

inline int mantissa_bits(DType t) {
  switch (t) {
    case DType::kF32: return 23;
    case DType::kBF16: return 7;
    case DType::kF16: return 10;
    default: return 0;  // integers: exact
  }
}
// Unit roundoff 2^-(mantissa bits + 1); 0 for integer types.
inline double unit_roundoff(DType t) {
  const int m = mantissa_bits(t);
  return m > 0 ? std::ldexp(1.0, -(m + 1)) : 0.0;
}
// Spacing of the format's subnormals (the smallest nonzero magnitude).
inline double subnormal_step(DType t) {
  switch (t) {
    case DType::kF32: return std::ldexp(1.0, -149);
    case DType::kBF16: return std::ldexp(1.0, -133);
    case DType::kF16: return std::ldexp(1.0, -24);
    default: return 0.0;
  }
}

struct Tol {
  bool identical = false;  // Tol::exact()
  double rel = 0;          // × |want|
  double abs = 0;          // absolute
  double rel_max = 0;      // × max |want| over the finite elements of the tensor
  double nmse = 0;  // > 0: Σ(got − want)² / Σ want² over finite elements must not exceed it

  static Tol exact() {
    Tol t;
    t.identical = true;
    return t;
  }
  double bound(double want, double max_abs) const {
    return abs + rel * std::fabs(want) + rel_max * max_abs;
  }
  std::string str() const {
    if (identical) return "exact";
    std::string s = fmt::format("rel {:.3g}, abs {:.3g}", rel, abs);
    if (rel_max > 0) s += fmt::format(", rel_max {:.3g}", rel_max);
    if (nmse > 0) s += fmt::format(", nmse {:.3g}", nmse);
    return s;
  }
};

// An output stored as `out` after an fp32 computation whose two implementations may differ by
// `fp32_ops` fp32 roundings (e.g. expf vs exp, a different operation order): the two fp32
// values differ by ≤ fp32_ops·u_f32 relative and may then round to neighbouring codes of `out`
// (one ulp ≤ 2·u(out)·|want|); subnormal outputs get one subnormal step.
inline Tol tol_rounded(DType out, double fp32_ops = 4) {
  Tol t;
  t.rel = 2 * unit_roundoff(out) + fp32_ops * unit_roundoff(DType::kF32);
  t.abs = subnormal_step(out) + fp32_ops * subnormal_step(DType::kF32);
  return t;
}
// A sum over `terms` values (e.g. a row of RMSNorm) accumulated in a different order by the
// two implementations: the order changes a sum by ≤ terms·u_f32·Σ|terms|, which for mixed signs
// is not bounded relative to the result, so it is taken relative to the tensor's scale.
inline Tol tol_reduction(DType out, int64_t terms, double fp32_ops = 4) {
  Tol t = tol_rounded(out, fp32_ops + double(terms));
  t.rel_max = double(terms) * unit_roundoff(DType::kF32);
  return t;
}

// ---- op description -------------------------------------------------------------------------

enum class Role { kIn, kOut, kInOut };

struct ArgSpec {
  std::string name;
  DType dtype = DType::kBF16;
  Shape shape;
  Role role = Role::kIn;
  Fill fill = Fill::gaussian();
  Tol tol = Tol::exact();
  Shape strides{};  // ndim 0: contiguous; otherwise the view's strides in elements
};

inline ArgSpec in(std::string name, DType t, Shape s, Fill f = Fill::gaussian()) {
  return {std::move(name), t, s, Role::kIn, std::move(f), Tol::exact(), Shape{}};
}
inline ArgSpec out(std::string name, DType t, Shape s, Tol tol = Tol::exact()) {
  return {std::move(name), t, s, Role::kOut, Fill::poison(), tol, Shape{}};
}
inline ArgSpec inout(std::string name, DType t, Shape s, Fill f, Tol tol = Tol::exact()) {
  return {std::move(name), t, s, Role::kInOut, std::move(f), tol, Shape{}};
}
// The same arg as a strided view (strides in elements, last dim usually 1).
inline ArgSpec strided(ArgSpec a, Shape strides) {
  a.strides = strides;
  return a;
}

// Named views handed to the op's callback (on the device the case runs on).
class Args {
 public:
  const TensorView& operator[](std::string_view name) const {
    for (const auto& [n, v] : views_) {
      if (n == name) return v;
    }
    LOWBIT_CHECK(false, "op case has no arg named '{}'", name);
    return views_.front().second;
  }
  void add(std::string name, TensorView v) { views_.emplace_back(std::move(name), v); }

 private:
  std::vector<std::pair<std::string, TensorView>> views_;
};

using OpFn = std::function<void(Context&, const Args&)>;

struct OpCase {
  std::string name;
  std::vector<ArgSpec> args;
  OpFn run;
};

// ---- implementation details -----------------------------------------------------------------
namespace detail {

inline constexpr int64_t kGuardBytes = 256;  // keeps the view 256-byte aligned

inline uint8_t guard_byte(int64_t i) { return static_cast<uint8_t>(i * 131 + 17); }

// Uniform in [0, 1) from the 24 high bits of a Philox word.
inline double unit(uint32_t w) { return double(w >> 8) * 0x1p-24; }

// A standard normal value for element i of stream (seed, stream) (Box-Muller over one Philox
// block), for tests that build their own inputs.
inline double philox_gauss(uint64_t seed, uint64_t stream, int64_t i) {
  const Philox4 r = philox_block(seed, stream, uint64_t(i));
  const double u1 = unit(r.v[0]) + 0x1p-25, u2 = unit(r.v[1]);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// One Philox block per element: four independent words for the fill's choices.
inline double fill_value(const Fill& f, uint64_t seed, uint64_t stream, int64_t i, int64_t n) {
  if (f.kind == Fill::Kind::kConstant) return f.a;
  if (f.kind == Fill::Kind::kCustom) return f.fn(i);
  const Philox4 r = philox_block(seed, stream, uint64_t(i));
  const double sign = (r.v[2] & 1) ? -1.0 : 1.0;
  auto gauss = [&] {  // Box-Muller
    const double u1 = unit(r.v[0]) + 0x1p-25, u2 = unit(r.v[1]);
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  };
  switch (f.kind) {
    case Fill::Kind::kGaussian: return f.b + f.a * gauss();
    case Fill::Kind::kUniform: return f.a + (f.b - f.a) * unit(r.v[0]);
    case Fill::Kind::kInts: {
      const uint64_t span = uint64_t(f.b - f.a);
      return f.a + double(span ? r.v[0] % span : 0);
    }
    case Fill::Kind::kLarge: return sign * f.a * (0.25 + 0.75 * unit(r.v[0]));
    case Fill::Kind::kSmall:
      return sign * std::ldexp(1.0 + unit(r.v[0]), -133 + int(14 * unit(r.v[1])));
    case Fill::Kind::kSpecials: {
      if (n >= 3 && i == n / 3) return INFINITY;
      if (n >= 3 && i == (2 * n) / 3) return -INFINITY;
      if (n >= 3 && i == n - 1) return NAN;
      const uint32_t pick = r.v[3] % 64;
      if (pick == 0) return INFINITY;
      if (pick == 1) return -INFINITY;
      if (pick == 2) return NAN;
      return f.a * gauss();
    }
    default: return 0.0;
  }
}

inline void store_value(DType t, void* p, double v) {
  switch (t) {
    case DType::kF32: *static_cast<float*>(p) = static_cast<float>(v); break;
    case DType::kBF16: *static_cast<uint16_t*>(p) = f32_to_bf16_rn(static_cast<float>(v)); break;
    case DType::kF16:
      *static_cast<uint16_t*>(p) = static_cast<uint16_t>(encode_rn(DType::kF16, float(v)));
      break;
    case DType::kI32: *static_cast<int32_t*>(p) = static_cast<int32_t>(v); break;
    case DType::kI64: *static_cast<int64_t*>(p) = static_cast<int64_t>(v); break;
    case DType::kU8: *static_cast<uint8_t*>(p) = static_cast<uint8_t>(v); break;
    default: LOWBIT_CHECK(false, "the op harness does not store {}", dtype_name(t));
  }
}

inline double load_value(DType t, const void* p) {
  switch (t) {
    case DType::kF32: return *static_cast<const float*>(p);
    case DType::kBF16: return bf16_to_f32(*static_cast<const uint16_t*>(p));
    case DType::kF16: return decode(DType::kF16, *static_cast<const uint16_t*>(p));
    case DType::kI32: return *static_cast<const int32_t*>(p);
    case DType::kI64: return double(*static_cast<const int64_t*>(p));
    case DType::kU8: return *static_cast<const uint8_t*>(p);
    default: LOWBIT_CHECK(false, "the op harness does not load {}", dtype_name(t));
  }
  return 0.0;
}

// Element offsets (in elements, from the view's start) of every logical element, row-major.
inline std::vector<int64_t> element_offsets(const Shape& shape, const Shape& strides) {
  const int64_t n = shape.numel();
  std::vector<int64_t> off(static_cast<size_t>(n));
  std::vector<int64_t> idx(static_cast<size_t>(shape.ndim), 0);
  for (int64_t e = 0; e < n; ++e) {
    int64_t o = 0;
    for (int d = 0; d < shape.ndim; ++d) o += idx[d] * strides.d[d];
    off[e] = o;
    for (int d = shape.ndim - 1; d >= 0; --d) {
      if (++idx[d] < shape.d[d]) break;
      idx[d] = 0;
    }
  }
  return off;
}

inline std::string coords(const Shape& shape, int64_t flat) {
  std::string s;
  for (int d = shape.ndim - 1; d >= 0; --d) {
    const int64_t n = shape.d[d] > 0 ? shape.d[d] : 1;
    s = std::to_string(flat % n) + (s.empty() ? "" : ", ") + s;
    flat /= n;
  }
  return "[" + s + "]";
}

inline std::string show(double v, DType t) {
  if (!dtype_is_float(t)) return fmt::format("{}", int64_t(v));
  return fmt::format("{:.9g}", v);
}

// One arg's storage: [guard | span of the view | guard], as bytes.
struct Buffer {
  ArgSpec spec;
  Shape strides;                 // effective strides
  int64_t esize = 0;             // bytes per element
  int64_t span_bytes = 0;        // bytes from the first to past the last element
  std::vector<int64_t> offsets;  // element offsets (elements)
  std::vector<uint8_t> covered;  // per span byte: 1 when it belongs to an element
  Tensor host;                   // u8 [guard + span + guard] on the CPU
  std::vector<uint8_t> initial;  // its bytes after filling
  TensorView view_on(const Tensor& storage) const {
    return TensorView(static_cast<uint8_t*>(storage.data()) + kGuardBytes, spec.dtype, spec.shape,
                      strides, storage.device());
  }
  const uint8_t* elem(int64_t e) const {
    return static_cast<const uint8_t*>(host.data()) + kGuardBytes + offsets[e] * esize;
  }
  uint8_t* elem(int64_t e) {
    return static_cast<uint8_t*>(host.data()) + kGuardBytes + offsets[e] * esize;
  }
  std::vector<double> values() const {
    std::vector<double> v(offsets.size());
    for (size_t e = 0; e < offsets.size(); ++e) v[e] = load_value(spec.dtype, elem(int64_t(e)));
    return v;
  }
};

inline Buffer make_buffer(const ArgSpec& spec, uint64_t seed, uint64_t stream) {
  Buffer b;
  b.spec = spec;
  LOWBIT_CHECK(dtype_bits(spec.dtype) % 8 == 0, "arg '{}': packed dtypes are not supported",
               spec.name);
  b.esize = dtype_bits(spec.dtype) / 8;
  b.strides = spec.strides.ndim == 0 ? contiguous_strides(spec.shape) : spec.strides;
  LOWBIT_CHECK(b.strides.ndim == spec.shape.ndim, "arg '{}': strides {} for shape {}", spec.name,
               b.strides.str(), spec.shape.str());
  b.offsets = element_offsets(spec.shape, b.strides);
  int64_t span = 0;
  for (int64_t o : b.offsets) span = std::max(span, o + 1);
  b.span_bytes = span * b.esize;
  b.covered.assign(static_cast<size_t>(b.span_bytes), 0);
  for (int64_t o : b.offsets) std::memset(&b.covered[o * b.esize], 1, b.esize);
  const int64_t total = kGuardBytes + b.span_bytes + kGuardBytes;
  b.host = Tensor::empty({total}, DType::kU8, Device::cpu());
  uint8_t* p = static_cast<uint8_t*>(b.host.data());
  for (int64_t i = 0; i < total; ++i) p[i] = guard_byte(i);
  const int64_t n = int64_t(b.offsets.size());
  // Large tensors are filled by several threads (values depend only on the element index).
  auto fill_range = [&](int64_t lo, int64_t hi) {
    for (int64_t e = lo; e < hi; ++e) {
      if (spec.fill.kind == Fill::Kind::kPoison) {
        std::memset(b.elem(e), 0xFF, b.esize);
      } else {
        store_value(spec.dtype, b.elem(e), fill_value(spec.fill, seed, stream, e, n));
      }
    }
  };
  const int64_t workers =
      n < (int64_t(1) << 18) ? 1 : std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, 16);
  std::vector<std::thread> pool;
  for (int64_t w = 1; w < workers; ++w) {
    pool.emplace_back(fill_range, n * w / workers, n * (w + 1) / workers);
  }
  fill_range(0, n / workers);
  for (auto& th : pool) th.join();
  b.initial.assign(p, p + total);
  return b;
}

// "" when every byte the op may not write is as it was: guards and gaps of every arg, and all
// of an input's bytes.
inline std::string check_intact(const Buffer& b, const char* where) {
  const uint8_t* p = static_cast<const uint8_t*>(b.host.data());
  const int64_t total = int64_t(b.initial.size());
  for (int64_t i = 0; i < total; ++i) {
    if (p[i] == b.initial[i]) continue;
    const int64_t s = i - kGuardBytes;
    if (s < 0) {
      return fmt::format("{}: arg '{}': guard byte {} before the data was overwritten", where,
                         b.spec.name, -s);
    }
    if (s >= b.span_bytes) {
      return fmt::format("{}: arg '{}': guard byte {} after the data was overwritten", where,
                         b.spec.name, s - b.span_bytes);
    }
    if (!b.covered[s]) {
      return fmt::format("{}: arg '{}': byte {} in a gap of the strided view {} was overwritten",
                         where, b.spec.name, s, b.strides.str());
    }
    if (b.spec.role == Role::kIn) {
      return fmt::format("{}: input '{}' was modified (element byte {})", where, b.spec.name, s);
    }
  }
  return "";
}

inline std::vector<Buffer> make_buffers(const std::vector<ArgSpec>& specs, uint64_t seed) {
  std::vector<Buffer> bufs;
  for (size_t i = 0; i < specs.size(); ++i) bufs.push_back(make_buffer(specs[i], seed, 1000 + i));
  return bufs;
}

}  // namespace detail

// ---- one run of an op case ------------------------------------------------------------------

class OpRun {
 public:
  std::vector<detail::Buffer> bufs;
  std::string integrity;  // "" when guards, gaps and inputs are intact

  const detail::Buffer& buf(std::string_view name) const {
    for (const auto& b : bufs) {
      if (b.spec.name == name) return b;
    }
    LOWBIT_CHECK(false, "op run has no arg named '{}'", name);
    return bufs.front();
  }
  // Values of the arg's elements after the run, row-major over its shape.
  std::vector<double> values(std::string_view name) const { return buf(name).values(); }
  // Values as filled, before the run.
  std::vector<double> initial(std::string_view name) const {
    const detail::Buffer& b = buf(name);
    std::vector<double> v(b.offsets.size());
    for (size_t e = 0; e < v.size(); ++e) {
      v[e] = detail::load_value(b.spec.dtype,
                                &b.initial[detail::kGuardBytes + b.offsets[e] * b.esize]);
    }
    return v;
  }
  const Shape& shape(std::string_view name) const { return buf(name).spec.shape; }
  ::testing::AssertionResult intact() const {
    if (integrity.empty()) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << integrity;
  }
};

// Runs `fn` over buffers placed on `dev` (copied there and back when it is a GPU).
inline void run_on(Device dev, std::vector<detail::Buffer>& bufs, const OpFn& fn,
                   Context* ctx_in = nullptr) {
  Context local(dev);
  Context& ctx = ctx_in ? *ctx_in : local;
  if (dev.is_cpu()) {
    Args a;
    for (auto& b : bufs) a.add(b.spec.name, b.view_on(b.host));
    fn(ctx, a);
    return;
  }
  std::vector<Tensor> dev_store;
  Args a;
  for (auto& b : bufs) {
    dev_store.push_back(Tensor::copy_of(b.host.view(), dev));
    a.add(b.spec.name, b.view_on(dev_store.back()));
  }
  fn(ctx, a);
  ctx.synchronize();
  LOWBIT_CUDA_CHECK(cudaGetLastError());
  for (size_t i = 0; i < bufs.size(); ++i) copy_tensor(bufs[i].host.view(), dev_store[i].view());
}

// Fills the case's args (seeded), runs it once on `dev` and keeps the buffers on the host.
// `same_inputs`: a run of the same case whose initial contents are reused instead of filling
// again (a speed-up for large tensors).
inline OpRun run_op(const OpCase& c, Device dev, uint64_t seed = 1,
                    const OpRun* same_inputs = nullptr) {
  OpRun r;
  if (same_inputs != nullptr) {
    r.bufs = same_inputs->bufs;
    for (auto& b : r.bufs) {  // fresh storage holding the initial bytes
      b.host = Tensor::empty(b.host.shape(), DType::kU8, Device::cpu());
      std::memcpy(b.host.data(), b.initial.data(), b.initial.size());
    }
  } else {
    r.bufs = detail::make_buffers(c.args, seed);
  }
  run_on(dev, r.bufs, c.run);
  for (const auto& b : r.bufs) {
    if (r.integrity.empty()) r.integrity = detail::check_intact(b, dev.str().c_str());
  }
  return r;
}

// ---- comparison -----------------------------------------------------------------------------

// Compares got against want element by element (same length, row-major over `shape`) under
// `tol`; NaN/inf differences fail regardless of the tolerance. The message names the first
// mismatch with its coordinates, both values and the bound.
inline ::testing::AssertionResult expect_close(std::string_view what, const Shape& shape,
                                               const std::vector<double>& got,
                                               const std::vector<double>& want, const Tol& tol,
                                               DType dtype = DType::kF32) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure()
           << what << ": " << got.size() << " values, expected " << want.size();
  }
  double max_abs = 0, err2 = 0, ref2 = 0, worst = 0;
  for (double w : want) {
    if (std::isfinite(w)) max_abs = std::max(max_abs, std::fabs(w));
  }
  int64_t bad = 0, first = -1;
  std::string first_msg;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    std::string why;
    if (std::isnan(w) || std::isnan(g)) {
      if (std::isnan(w) != std::isnan(g)) why = "NaN mismatch";
    } else if (std::isinf(w) || std::isinf(g)) {
      if (g != w) why = "inf mismatch";
    } else {
      const double d = std::fabs(g - w);
      err2 += d * d;
      ref2 += w * w;
      worst = std::max(worst, d);
      if (tol.identical) {
        if (g != w || std::signbit(g) != std::signbit(w)) why = "not identical";
      } else if (d > tol.bound(w, max_abs)) {
        why = fmt::format("|diff| {:.4g} > bound {:.4g}", d, tol.bound(w, max_abs));
      }
    }
    if (why.empty()) continue;
    if (bad++ == 0) {
      first = int64_t(i);
      first_msg =
          fmt::format("{}{}: got {}, want {} ({}; tol {})", what, detail::coords(shape, first),
                      detail::show(g, dtype), detail::show(w, dtype), why, tol.str());
    }
  }
  const double nmse = ref2 > 0 ? err2 / ref2 : (err2 > 0 ? INFINITY : 0.0);
  if (bad == 0 && (tol.nmse <= 0 || nmse <= tol.nmse)) return ::testing::AssertionSuccess();
  auto f = ::testing::AssertionFailure();
  if (bad > 0) f << first_msg << "; ";
  f << bad << " of " << got.size() << " elements differ, max |diff| " << worst << ", nmse " << nmse;
  if (tol.nmse > 0 && nmse > tol.nmse) f << " > " << tol.nmse;
  return f;
}

// The value `v` takes when stored as `t` (bf16: RN of the fp32 value).
inline double round_to(DType t, double v) {
  uint8_t tmp[8];
  detail::store_value(t, tmp, v);
  return detail::load_value(t, tmp);
}

// Runs `c` on the CPU twin and on the first GPU from identical inputs and compares every out
// and inout arg under its tolerance; also checks guards, gaps and inputs on both sides.
inline ::testing::AssertionResult compare_cpu_gpu(const OpCase& c, uint64_t seed = 1) {
  if (cuda_device_count() == 0) {
    return ::testing::AssertionFailure() << c.name << ": needs a CUDA GPU";
  }
  OpRun cpu = run_op(c, Device::cpu(), seed);
  OpRun gpu = run_op(c, Device::cuda(0), seed, &cpu);
  if (!cpu.integrity.empty())
    return ::testing::AssertionFailure() << c.name << ": " << cpu.integrity;
  if (!gpu.integrity.empty())
    return ::testing::AssertionFailure() << c.name << ": " << gpu.integrity;
  for (size_t i = 0; i < c.args.size(); ++i) {
    const ArgSpec& s = c.args[i];
    if (s.role == Role::kIn) continue;
    auto r = expect_close(c.name + " " + s.name, s.shape, gpu.bufs[i].values(),
                          cpu.bufs[i].values(), s.tol, s.dtype);
    if (!r) return ::testing::AssertionFailure() << "GPU vs CPU: " << r.message();
  }
  return ::testing::AssertionSuccess();
}

// Success when fn() throws a UserError whose message contains every one of `needles` (e.g. the
// op's name, the argument's name and the offending value).
inline ::testing::AssertionResult throws_user_error(
    const std::function<void()>& fn, std::initializer_list<std::string_view> needles) {
  try {
    fn();
  } catch (const UserError& e) {
    const std::string msg = e.what();
    for (std::string_view n : needles) {
      if (msg.find(n) == std::string::npos) {
        return ::testing::AssertionFailure()
               << "UserError \"" << msg << "\" does not mention \"" << n << "\"";
      }
    }
    return ::testing::AssertionSuccess() << msg;
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "expected a UserError, got: " << e.what();
  }
  return ::testing::AssertionFailure() << "expected a UserError, nothing was thrown";
}

// ---- finite-difference gradient check ---------------------------------------------------------

struct GradCase {
  std::string name;
  std::vector<ArgSpec> args;  // host tensors (f32 recommended), filled as usual
  OpFn forward;               // must not modify its inputs
  OpFn backward;
  std::vector<std::pair<std::string, std::string>> loss;   // {output, weights}: L = Σ w·out
  std::vector<std::pair<std::string, std::string>> grads;  // {input, dL/dinput from backward}
  double step = 0x1p-7;  // h ≈ step · max(1, |x|), rounded down to a power of two
  double rtol = 1e-3;
  int max_elems = 128;  // per input: elements checked, spread evenly (all when fewer)
};

inline ::testing::AssertionResult check_gradients(const GradCase& c, uint64_t seed = 1) {
  using detail::Buffer;
  std::vector<Buffer> bufs = detail::make_buffers(c.args, seed);
  auto find = [&](const std::string& n) -> Buffer& {
    for (auto& b : bufs) {
      if (b.spec.name == n) return b;
    }
    LOWBIT_CHECK(false, "grad case '{}' has no arg named '{}'", c.name, n);
    return bufs.front();
  };
  // Analytic gradients: forward, zeroed gradient buffers, backward.
  run_on(Device::cpu(), bufs, c.forward);
  for (const auto& [x, g] : c.grads) {
    Buffer& gb = find(g);
    for (size_t e = 0; e < gb.offsets.size(); ++e)
      detail::store_value(gb.spec.dtype, gb.elem(int64_t(e)), 0.0);
  }
  run_on(Device::cpu(), bufs, c.backward);
  std::vector<std::vector<double>> analytic;
  for (const auto& [x, g] : c.grads) analytic.push_back(find(g).values());
  std::vector<std::vector<double>> base_out;
  for (const auto& [o, w] : c.loss) base_out.push_back(find(o).values());

  // Loss and its rounding-noise estimate (over outputs that moved from the base point).
  auto loss = [&](double* noise) {
    run_on(Device::cpu(), bufs, c.forward);
    double l = 0, nz = 0;
    for (size_t k = 0; k < c.loss.size(); ++k) {
      const Buffer& ob = find(c.loss[k].first);
      const std::vector<double> out = ob.values();
      const std::vector<double> w = find(c.loss[k].second).values();
      const double u = std::max(unit_roundoff(ob.spec.dtype), unit_roundoff(DType::kF32));
      for (size_t e = 0; e < out.size(); ++e) {
        l += w[e] * out[e];
        if (out[e] != base_out[k][e]) nz += 16 * u * std::fabs(w[e] * out[e]);
      }
    }
    *noise = std::max(*noise, nz);
    return l;
  };

  for (size_t gi = 0; gi < c.grads.size(); ++gi) {
    Buffer& xb = find(c.grads[gi].first);
    const int64_t n = int64_t(xb.offsets.size());
    const int64_t checks = std::min<int64_t>(n, c.max_elems);
    std::vector<int64_t> picked;
    std::vector<double> fd, noise_of;
    for (int64_t j = 0; j < checks; ++j) {
      const int64_t e = checks == n ? j : j * n / checks;
      uint8_t saved[8];
      std::memcpy(saved, xb.elem(e), xb.esize);
      const double x0 = detail::load_value(xb.spec.dtype, saved);
      const double h =
          std::ldexp(1.0, int(std::floor(std::log2(c.step * std::max(1.0, std::fabs(x0))))));
      double l[4], xs[4], noise = 0;
      const int ks[4] = {1, -1, 2, -2};
      for (int t = 0; t < 4; ++t) {
        detail::store_value(xb.spec.dtype, xb.elem(e), x0 + ks[t] * h);
        xs[t] = detail::load_value(xb.spec.dtype, xb.elem(e));
        l[t] = loss(&noise);
      }
      std::memcpy(xb.elem(e), saved, xb.esize);
      double d;
      if (xs[0] - x0 == h && x0 - xs[1] == h && xs[2] - x0 == 2 * h && x0 - xs[3] == 2 * h) {
        d = (8 * (l[0] - l[1]) - (l[2] - l[3])) / (12 * h);
      } else {  // the dtype could not hold x ± h exactly: plain central difference
        d = (l[0] - l[1]) / (xs[0] - xs[1]);
      }
      picked.push_back(e);
      fd.push_back(d);
      noise_of.push_back(1.5 * noise / h);
    }
    double scale = 0;
    for (double d : fd) scale = std::max(scale, std::fabs(d));
    const std::vector<double>& an = analytic[gi];
    for (size_t j = 0; j < picked.size(); ++j) {
      const double a = an[picked[j]], d = fd[j];
      const double bound = c.rtol * (std::fabs(d) + 0.1 * scale) + noise_of[j];
      if (!(std::fabs(a - d) <= bound)) {
        return ::testing::AssertionFailure()
               << c.name << ": d loss / d " << c.grads[gi].first
               << detail::coords(xb.spec.shape, picked[j]) << ": backward gives "
               << fmt::format("{:.9g}", a) << ", finite differences " << fmt::format("{:.9g}", d)
               << " (|diff| " << std::fabs(a - d) << " > bound " << bound << ")";
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// ---- performance ------------------------------------------------------------------------------

struct Perf {
  double ms = 0;           // per call
  double gb_per_s = 0;     // bytes_moved / time (0 when not given)
  double tflop_per_s = 0;  // flops / time (0 when not given)
  std::string str() const {
    std::string s = fmt::format("{:.4f} ms", ms);
    if (gb_per_s > 0) s += fmt::format(", {:.1f} GB/s", gb_per_s);
    if (tflop_per_s > 0) s += fmt::format(", {:.2f} TFLOP/s", tflop_per_s);
    return s;
  }
};

// Times fn() enqueued on ctx's stream: `warmup` untimed calls, then `iters` calls between two
// cudaEvents. bytes_moved counts every byte read and written by one call.
inline Perf time_gpu(Context& ctx, const std::function<void()>& fn, double bytes_moved,
                     double flops = 0, int warmup = 3, int iters = 20) {
  cudaStream_t s = ctx.stream();
  for (int i = 0; i < warmup; ++i) fn();
  cudaEvent_t e0, e1;
  LOWBIT_CUDA_CHECK(cudaEventCreate(&e0));
  LOWBIT_CUDA_CHECK(cudaEventCreate(&e1));
  LOWBIT_CUDA_CHECK(cudaEventRecord(e0, s));
  for (int i = 0; i < iters; ++i) fn();
  LOWBIT_CUDA_CHECK(cudaEventRecord(e1, s));
  LOWBIT_CUDA_CHECK(cudaEventSynchronize(e1));
  float total_ms = 0;
  LOWBIT_CUDA_CHECK(cudaEventElapsedTime(&total_ms, e0, e1));
  LOWBIT_CUDA_CHECK(cudaEventDestroy(e0));
  LOWBIT_CUDA_CHECK(cudaEventDestroy(e1));
  Perf p;
  p.ms = double(total_ms) / iters;
  if (bytes_moved > 0) p.gb_per_s = bytes_moved / (p.ms * 1e6);
  if (flops > 0) p.tflop_per_s = flops / (p.ms * 1e9);
  return p;
}

// Times an op case on the GPU with its args filled as usual (in-place ops keep running on their
// own results, which does not change their cost).
inline Perf time_op(Context& ctx, const OpCase& c, double bytes_moved, double flops = 0,
                    int warmup = 3, int iters = 20, uint64_t seed = 1) {
  std::vector<detail::Buffer> bufs = detail::make_buffers(c.args, seed);
  std::vector<Tensor> store;
  Args a;
  for (auto& b : bufs) {
    store.push_back(Tensor::copy_of(b.host.view(), ctx.device()));
    a.add(b.spec.name, b.view_on(store.back()));
  }
  Perf p = time_gpu(
      ctx, [&] { c.run(ctx, a); }, bytes_moved, flops, warmup, iters);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
  return p;
}

// Device-to-device copy bandwidth for a buffer of `bytes` (read + write counted), the roofline
// reference of memory-bound kernels.
inline double copy_gbps(Context& ctx, int64_t bytes, int iters = 20) {
  Tensor src = Tensor::zeros({bytes}, DType::kU8, ctx.device());
  Tensor dst = Tensor::zeros({bytes}, DType::kU8, ctx.device());
  Perf p = time_gpu(
      ctx,
      [&] {
        LOWBIT_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), size_t(bytes),
                                          cudaMemcpyDeviceToDevice, ctx.stream()));
      },
      2.0 * double(bytes), 0, 3, iters);
  return p.gb_per_s;
}

}  // namespace lowbit::test
