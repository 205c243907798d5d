// CPU twin of attention against a KV cache: the definition of the op. For the query at position
// t = t0 + i it performs, in the same order, the operations attention_fwd_ref performs for its
// query t (attention_ref.cpp):
//   s_j   = scale · Σ_d q_d k_jd            for keys j ≤ t
//   m     = max_j s_j,  l = Σ_j exp(s_j − m)
//   out_d = Σ_j (exp(s_j − m) / l) · v_jd
// so a prefill followed by one-token steps gives, on the CPU, bit for bit the attention output
// of the full-window forward.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "ops/attention_cache_impl.h"
#include "ops/ops_check.h"
#include "ops/parallel_for.h"

namespace lowbit::attn {

namespace {

using ops_detail::load_row;
using ops_detail::store_row;

// Element offset of row (b, t, h) of a [B, T, heads, Dh] view.
int64_t row_off(const TensorView& t, int64_t b, int64_t i, int64_t h) {
  return b * t.strides[0] + i * t.strides[1] + h * t.strides[2];
}

}  // namespace

void kv_cache_write_ref(const TensorView& cache, const TensorView& src, int64_t t0) {
  const int64_t B = src.size(0), Tq = src.size(1), Hkv = src.size(2), Dh = src.size(3);
  std::vector<float> row(static_cast<size_t>(Dh));  // [Dh]; bf16 → f32 → bf16 is exact
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < Tq; ++i) {
      for (int64_t h = 0; h < Hkv; ++h) {
        load_row(src, row_off(src, b, i, h), Dh, row.data());
        store_row(cache, row_off(cache, b, t0 + i, h), Dh, row.data());
      }
    }
  }
}

void attention_cache_fwd_ref(const TensorView& out, const TensorView& q, const TensorView& k_cache,
                             const TensorView& v_cache, int64_t t0, float scale) {
  const int64_t B = q.size(0), Tq = q.size(1), H = q.size(2), Dh = q.size(3);
  const int64_t group = H / k_cache.size(2);
  const int64_t Tk = t0 + Tq;  // keys the last query sees
  parallel_for(B * H, [&](int64_t bh) {
    const int64_t b = bh / H, h = bh % H, hk = h / group;
    std::vector<float> kh(static_cast<size_t>(Tk * Dh));  // [Tk, Dh]
    std::vector<float> vh(static_cast<size_t>(Tk * Dh));  // [Tk, Dh]
    for (int64_t j = 0; j < Tk; ++j) {
      load_row(k_cache, row_off(k_cache, b, j, hk), Dh, &kh[j * Dh]);
      load_row(v_cache, row_off(v_cache, b, j, hk), Dh, &vh[j * Dh]);
    }
    std::vector<float> qt(static_cast<size_t>(Dh));  // [Dh]
    std::vector<float> o(static_cast<size_t>(Dh));   // [Dh]
    std::vector<float> s(static_cast<size_t>(Tk));   // scores of one query, [Tk]
    for (int64_t i = 0; i < Tq; ++i) {
      const int64_t t = t0 + i;
      load_row(q, row_off(q, b, i, h), Dh, qt.data());
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j <= t; ++j) {
        float dot = 0.0f;
        for (int64_t d = 0; d < Dh; ++d) dot += qt[d] * kh[j * Dh + d];
        s[j] = scale * dot;
        m = std::max(m, s[j]);
      }
      float l = 0.0f;
      for (int64_t j = 0; j <= t; ++j) {
        s[j] = std::exp(s[j] - m);
        l += s[j];
      }
      std::fill(o.begin(), o.end(), 0.0f);
      for (int64_t j = 0; j <= t; ++j) {
        const float p = s[j] / l;
        for (int64_t d = 0; d < Dh; ++d) o[d] += p * vh[j * Dh + d];
      }
      store_row(out, row_off(out, b, i, h), Dh, o.data());
    }
  });
}

}  // namespace lowbit::attn
