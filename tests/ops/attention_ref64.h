// Float64 oracle of causal grouped-query attention for the CPU and GPU tests, with per-element
// error bounds of an implementation that computes in fp32 (and optionally rounds P and dS to
// bf16 before the P·V, Pᵀ·dO, dSᵀ·Q and dS·K products, as the CUDA kernels do).
//
// Error model of one implementation against the exact result, given the same inputs
// (u = unit roundoff of its fp32 accumulation, u_b = 2^-8 of bf16, u_o of the output dtype):
//  * score s_tj = scale·q_t·k_j: |Δs| ≤ E_t = (Dh + 4)·u·scale·max_j Σ_d |q_td·k_jd|
//    + 8·u·(1 + max_j |s_tj|)  (dot product in any order, the scale and log2(e) products, exp2 /
//    exp relative error ≤ 4·u): so p_tj = exp(s_tj − m) is off by ≤ 2E_t relative (s and m).
//  * out_t = Σ_j p_j v_j / Σ_j p_j: each p relative ε moves out by ≤ 2ε·A with
//    A_d = Σ_j p_j |v_jd| / Σ_j p_j; bf16 P in the product adds u_b·A; T additions add T·u·A;
//    the stored value adds u_o·|out|.  bound = (4E + (T + 8)·u + u_b[P])·A + u_o·|out|.
//  * lse = m + log Σ p: ≤ 2E + (T + 8)·u + 2u·|lse|.
//  * backward, with p from the given lse (≤ E + 4u·(1 + |lse|) relative =: e_p), dP = dO·v and
//    D = dO·out ((Dh + 2)·u·Σ|terms| each): |ΔdS_tj| ≤ e_S = (e_p + 2u + u_b[dS])·|dS|
//    + p·(Dh + 2)·u·(Σ_d|dO_td·v_jd| + Σ_d|dO_td·out_td|);
//    dq_t: scale·Σ_j (e_S + T·u·|dS|)·|k_j| + u_o·|dq|; dk_j: scale·Σ_t (e_S + G·T·u·|dS|)·|q_t|
//    + u_o·|dk|; dv_j: Σ_t ((e_p + u_b[P]) + G·T·u)·p·|dO_t| + u_o·|dv| (G = H / Hkv heads
//    summed into one kv head).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace lowbit::test {

struct AttnDims {
  int64_t B = 1, T = 1, H = 1, Hkv = 1, Dh = 64;
  double scale = 0.125;
  int64_t group() const { return H / Hkv; }
  // Offsets of contiguous [B, T, heads, Dh] and [B, H, T] arrays.
  int64_t qi(int64_t b, int64_t t, int64_t h, int64_t d) const {
    return ((b * T + t) * H + h) * Dh + d;
  }
  int64_t ki(int64_t b, int64_t t, int64_t h, int64_t d) const {
    return ((b * T + t) * Hkv + h) * Dh + d;
  }
  int64_t li(int64_t b, int64_t h, int64_t t) const { return (b * H + h) * T + t; }
};

// How an implementation rounds (see the error model above).
struct AttnErrorModel {
  double u = 0x1p-24;    // fp32 accumulation
  double u_out = 0;      // stored outputs: 2^-8 for bf16, 2^-24 for f32
  bool bf16_p = false;   // P rounded to bf16 before the P·V / Pᵀ·dO products
  bool bf16_ds = false;  // dS rounded to bf16 before the dS·K / dSᵀ·Q products

  static AttnErrorModel cpu_twin(bool bf16_out) {
    return {0x1p-24, bf16_out ? 0x1p-8 : 0x1p-24, false, false};
  }
  // Tensor-core accumulation may truncate instead of rounding: 2^-23.
  static AttnErrorModel gpu_kernel() { return {0x1p-23, 0x1p-8, true, true}; }
  // The kernel against the CPU twin (both bf16 outputs): every bound term is linear in u and
  // u_out, so the sum of the two implementations' bounds is the bound of the summed model.
  static AttnErrorModel gpu_vs_cpu_twin() {
    return {0x1p-23 + 0x1p-24, 0x1p-8 + 0x1p-8, true, true};
  }
};

