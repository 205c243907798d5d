// Host and device allocation with byte accounting per category. Training reports its
// memory (current and peak, per category) from these counters.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "lowbit/core/device.h"

namespace lowbit {

enum class MemCategory : unsigned char {
  kWeights,
  kGradients,
  kOptimizer,
  kActivations,
  kWorkspace,
  kOther,
};
inline constexpr int kNumMemCategories = 6;
std::string_view mem_category_name(MemCategory c);

struct MemCounters {
  int64_t current_bytes = 0;
  int64_t peak_bytes = 0;
};

struct MemStats {
  std::array<MemCounters, kNumMemCategories> by_category{};
  MemCounters total{};
};

// Allocates `bytes` on `dev` (256-byte aligned); throws on failure with the request's size,
// category and what is in use. Zero bytes returns nullptr.
void* mem_alloc(Device dev, size_t bytes, MemCategory cat);
void mem_free(Device dev, void* p, size_t bytes, MemCategory cat);

// Snapshot of the counters of one device (CPU counters for Device::cpu()).
MemStats mem_stats(Device dev);
// Peak counters restart from the current values (e.g. after setup, before training).
void mem_reset_peaks(Device dev);

}  // namespace lowbit
