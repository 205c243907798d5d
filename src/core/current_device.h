// Makes a device the calling thread's current CUDA device for a scope, restoring the previous one
// on exit (exceptions included).
#pragma once

#include <cuda_runtime.h>

#include "lowbit/core/cuda_check.h"

namespace lowbit {

class CurrentDevice {
 public:
  explicit CurrentDevice(int dev) {
    LOWBIT_CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != dev) {
      LOWBIT_CUDA_CHECK(cudaSetDevice(dev));
    } else {
      prev_ = -1;
    }
  }
  ~CurrentDevice() {
    if (prev_ >= 0) cudaSetDevice(prev_);
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int prev_ = -1;
};

}  // namespace lowbit
