#include "lowbit/core/allocator.h"

#include <cuda_runtime.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include "core/env_switch.h"
#include "lowbit/core/cuda_check.h"
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

// Device blocks freed by the program are kept, keyed by their rounded size, and handed out
// again: a training step allocates the same sizes every step, and cudaMalloc/cudaFree would
// synchronise the device on each. Reuse is safe because all work runs in stream order: one
// blocking stream per context, ordered with the legacy stream (a block freed on the host may still
// be read by queued kernels, and any later kernel using it again is queued after them). The
// allocator's counters track the bytes the program holds; cached blocks are not counted.
struct DeviceCache {
  std::mutex mu;
  std::map<std::pair<int, size_t>, std::vector<void*>> free_blocks;  // (device, size) → blocks
  size_t cached_bytes = 0;
};

DeviceCache& device_cache() {
  static DeviceCache* c = new DeviceCache();  // never destroyed: frees race driver teardown
  return *c;
}

size_t cache_round(size_t bytes) {
  const size_t q = bytes < (size_t(1) << 20) ? 512 : (size_t(2) << 20);
  return (bytes + q - 1) / q * q;
}

// Returns every cached block of `dev` to the driver (before retrying a failed cudaMalloc).
void release_cached(Device dev) {
  DeviceCache& c = device_cache();
  std::lock_guard<std::mutex> lock(c.mu);
  cudaDeviceSynchronize();
  for (auto it = c.free_blocks.begin(); it != c.free_blocks.end();) {
    if (it->first.first != dev.index) {
      ++it;
      continue;
    }
    for (void* p : it->second) {
      cudaFree(p);
      c.cached_bytes -= it->first.second;
    }
    it = c.free_blocks.erase(it);
  }
}

void* cuda_take(Device dev, size_t rounded) {
  DeviceCache& c = device_cache();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.free_blocks.find({dev.index, rounded});
  if (it == c.free_blocks.end() || it->second.empty()) return nullptr;
  void* p = it->second.back();
  it->second.pop_back();
  c.cached_bytes -= rounded;
  return p;
}

// LOWBIT_POISON_ALLOC=1 (for tests): every GPU allocation starts as kPoisonByte bytes, fresh or
// from the cache, so that output a kernel leaves unwritten shows up as a difference instead of
// reading as the zeros of a new cudaMalloc. 0xA5 is no value a quantizer writes by rule: as a
// UE4M3 scale it has the sign bit set, as an f32 (0xA5A5A5A5) it is negative, and as an E8M0
// scale (2^38) it needs an amax near 2^46 (0xFF, the E8M0 NaN, is what an inf block gets).
// Each allocation costs a synchronous memset on the legacy stream, which also serialises the
// kernels around it: the GPU tests also run once without it (gpu_tests_plain).
constexpr int kPoisonByte = 0xA5;
bool poison_allocations() {
  static const bool on = [] {
    return parse_env_switch("LOWBIT_POISON_ALLOC", std::getenv("LOWBIT_POISON_ALLOC")) == 1;
  }();
  return on;
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
    const bool poison = poison_allocations();  // before taking a block: a bad value throws
    const size_t rounded = cache_round(bytes);
    p = cuda_take(dev, rounded);
    cudaError_t err = cudaSuccess;
    if (p == nullptr) {
      int prev = 0;
      cudaGetDevice(&prev);
      if (prev != dev.index) cudaSetDevice(dev.index);
      err = cudaMalloc(&p, rounded);
      if (err != cudaSuccess) {  // give the cache back to the driver and try once more
        cudaGetLastError();
        release_cached(dev);
        err = cudaMalloc(&p, rounded);
      }
      if (prev != dev.index) cudaSetDevice(prev);
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      throw UserError(fmt::format(
          "out of GPU memory on {} allocating {:.1f} MiB for {} ({}; in use: {}); use a smaller "
          "model, batch or sequence length, or activation checkpointing",
          dev.str(), bytes / 1048576.0, mem_category_name(cat), cudaGetErrorString(err),
          in_use(dev)));
    }
    if (poison) {
      // The legacy stream: ordered after the work of every context's (blocking) main stream;
      // side-stream work is joined into the main stream before its op returns, so before any
      // block it used is freed and handed out again.
      int prev = 0;
      cudaError_t e = cudaGetDevice(&prev);
      if (e == cudaSuccess && prev != dev.index) e = cudaSetDevice(dev.index);
      if (e == cudaSuccess) e = cudaMemset(p, kPoisonByte, rounded);
      if (prev != dev.index) cudaSetDevice(prev);
      if (e != cudaSuccess) {
        cudaFree(p);  // neither cached nor accounted: give it back before reporting
        LOWBIT_CUDA_CHECK(e);
      }
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
    DeviceCache& c = device_cache();
    const size_t rounded = cache_round(bytes);
    std::lock_guard<std::mutex> lock(c.mu);
    c.free_blocks[{dev.index, rounded}].push_back(p);
    c.cached_bytes += rounded;
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
