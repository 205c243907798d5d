#include "lowbit/core/allocator.h"

#include <cuda_runtime.h>

#include <cstdlib>
#include <mutex>
#include <vector>

#include "lowbit/core/error.h"

namespace lowbit {

namespace {

constexpr size_t kAlignBytes = 256;  // cuBLASLt and 16-byte vector loads are happy with this

struct Ledger {
  std::mutex mu;
  MemStats cpu;
  std::vector<MemStats> cuda;  // by ordinal

  MemStats& of(Device dev) {
    if (dev.is_cpu()) return cpu;
    if (static_cast<size_t>(dev.index) >= cuda.size()) cuda.resize(dev.index + 1);
    return cuda[dev.index];
  }
};

Ledger& ledger() {
  static Ledger l;
  return l;
}

void account(Device dev, MemCategory cat, int64_t delta) {
  Ledger& l = ledger();
  std::lock_guard<std::mutex> lock(l.mu);
  MemStats& s = l.of(dev);
  for (MemCounters* c : {&s.by_category[static_cast<int>(cat)], &s.total}) {
    c->current_bytes += delta;
    if (c->current_bytes > c->peak_bytes) c->peak_bytes = c->current_bytes;
  }
}

std::string in_use(Device dev) {
  const MemStats s = mem_stats(dev);
  std::string out;
  for (int i = 0; i < kNumMemCategories; ++i) {
    out += fmt::format("{}{} {:.1f} MiB", i ? ", " : "",
                       mem_category_name(static_cast<MemCategory>(i)),
                       s.by_category[i].current_bytes / 1048576.0);
  }
  return out;
}

}  // namespace

std::string_view mem_category_name(MemCategory c) {
  switch (c) {
    case MemCategory::kWeights: return "weights";
    case MemCategory::kGradients: return "gradients";
    case MemCategory::kOptimizer: return "optimizer";
    case MemCategory::kActivations: return "activations";
    case MemCategory::kWorkspace: return "workspace";
    case MemCategory::kOther: return "other";
  }
  return "?";
}

void* mem_alloc(Device dev, size_t bytes, MemCategory cat) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  if (dev.is_cpu()) {
    const size_t rounded = (bytes + kAlignBytes - 1) / kAlignBytes * kAlignBytes;
    p = std::aligned_alloc(kAlignBytes, rounded);
    if (p == nullptr) {
      throw UserError(fmt::format(
          "out of host memory allocating {:.1f} MiB for {} (in use: {}); use a smaller model, "
          "batch or sequence length",
          bytes / 1048576.0, mem_category_name(cat), in_use(dev)));
    }
  } else {
    int prev = 0;
    cudaGetDevice(&prev);
    if (prev != dev.index) cudaSetDevice(dev.index);
    const cudaError_t err = cudaMalloc(&p, bytes);
    if (prev != dev.index) cudaSetDevice(prev);
    if (err != cudaSuccess) {
      cudaGetLastError();
      throw UserError(fmt::format(
          "out of GPU memory on {} allocating {:.1f} MiB for {} ({}; in use: {}); use a smaller "
          "model, batch or sequence length, or activation checkpointing",
          dev.str(), bytes / 1048576.0, mem_category_name(cat), cudaGetErrorString(err),
          in_use(dev)));
    }
  }
  account(dev, cat, static_cast<int64_t>(bytes));
  return p;
}

void mem_free(Device dev, void* p, size_t bytes, MemCategory cat) {
  if (p == nullptr) return;
  if (dev.is_cpu()) {
    std::free(p);
  } else {
    cudaFree(p);  // errors at teardown (driver shutting down) are not actionable
  }
  account(dev, cat, -static_cast<int64_t>(bytes));
}

MemStats mem_stats(Device dev) {
  Ledger& l = ledger();
  std::lock_guard<std::mutex> lock(l.mu);
  return l.of(dev);
}

void mem_reset_peaks(Device dev) {
  Ledger& l = ledger();
  std::lock_guard<std::mutex> lock(l.mu);
  MemStats& s = l.of(dev);
  for (auto& c : s.by_category) c.peak_bytes = c.current_bytes;
  s.total.peak_bytes = s.total.current_bytes;
}

}  // namespace lowbit
