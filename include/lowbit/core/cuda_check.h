// Checks for CUDA runtime and library calls: on failure they throw InternalError with
// file:line, the call's text and the library's own error string.
#pragma once

#include <cuda_runtime.h>

#include "lowbit/core/error.h"

#define LOWBIT_CUDA_CHECK(expr)                                                                 \
  do {                                                                                          \
    cudaError_t lowbit_err_ = (expr);                                                           \
    if (lowbit_err_ != cudaSuccess) {                                                           \
      ::lowbit::throw_internal(__FILE__, __LINE__,                                              \
                               std::string(#expr " failed: ") + cudaGetErrorName(lowbit_err_) + \
                                   ": " + cudaGetErrorString(lowbit_err_));                     \
    }                                                                                           \
  } while (0)

// After a kernel launch: catches launch-configuration errors without synchronising.
#define LOWBIT_CUDA_CHECK_LAUNCH() LOWBIT_CUDA_CHECK(cudaGetLastError())

// cuBLAS / cuBLASLt status (cublasStatus_t); include <cublasLt.h> before using.
#define LOWBIT_CUBLAS_CHECK(expr)                                                 \
  do {                                                                            \
    auto lowbit_st_ = (expr);                                                     \
    if (lowbit_st_ != CUBLAS_STATUS_SUCCESS) {                                    \
      ::lowbit::throw_internal(__FILE__, __LINE__,                                \
                               std::string(#expr " failed: cublas status ") +     \
                                   std::to_string(static_cast<int>(lowbit_st_))); \
    }                                                                             \
  } while (0)

// NCCL status (ncclResult_t, 0 = success); `errstr` is ncclGetErrorString or equivalent.
#define LOWBIT_NCCL_CHECK(expr, errstr)                                                \
  do {                                                                                 \
    auto lowbit_nr_ = (expr);                                                          \
    if (static_cast<int>(lowbit_nr_) != 0) {                                           \
      ::lowbit::throw_internal(__FILE__, __LINE__,                                     \
                               std::string(#expr " failed: ") + (errstr)(lowbit_nr_)); \
    }                                                                                  \
  } while (0)
