// Device attributes that launch paths ask for on every call (SM count, L2 size, shared memory per
// block), each queried from the driver once per device and attribute.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <utility>

#include "lowbit/core/cuda_check.h"

namespace lowbit {

inline int cached_device_attr(int device, cudaDeviceAttr attr) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, int> cache;
  const std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(device, static_cast<int>(attr));
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  int value = 0;
  LOWBIT_CUDA_CHECK(cudaDeviceGetAttribute(&value, attr, device));
  cache.emplace(key, value);
  return value;
}

// SMs of `device`.
inline int sm_count(int device) {
  return cached_device_attr(device, cudaDevAttrMultiProcessorCount);
}

}  // namespace lowbit
