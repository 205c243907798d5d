// The one `lowbit` binary. Subcommands live in src/cli/cmd_<name>.cpp and are registered here.
//
// Exit status: 0 success; 2 bad usage or bad input (lowbit::UserError, unknown subcommand or
// flag), printed as "error: <message>" without a trace; 1 internal error.
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "lowbit/core/error.h"
#include "lowbit/core/sysinfo.h"

namespace {

// The deepest subcommand the parser reached: its usage is the one to print after an error.
const CLI::App* deepest_subcommand(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands()) return deepest_subcommand(*sub);
  return &app;
}

// "lowbit info" for the info subcommand: the name chain CLI11's usage line wants.
std::string command_path(const CLI::App* app) {
  const CLI::App* parent = app->get_parent();
  return parent == nullptr ? app->get_name() : command_path(parent) + " " + app->get_name();
}

// CLI11's message, reworded where the parser stopped at the top level on a word it does not
// know ("A subcommand is required" would hide the bad word).
std::string parse_error_message(const CLI::ParseError& e, const CLI::App& app) {
  if (deepest_subcommand(app) == &app) {
    std::vector<std::string> names;
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
      names.push_back(sub->get_name());
    }
    for (const std::string& arg : app.remaining()) {
      if (arg.empty()) continue;
      if (arg[0] != '-') {
        return fmt::format("unknown command '{}' (commands: {})", arg, fmt::join(names, ", "));
      }
      return fmt::format("unknown option '{}'", arg);
    }
  }
  return e.what();
}

std::string version_line() {
  const lowbit::BuildInfo& b = lowbit::build_info();
  const std::string archs = fmt::format("{}", fmt::join(b.cuda_archs, ";"));
  return fmt::format("lowbit {} (CUDA {}, {})", b.version, b.cuda_toolkit,
                     archs.empty() ? "no CUDA architectures recorded" : archs);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lowbit: trains LLaMA-family language models in FP8, MXFP8 and NVFP4", "lowbit"};
  app.set_version_flag("--version", version_line(), "Print the version and exit");
  app.require_subcommand(1);

  lowbit::cli::CommandAction action;
  lowbit::cli::add_info_command(app, action);
  lowbit::cli::add_bench_command(app, action);
  lowbit::cli::add_quantize_command(app, action);
  lowbit::cli::add_train_command(app, action);
  lowbit::cli::add_eval_command(app, action);
  lowbit::cli::add_generate_command(app, action);
  app.footer("Run 'lowbit <command> --help' for the options of a command.");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    const CLI::App* where = deepest_subcommand(app);
    const CLI::App* parent = where->get_parent();
    std::cerr << "error: " << parse_error_message(e, app) << "\n\n"
              << where->help(parent == nullptr ? "" : command_path(parent));
    return 2;
  }

  try {
    if (!action) throw lowbit::InternalError("no action was registered for the command");
    return action();
  } catch (const lowbit::UserError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "internal error: %s\n", e.what());
    return 1;
  }
}
