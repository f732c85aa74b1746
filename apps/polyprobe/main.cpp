// polyprobe: train, evaluate, benchmark and explain gradient-free training runs.
#include "cli.hpp"

#include <iostream>

namespace {

void print_overview() {
  std::cout << "usage: polyprobe COMMAND [options]\n\n"
               "polyprobe trains neural networks without gradients: each step it probes the\n"
               "parameters at the vertices of rotated polytopes and moves them by optimal\n"
               "transport. Backends are plugins, chosen at run time.\n\ncommands:\n";
  for (const auto& command : polyprobe::app::commands())
    std::cout << "  " << command.name
              << std::string(10 - std::min<std::size_t>(9, command.name.size()), ' ')
              << command.summary << "\n";
  std::cout
      << "\n`polyprobe COMMAND --help` explains a command and its options.\n"
         "`polyprobe train` with no arguments trains a small model on the embedded data set.\n";
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    if (args.size() >= 2)
      for (const auto& command : polyprobe::app::commands())
        if (command.name == args[1]) return polyprobe::app::run_command(command, {"--help"});
    print_overview();
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "--version")
    return polyprobe::app::run_command(polyprobe::app::commands().front(), {});
  for (const auto& command : polyprobe::app::commands())
    if (command.name == args[0])
      return polyprobe::app::run_command(command, {args.begin() + 1, args.end()});
  std::cerr << "polyprobe: error: unknown command '" << args[0]
            << "' (run `polyprobe --help` for the list)\n";
  return 2;
}
