// Host/device qualifiers shared by every header that must compile for both
// the CPU twin (g++) and CUDA kernels (nvcc).
#pragma once

#if defined(__CUDACC__)
#define LOWBIT_HD __host__ __device__ __forceinline__
#define LOWBIT_DEVICE_CODE 1
#else
#define LOWBIT_HD inline
#define LOWBIT_DEVICE_CODE 0
#endif
