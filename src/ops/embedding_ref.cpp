// CPU twin of the token embedding: a row gather and its deterministic scatter-add.
#include <algorithm>
#include <vector>

#include "ops/embedding_impl.h"
#include "ops/ops_check.h"

namespace lowbit::ops_detail {

namespace {

void check_tokens(const char* op, const TensorView& tokens, int64_t vocab) {
  const int32_t* tok = tokens.ptr<const int32_t>();  // [N]
  for (int64_t n = 0; n < tokens.numel(); ++n) {
    LOWBIT_USER_CHECK(tok[n] >= 0 && tok[n] < vocab,
                      "{}: tokens[{}] = {} is outside the vocabulary [0, {}) of the table", op, n,
                      tok[n], vocab);
  }
}

// Stable counting sort of positions by key (the token, or V for one outside [0, V)):
// order[start[v] .. start[v+1]) lists, in increasing position, the rows whose key is v.
struct SortedPositions {
  std::vector<int64_t> start, order;
};
SortedPositions sort_positions(const TensorView& tokens, int64_t vocab) {
  const int64_t n_rows = tokens.numel();
  const int32_t* tok = tokens.ptr<const int32_t>();  // [N]
  auto key = [&](int64_t n) { return tok[n] >= 0 && tok[n] < vocab ? int64_t(tok[n]) : vocab; };
  SortedPositions p;
  p.start.assign(vocab + 2, 0);
  p.order.resize(n_rows);
  for (int64_t n = 0; n < n_rows; ++n) ++p.start[key(n) + 1];
  for (int64_t v = 0; v <= vocab; ++v) p.start[v + 1] += p.start[v];
  std::vector<int64_t> fill(p.start.begin(), p.start.end() - 1);
  for (int64_t n = 0; n < n_rows; ++n) p.order[fill[key(n)]++] = n;
  return p;
}

}  // namespace

void embedding_sort_plan_cpu(const TensorView& plan, const TensorView& tokens, int64_t vocab) {
  const int64_t n_rows = tokens.numel();
  const SortedPositions p = sort_positions(tokens, vocab);
  int32_t* keys = plan.ptr<int32_t>();  // [N]
  int32_t* vals = keys + n_rows;        // [N]
  for (int64_t v = 0; v <= vocab; ++v) {
    for (int64_t k = p.start[v]; k < p.start[v + 1]; ++k) {
      keys[k] = int32_t(v);
      vals[k] = int32_t(p.order[k]);
    }
  }
}

void embedding_fwd_cpu(const TensorView& out, const TensorView& tokens, const TensorView& table) {
  const int64_t n_rows = out.size(0), d = out.size(1);
  check_tokens("embedding_fwd", tokens, table.size(0));
  const int32_t* tok = tokens.ptr<const int32_t>();  // [N]
  std::vector<float> row(d);                         // [D]
  for (int64_t n = 0; n < n_rows; ++n) {
    load_row(table, int64_t(tok[n]) * d, d, row.data());
    store_row(out, n * d, d, row.data());
  }
}

void embedding_bwd_cpu(const TensorView& dtable, const TensorView& tokens, const TensorView& dout,
                       const TensorView& sort_plan) {
  const int64_t n_rows = dout.size(0), d = dout.size(1), vocab = dtable.size(0);
  check_tokens("embedding_bwd", tokens, vocab);
  // Positions sorted stably by token: order[start[v] .. start[v+1]) lists, in increasing
  // position, the rows whose token is v.
  const SortedPositions sorted = sort_positions(tokens, vocab);
  const std::vector<int64_t>& start = sorted.start;
  const std::vector<int64_t>& order = sorted.order;
  if (sort_plan.data != nullptr) {
    const int32_t* keys = sort_plan.ptr<const int32_t>();  // [N]
    const int32_t* vals = keys + n_rows;                   // [N]
    for (int64_t v = 0; v < vocab; ++v) {
      for (int64_t k = start[v]; k < start[v + 1]; ++k) {
        LOWBIT_USER_CHECK(keys[k] == v && vals[k] == order[k],
                          "embedding_bwd: sort_plan entry {} is (token {}, position {}) where "
                          "these tokens give ({}, {}); pass the plan embedding_fwd filled from "
                          "the same tokens",
                          k, keys[k], vals[k], v, order[k]);
      }
    }
  }

  std::vector<float> piece(d), total(d), row(d);  // [D] each
  float* dt = dtable.ptr<float>();                // [V, D]
  for (int64_t v = 0; v < vocab; ++v) {
    if (start[v] == start[v + 1]) continue;
    // Sorted positions k in [start[v], start[v+1]), cut at multiples of the chunk size.
    bool first = true;
    for (int64_t k = start[v]; k < start[v + 1]; first = false) {
      const int64_t piece_end =
          std::min(start[v + 1], (k / kEmbeddingBwdChunk + 1) * kEmbeddingBwdChunk);
      std::fill(piece.begin(), piece.end(), 0.0f);
      for (; k < piece_end; ++k) {
        load_row(dout, order[k] * d, d, row.data());
        for (int64_t i = 0; i < d; ++i) piece[i] += row[i];
      }
      for (int64_t i = 0; i < d; ++i) total[i] = first ? piece[i] : total[i] + piece[i];
    }
    for (int64_t i = 0; i < d; ++i) dt[v * d + i] += total[i];
  }
}

}  // namespace lowbit::ops_detail
