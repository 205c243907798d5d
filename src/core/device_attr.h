// Device attributes that launch paths ask for on every call (SM count, L2 size, shared memory per
// block), each queried from the driver once per device and attribute.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
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

// Whether `device` is compute capability 9.0, the only GPU the sm_90a kernels (wgmma,
// setmaxnreg: core/wgmma.cuh) run on.
inline bool is_sm90(int device) {
  return cached_device_attr(device, cudaDevAttrComputeCapabilityMajor) == 9 &&
         cached_device_attr(device, cudaDevAttrComputeCapabilityMinor) == 0;
}

// SMs of `device`.
inline int sm_count(int device) {
  return cached_device_attr(device, cudaDevAttrMultiProcessorCount);
}

// Opts `kernel` into `bytes` of dynamic shared memory on the current device when that exceeds
// the 48 KiB default. The attribute is set once per kernel, device and larger size (a
// cudaFuncSetAttribute costs ~10 µs of host time, which lands between kernels right after a
// synchronisation).
template <typename Kernel>
void allow_dynamic_smem(Kernel* kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return;
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, size_t> set;  // (kernel, device) → bytes allowed
  int device = 0;
  LOWBIT_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mu);
  size_t& allowed = set[{reinterpret_cast<const void*>(kernel), device}];
  if (bytes <= allowed) return;
  LOWBIT_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  allowed = bytes;
}

}  // namespace lowbit
