// lowbit core layer: tensors, dtypes, devices, context, allocator, errors, Philox RNG.
#pragma once

#include "lowbit/core/allocator.h"
#include "lowbit/core/context.h"
#include "lowbit/core/device.h"
#include "lowbit/core/dtype.h"
#include "lowbit/core/error.h"
#include "lowbit/core/philox.h"
#include "lowbit/core/tensor.h"
