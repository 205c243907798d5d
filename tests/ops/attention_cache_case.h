// Cases of attention against a KV cache (attention_cache_fwd, kv_cache_write) shared by the CPU
// tests (tests/ops/test_attention_cache.cpp) and the GPU tests
// (tests/gpu/test_ops_attention_cache.cpp): inputs, the op-harness cases, and the float64 oracle.
//
// The oracle is causal attention over T = t0 + Tq positions (tests/ops/attention_ref64.h) whose
// keys and values are the cache rows [0, T) and whose queries at positions t0 .. T − 1 are q;
// only those rows are computed and compared, with its per-element error bounds. Cache rows past
// T hold NaN: an op that reads them fails every comparison.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "lowbit/ops.h"
#include "ops/attention_ref64.h"
#include "ops/op_harness.h"

namespace lowbit::test {

struct CacheCase {
  int64_t B, t0, Tq, Tmax, H, Hkv, Dh;
  DType dtype = DType::kBF16;
  bool fused = false;  // q a strided view into a fused [B, Tq, (H + 2·Hkv)·Dh] row
  double q_sd = 1.0;   // 3: peaked softmax (the running max moves often)
  std::string str() const {
    return fmt::format("B{} t0 {} Tq {} Tmax {} H{} Hkv{} Dh{} {}{}{}", B, t0, Tq, Tmax, H, Hkv, Dh,
                       dtype_name(dtype), fused ? " fused" : "", q_sd != 1.0 ? " peaked" : "");
  }
  Shape q_shape() const { return {B, Tq, H, Dh}; }
  Shape cache_shape() const { return {B, Tmax, Hkv, Dh}; }
};

struct CacheData {
  AttnDims dims;               // the full causal problem: T = t0 + Tq
  std::vector<double> q;       // [B, Tq, H, Dh]
  std::vector<double> kc, vc;  // [B, Tmax, Hkv, Dh], NaN at positions ≥ T
};

inline CacheData make_cache_data(const CacheCase& c, uint64_t seed) {
  CacheData d;
  d.dims = {c.B, c.t0 + c.Tq, c.H, c.Hkv, c.Dh, 1.0 / std::sqrt(double(c.Dh))};
  auto gauss = [&](int64_t n, uint64_t s, double sd) {
    std::vector<double> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[i] = round_to(c.dtype, sd * detail::philox_gauss(s, 5, i));
    return v;
  };
  d.q = gauss(c.B * c.Tq * c.H * c.Dh, seed, c.q_sd);
  d.kc = gauss(c.B * c.Tmax * c.Hkv * c.Dh, seed + 1, 1.0);
  d.vc = gauss(c.B * c.Tmax * c.Hkv * c.Dh, seed + 2, 1.0);
  const int64_t T = c.t0 + c.Tq;
  for (int64_t i = 0; i < int64_t(d.kc.size()); ++i) {
    const int64_t t = (i / (c.Hkv * c.Dh)) % c.Tmax;
    if (t >= T) d.kc[i] = d.vc[i] = std::numeric_limits<double>::quiet_NaN();
  }
  return d;
}

inline Fill fill_from(const std::vector<double>& v, const char* name) {
  return Fill::custom(name, [&v](int64_t i) { return v[i]; });
}

// q, k_cache, v_cache in; out [B, Tq, H, Dh]. `fn` runs the op (default: attention_cache_fwd).
inline OpCase cache_op_case(const CacheCase& c, const CacheData& d, OpFn fn = {}) {
  OpCase oc;
  oc.name = "attention_cache_fwd " + c.str();
  ArgSpec q = in("q", c.dtype, c.q_shape(), fill_from(d.q, "q"));
  if (c.fused) {
    const int64_t W = (c.H + 2 * c.Hkv) * c.Dh;
    q = strided(std::move(q), {c.Tq * W, W, c.Dh, 1});
  }
  oc.args = {q, in("k_cache", c.dtype, c.cache_shape(), fill_from(d.kc, "k_cache")),
             in("v_cache", c.dtype, c.cache_shape(), fill_from(d.vc, "v_cache")),
             out("out", c.dtype, c.q_shape())};
  const float scale = static_cast<float>(d.dims.scale);
  const int64_t t0 = c.t0;
  oc.run = fn ? fn : OpFn([scale, t0](Context& ctx, const Args& a) {
    attention_cache_fwd(ctx, a["out"], a["q"], a["k_cache"], a["v_cache"], t0, scale);
  });
  return oc;
}

// The oracle's out and its bound for the Tq queries, [B, Tq, H, Dh].
struct CacheRef {
  std::vector<double> out, bound;
};

inline CacheRef cache_oracle(const CacheCase& c, const CacheData& d, const AttnErrorModel& em) {
  const AttnDims& s = d.dims;
  const int64_t T = s.T;
  std::vector<double> qf(static_cast<size_t>(s.B * T * s.H * s.Dh), 0.0);  // [B, T, H, Dh]
  std::vector<double> kf(static_cast<size_t>(s.B * T * s.Hkv * s.Dh));     // [B, T, Hkv, Dh]
  std::vector<double> vf(kf.size());
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t i = 0; i < c.Tq; ++i) {
      for (int64_t hd = 0; hd < s.H * s.Dh; ++hd) {
        qf[(b * T + c.t0 + i) * s.H * s.Dh + hd] = d.q[(b * c.Tq + i) * s.H * s.Dh + hd];
      }
    }
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t hd = 0; hd < s.Hkv * s.Dh; ++hd) {
        kf[(b * T + t) * s.Hkv * s.Dh + hd] = d.kc[(b * c.Tmax + t) * s.Hkv * s.Dh + hd];
        vf[(b * T + t) * s.Hkv * s.Dh + hd] = d.vc[(b * c.Tmax + t) * s.Hkv * s.Dh + hd];
      }
    }
  }
  std::vector<char> rows(static_cast<size_t>(T), 0);
  for (int64_t t = c.t0; t < T; ++t) rows[t] = 1;
  const AttnFwd64 full = attention_fwd_f64(s, qf, kf, vf, em, &rows);
  CacheRef r;
  r.out.resize(d.q.size());
  r.bound.resize(d.q.size());
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t i = 0; i < c.Tq; ++i) {
      for (int64_t hd = 0; hd < s.H * s.Dh; ++hd) {
        const int64_t src = (b * T + c.t0 + i) * s.H * s.Dh + hd;
        const int64_t dst = (b * c.Tq + i) * s.H * s.Dh + hd;
        r.out[dst] = full.out[src];
        r.bound[dst] = full.out_bound[src];
      }
    }
  }
  return r;
}

// |got − want| ≤ bound element by element (NaN/inf anywhere fails), with the first mismatch's
// coordinates and the largest |diff| / bound.
inline ::testing::AssertionResult within_bounds(const std::string& what, const Shape& shape,
                                                const std::vector<double>& got,
                                                const std::vector<double>& want,
                                                const std::vector<double>& bound) {
  int64_t bad = 0;
  std::string first;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double diff = std::fabs(got[i] - want[i]);
    if (std::isfinite(diff) && bound[i] > 0) worst = std::max(worst, diff / bound[i]);
    if (std::isfinite(got[i]) && std::isfinite(want[i]) && diff <= bound[i]) continue;
    if (bad++ == 0) {
      first = fmt::format("{}{}: got {:.9g}, want {:.9g}, |diff| {:.3g} > bound {:.3g}", what,
                          detail::coords(shape, int64_t(i)), got[i], want[i], diff, bound[i]);
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess() << "max |diff| / bound " << worst;
  return ::testing::AssertionFailure()
         << first << " (" << bad << " of " << got.size() << " elements outside their bounds)";
}

}  // namespace lowbit::test
