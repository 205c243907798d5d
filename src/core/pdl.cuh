// Programmatic dependent launch (sm_90+): a kernel launched with pdl::launch may be scheduled
// while the kernel before it in the stream is still finishing, so its blocks are resident and
// past their launch overhead when that kernel's last block exits (the ~2–3 µs between dependent
// kernels otherwise). Every kernel launched this way must start with pdl::grid_sync(), which
// waits for the previous kernel to complete and its writes to be visible before anything else
// is read or written; without the launch attribute (LOWBIT_PDL=0, or a plain <<<>>> launch) the
// wait is a no-op and the stream orders the kernels as usual.
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <utility>

#include "core/env_switch.h"
#include "lowbit/core/cuda_check.h"

namespace lowbit::pdl {

// The first statement of a kernel launched through launch(): wait for the preceding kernel (its
// memory operations complete and visible), then let the next kernel be scheduled as this one's
// blocks retire.
__device__ __forceinline__ void grid_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether launch() asks for the overlap: on unless the environment sets LOWBIT_PDL=0 / off (for
// A/B timing in one binary).
inline bool enabled() {
  static const bool on = [] {
    return parse_env_switch("LOWBIT_PDL", std::getenv("LOWBIT_PDL")) != 0;
  }();
  return on;
}

// kernel<<<grid, block, smem, stream>>>(args...), allowed to overlap the previous kernel's tail;
// with cluster_x > 1 its blocks run in clusters of cluster_x consecutive blocks along x (grid.x
// a multiple of cluster_x).
template <typename... Params, typename... Args>
void launch_clustered(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                      cudaStream_t stream, unsigned cluster_x, Args&&... args) {
  LOWBIT_CHECK(cluster_x >= 1 && grid.x % cluster_x == 0,
               "launch: a grid of {} blocks along x is not a whole number of clusters of {}",
               grid.x, cluster_x);
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (cluster_x > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster_x;
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  if (enabled()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = n;
  LOWBIT_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            Args&&... args) {
  launch_clustered(kernel, grid, block, smem, stream, 1u, std::forward<Args>(args)...);
}

}  // namespace lowbit::pdl