struct AttnFwd64 {
  std::vector<double> out, out_bound;  // [B, T, H, Dh]
  std::vector<double> lse, lse_bound;  // [B, H, T]
};

struct AttnBwd64 {
  std::vector<double> dq, dq_bound;  // [B, T, H, Dh]
  std::vector<double> dk, dk_bound;  // [B, T, Hkv, Dh]
  std::vector<double> dv, dv_bound;  // [B, T, Hkv, Dh]
};

namespace attn_detail {

// Scores of query t against keys 0..t (only the keys with keys[j] set when `keys` is given) and
// the score error bound E_t over them.
inline double scores(const AttnDims& s, const std::vector<double>& q, const std::vector<double>& k,
                     int64_t b, int64_t h, int64_t t, double u, std::vector<double>& sc,
                     const std::vector<char>* keys = nullptr) {
  const int64_t hk = h / s.group();
  double worst_abs_dot = 0, worst_s = 0;
  for (int64_t j = 0; j <= t; ++j) {
    if (keys != nullptr && !(*keys)[j]) continue;
    double acc = 0, acc_abs = 0;
    for (int64_t d = 0; d < s.Dh; ++d) {
      const double x = q[s.qi(b, t, h, d)] * k[s.ki(b, j, hk, d)];
      acc += x;
      acc_abs += std::fabs(x);
    }
    sc[j] = s.scale * acc;
    worst_abs_dot = std::max(worst_abs_dot, s.scale * acc_abs);
    worst_s = std::max(worst_s, std::fabs(sc[j]));
  }
  return double(s.Dh + 4) * u * worst_abs_dot + 8 * u * (1 + worst_s);
}

}  // namespace attn_detail

// q [B, T, H, Dh], k and v [B, T, Hkv, Dh], contiguous, as double.
// `rows` (optional, [T]): compute only the positions t with rows[t] != 0 (others stay 0).
inline AttnFwd64 attention_fwd_f64(const AttnDims& s, const std::vector<double>& q,
                                   const std::vector<double>& k, const std::vector<double>& v,
                                   const AttnErrorModel& em,
                                   const std::vector<char>* rows = nullptr) {
  AttnFwd64 r;
  const int64_t n_out = s.B * s.T * s.H * s.Dh, n_lse = s.B * s.H * s.T;
  r.out.assign(n_out, 0.0);
  r.out_bound.assign(n_out, 0.0);
  r.lse.assign(n_lse, 0.0);
  r.lse_bound.assign(n_lse, 0.0);
  std::vector<double> sc(s.T), a(s.Dh);
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.H; ++h) {
      const int64_t hk = h / s.group();
      for (int64_t t = 0; t < s.T; ++t) {
        if (rows != nullptr && !(*rows)[t]) continue;
        const double E = attn_detail::scores(s, q, k, b, h, t, em.u, sc);
        double m = -INFINITY;
        for (int64_t j = 0; j <= t; ++j) m = std::max(m, sc[j]);
        double l = 0;
        for (int64_t j = 0; j <= t; ++j) l += std::exp(sc[j] - m);
        std::fill(a.begin(), a.end(), 0.0);
        for (int64_t j = 0; j <= t; ++j) {
          const double p = std::exp(sc[j] - m) / l;
          for (int64_t d = 0; d < s.Dh; ++d) {
            const double vv = v[s.ki(b, j, hk, d)];
            r.out[s.qi(b, t, h, d)] += p * vv;
            a[d] += p * std::fabs(vv);
          }
        }
        const double rel = 4 * E + double(t + 9) * em.u + (em.bf16_p ? 0x1p-8 : 0.0);
        for (int64_t d = 0; d < s.Dh; ++d) {
          const int64_t o = s.qi(b, t, h, d);
          r.out_bound[o] = rel * a[d] + em.u_out * std::fabs(r.out[o]);
        }
        const int64_t li = s.li(b, h, t);
        r.lse[li] = m + std::log(l);
        r.lse_bound[li] = 2 * E + double(t + 9) * em.u + 2 * 0x1p-24 * std::fabs(r.lse[li]);
      }
    }
  }
  return r;
}

