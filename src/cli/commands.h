// Subcommands of the `lowbit` binary, one source file each (src/cli/cmd_<name>.cpp).
//
// Each add_<name>_command() registers its subcommand, options and help on `app`. When the
// command line selects it, the parser stores the work to do in `action`; main() runs that
// only after the whole command line parsed, so parse errors and run errors stay apart.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <type_traits>

#include <CLI/CLI.hpp>

namespace lowbit::cli {

// The selected subcommand's work; returns the process exit status.
using CommandAction = std::function<int()>;

void add_info_command(CLI::App& app, CommandAction& action);
void add_bench_command(CLI::App& app, CommandAction& action);
void add_quantize_command(CLI::App& app, CommandAction& action);
void add_train_command(CLI::App& app, CommandAction& action);
void add_eval_command(CLI::App& app, CommandAction& action);
void add_generate_command(CLI::App& app, CommandAction& action);

// Checks a --recompute_block_outputs value (auto, on, off or a block count) at parse time, so a
// bad one is a usage error naming the flag.
CLI::Validator recompute_setting_validator();

// Ranges of numeric flags, checked at parse time on the value given (an option's own default —
// often -1 for "the trainer decides" — is not a given value): an integer in [lo, hi] or ≥ lo;
// a finite number in [lo, hi] (NaN and infinities are refused, which CLI::Range lets through).
// Every integer flag uses integer_in rather than CLI::Range, whose one message ("Value 1.5 not
// in range 1 to 10000") does not say which of the text, the bound or the size was wrong.
CLI::Validator integer_in(int64_t lo, int64_t hi);
// An integer ≥ lo that fits the flag's variable (`var`, only its type is used): a value past the
// type's range gets this message rather than CLI11's "Could not convert".
template <typename T>
CLI::Validator integer_at_least(const T& var, int64_t lo) {
  static_assert(std::is_integral_v<T> && std::is_signed_v<T> && sizeof(T) <= sizeof(int64_t),
                "integer_at_least: a signed integer flag of at most 64 bits");
  (void)var;
  return integer_in(lo, static_cast<int64_t>(std::numeric_limits<T>::max()));
}
CLI::Validator finite_in(double lo, double hi);

}  // namespace lowbit::cli
