// The process-wide developer switches read from the environment (LOWBIT_GEMM_AUTOTUNE,
// LOWBIT_GEMM_FUSED, LOWBIT_POISON_ALLOC, LOWBIT_PDL: on / off, one spelling for all;
// LOWBIT_QUANT_KERNELS: a list of choices). A mistyped value is a UserError that names the
// variable and what it takes instead of silently meaning something else, raised when a Context is
// made (validate_env_switches), before any work is queued.
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

// Parses every switch above from the environment (each one's readers parse it again the same
// way, once per process), so that a typo fails before any GPU work is queued. Context's
// constructor calls it.
void validate_env_switches();

// LOWBIT_GEMM_FUSED's value: parse_env_switch with "auto" as the third word (2).
int parse_gemm_fused(const char* value);

// LOWBIT_QUANT_KERNELS's value as a kernel generation: v8 … v15 → 8 … 15, unset or empty → 15.
int parse_quant_kernels(const char* value);

}  // namespace lowbit
