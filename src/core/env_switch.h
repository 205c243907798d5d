// The process-wide developer switches read from the environment (LOWBIT_GEMM_AUTOTUNE,
// LOWBIT_GEMM_FUSED, LOWBIT_POISON_ALLOC, LOWBIT_PDL, LOWBIT_QUANT_KERNELS): one spelling of
// on / off for all of them, and a mistyped value is a UserError that names the variable and what
// it takes instead of silently meaning something else.
#pragma once

#include <initializer_list>
#include <string>

namespace lowbit {

// An on / off value: 1 for 1, on, true, yes; 0 for 0, off, false, no (any case); -1 when unset
// (null) or empty; 2 for `also` (one more word the variable takes, e.g. "auto"), when given.
// Anything else throws UserError("<var>=<value>: expected on / off ...").
int parse_env_switch(const char* var, const char* value, const char* also = nullptr);

// The value of `var` among `choices` (any case), or `fallback` when unset or empty; anything else
// throws a UserError that lists the choices.
std::string parse_env_choice(const char* var, const char* value,
                             std::initializer_list<const char*> choices, const char* fallback);

}  // namespace lowbit
