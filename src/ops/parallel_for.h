// CPU twins: fn(i) for every i in [0, n), spread over the machine's threads. Tasks must write
// disjoint outputs, so the result does not depend on the thread count.
#pragma once
#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace lowbit {

template <typename Fn>
void parallel_for(int64_t n, Fn fn) {
  const int64_t workers =
      std::min<int64_t>(n, std::max<int64_t>(1, std::thread::hardware_concurrency()));
  if (workers <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(workers));
  for (int64_t w = 0; w < workers; ++w) {
    pool.emplace_back([&fn, w, workers, n] {
      for (int64_t i = w; i < n; i += workers) fn(i);
    });
  }
  for (auto& th : pool) th.join();
}

}  // namespace lowbit
