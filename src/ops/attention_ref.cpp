// CPU twin of causal grouped-query attention: the definition of the op. Plain fp32 loops that
// compute the full row of scores of each query (no tiling, no online softmax); the CUDA kernels
// (attention.cu) are compared against it.
//
//   s_tj  = scale · Σ_d q_td k_jd          for keys j ≤ t (causal)
//   lse_t = m_t + log Σ_j exp(s_tj − m_t),  m_t = max_j s_tj
//   out_t = Σ_j p_tj v_j,                  p_tj = exp(s_tj − lse_t)
// Backward (the forward's lse is reused, so P is recomputed exactly as the forward saw it):
//   D_t    = Σ_d dout_td · out_td
//   ds_tj  = p_tj · (dout_t · v_j − D_t)
//   dq_t   = scale · Σ_j ds_tj k_j,   dk_j = scale · Σ_t ds_tj q_t,   dv_j = Σ_t p_tj dout_t
// with dk and dv of a kv head summed over the H / Hkv query heads that read it.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "lowbit/formats.h"
#include "ops/attention_impl.h"
#include "ops/parallel_for.h"

namespace lowbit::attn {

namespace {

float load_elem(const TensorView& t, int64_t off) {
  if (t.dtype == DType::kBF16) return bf16_to_f32(t.ptr<const uint16_t>()[off]);
  return t.ptr<const float>()[off];
}

void store_elem(const TensorView& t, int64_t off, float v) {
  if (t.dtype == DType::kBF16) {
    t.ptr<uint16_t>()[off] = f32_to_bf16_rn(v);
  } else {
    t.ptr<float>()[off] = v;
  }
}

// dst [T, Dh] f32 = head `h` of batch `b` of a [B, T, heads, Dh] view.
void gather_head(const TensorView& t, int64_t b, int64_t h, std::vector<float>& dst) {
  const int64_t T = t.size(1), Dh = t.size(3);
  dst.resize(static_cast<size_t>(T * Dh));
  for (int64_t i = 0; i < T; ++i) {
    const int64_t base = b * t.strides[0] + i * t.strides[1] + h * t.strides[2];
    for (int64_t d = 0; d < Dh; ++d) dst[i * Dh + d] = load_elem(t, base + d);
  }
}

// Head `h` of batch `b` of a [B, T, heads, Dh] view = src [T, Dh] f32 (rounded to the view's
// dtype).
void scatter_head(const TensorView& t, int64_t b, int64_t h, const std::vector<float>& src) {
  const int64_t T = t.size(1), Dh = t.size(3);
  for (int64_t i = 0; i < T; ++i) {
    const int64_t base = b * t.strides[0] + i * t.strides[1] + h * t.strides[2];
    for (int64_t d = 0; d < Dh; ++d) store_elem(t, base + d, src[i * Dh + d]);
  }
}

float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

}  // namespace

void attention_fwd_ref(const TensorView& out, const TensorView& lse, const TensorView& q,
                       const TensorView& k, const TensorView& v, float scale) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), Dh = q.size(3);
  const int64_t group = H / k.size(2);
  float* lse_p = lse.ptr<float>();  // [B, H, T]
  parallel_for(B * H, [&](int64_t bh) {
    const int64_t b = bh / H, h = bh % H;
    std::vector<float> qh, kh, vh;  // [T, Dh] each
    gather_head(q, b, h, qh);
    gather_head(k, b, h / group, kh);
    gather_head(v, b, h / group, vh);
    std::vector<float> oh(static_cast<size_t>(T * Dh));  // [T, Dh]
    std::vector<float> s(static_cast<size_t>(T));        // scores of one query, [T]
    for (int64_t t = 0; t < T; ++t) {
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j <= t; ++j) {
        s[j] = scale * dot(&qh[t * Dh], &kh[j * Dh], Dh);
        m = std::max(m, s[j]);
      }
      float l = 0.0f;
      for (int64_t j = 0; j <= t; ++j) {
        s[j] = std::exp(s[j] - m);
        l += s[j];
      }
      float* o = &oh[t * Dh];
      std::fill(o, o + Dh, 0.0f);
      for (int64_t j = 0; j <= t; ++j) {
        const float p = s[j] / l;
        for (int64_t d = 0; d < Dh; ++d) o[d] += p * vh[j * Dh + d];
      }
      lse_p[(b * H + h) * T + t] = m + std::log(l);
    }
    scatter_head(out, b, h, oh);
  });
}

void attention_bwd_ref(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                       const TensorView& dout, const TensorView& q, const TensorView& k,
                       const TensorView& v, const TensorView& out, const TensorView& lse,
                       float scale) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), Dh = q.size(3);
  const int64_t Hkv = k.size(2), group = H / Hkv;
  const float* lse_p = lse.ptr<const float>();  // [B, H, T]
  // One task per kv head: it owns that head's dk, dv and the dq of its query heads.
  parallel_for(B * Hkv, [&](int64_t bg) {
    const int64_t b = bg / Hkv, hkv = bg % Hkv;
    std::vector<float> kh, vh, qh, doh, oh;  // [T, Dh] each
    gather_head(k, b, hkv, kh);
    gather_head(v, b, hkv, vh);
    std::vector<float> dkh(static_cast<size_t>(T * Dh), 0.0f);  // [T, Dh]
    std::vector<float> dvh(static_cast<size_t>(T * Dh), 0.0f);  // [T, Dh]
    std::vector<float> dqh(static_cast<size_t>(T * Dh));        // [T, Dh]
    for (int64_t h = hkv * group; h < (hkv + 1) * group; ++h) {
      gather_head(q, b, h, qh);
      gather_head(dout, b, h, doh);
      gather_head(out, b, h, oh);
      for (int64_t t = 0; t < T; ++t) {
        const float* qt = &qh[t * Dh];
        const float* dot_ = &doh[t * Dh];
        const float lse_t = lse_p[(b * H + h) * T + t];
        const float D = dot(dot_, &oh[t * Dh], Dh);
        float* dqt = &dqh[t * Dh];
        std::fill(dqt, dqt + Dh, 0.0f);
        for (int64_t j = 0; j <= t; ++j) {
          const float p = std::exp(scale * dot(qt, &kh[j * Dh], Dh) - lse_t);
          const float ds = p * (dot(dot_, &vh[j * Dh], Dh) - D);
          for (int64_t d = 0; d < Dh; ++d) {
            dqt[d] += ds * kh[j * Dh + d];
            dkh[j * Dh + d] += ds * qt[d];
            dvh[j * Dh + d] += p * dot_[d];
          }
        }
        for (int64_t d = 0; d < Dh; ++d) dqt[d] *= scale;
      }
      scatter_head(dq, b, h, dqh);
    }
    for (float& x : dkh) x *= scale;
    scatter_head(dk, b, hkv, dkh);
    scatter_head(dv, b, hkv, dvh);
  });
}

}  // namespace lowbit::attn
