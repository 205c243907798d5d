// The one `lowbit` binary: subcommands are registered from src/cli/cmd_*.cpp.
#include <cstdio>

#include "lowbit/core/error.h"

int main(int argc, char** argv) {
  std::puts("lowbit");
  return 0;
}