// Gradients from dout [B, T, H, Dh] and the forward's out [B, T, H, Dh] and lse [B, H, T] (the
// values the implementation under test was given). `rows` (optional, [T]): only the pairs
// (query t, key j) with rows[t] or rows[j] set, which completes dq at the marked queries and
// dk, dv at the marked keys.
inline AttnBwd64 attention_bwd_f64(const AttnDims& s, const std::vector<double>& q,
                                   const std::vector<double>& k, const std::vector<double>& v,
                                   const std::vector<double>& out, const std::vector<double>& lse,
                                   const std::vector<double>& dout, const AttnErrorModel& em,
                                   const std::vector<char>* rows = nullptr) {
  AttnBwd64 r;
  const int64_t nq = s.B * s.T * s.H * s.Dh, nk = s.B * s.T * s.Hkv * s.Dh;
  r.dq.assign(nq, 0.0);
  r.dq_bound.assign(nq, 0.0);
  r.dk.assign(nk, 0.0);
  r.dk_bound.assign(nk, 0.0);
  r.dv.assign(nk, 0.0);
  r.dv_bound.assign(nk, 0.0);
  const double ub = 0x1p-8, G = double(s.group());
  std::vector<double> sc(s.T);
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.H; ++h) {
      const int64_t hk = h / s.group();
      for (int64_t t = 0; t < s.T; ++t) {
        // With sampled rows, an unmarked query needs only the marked keys (P comes from the given
        // lse, so a pair's error depends on its own score only).
        const bool all_keys = rows == nullptr || (*rows)[t];
        const double E = attn_detail::scores(s, q, k, b, h, t, em.u, sc, all_keys ? nullptr : rows);
        const double lse_t = lse[s.li(b, h, t)];
        const double ep = E + 4 * em.u * (1 + std::fabs(lse_t));
        double D = 0, D_abs = 0;
        for (int64_t d = 0; d < s.Dh; ++d) {
          const double x = dout[s.qi(b, t, h, d)] * out[s.qi(b, t, h, d)];
          D += x;
          D_abs += std::fabs(x);
        }
        for (int64_t j = 0; j <= t; ++j) {
          if (!all_keys && !(*rows)[j]) continue;
          const double p = std::exp(sc[j] - lse_t);
          double dp = 0, dp_abs = 0;
          for (int64_t d = 0; d < s.Dh; ++d) {
            const double x = dout[s.qi(b, t, h, d)] * v[s.ki(b, j, hk, d)];
            dp += x;
            dp_abs += std::fabs(x);
          }
          const double ds = p * (dp - D);
          const double eS = (ep + 2 * em.u + (em.bf16_ds ? ub : 0.0)) * std::fabs(ds) +
                            p * double(s.Dh + 2) * em.u * (dp_abs + D_abs);
          const double eq = eS + double(s.T) * em.u * std::fabs(ds);
          const double ek = eS + G * double(s.T) * em.u * std::fabs(ds);
          const double ev = (ep + (em.bf16_p ? ub : 0.0) + G * double(s.T) * em.u) * p;
          for (int64_t d = 0; d < s.Dh; ++d) {
            const int64_t iq = s.qi(b, t, h, d), ik = s.ki(b, j, hk, d);
            const double kd = k[ik], qd = q[iq], dod = dout[iq];
            r.dq[iq] += s.scale * ds * kd;
            r.dq_bound[iq] += s.scale * eq * std::fabs(kd);
            r.dk[ik] += s.scale * ds * qd;
            r.dk_bound[ik] += s.scale * ek * std::fabs(qd);
            r.dv[ik] += p * dod;
            r.dv_bound[ik] += ev * std::fabs(dod);
          }
        }
      }
    }
  }
  for (int64_t i = 0; i < nq; ++i) r.dq_bound[i] += em.u_out * std::fabs(r.dq[i]);
  for (int64_t i = 0; i < nk; ++i) {
    r.dk_bound[i] += em.u_out * std::fabs(r.dk[i]);
    r.dv_bound[i] += em.u_out * std::fabs(r.dv[i]);
  }
  return r;
}

}  // namespace lowbit::test
