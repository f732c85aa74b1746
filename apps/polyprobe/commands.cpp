#include "cli.hpp"

namespace polyprobe::app {

// Each command is defined in its own cmd_*.cpp.
Command version_command();
Command plugins_command();
Command bench_command();
Command train_command();
Command eval_command();
Command explain_command();
Command report_command();

const std::vector<Command>& commands() {
  static const std::vector<Command> table = {
      version_command(), plugins_command(), bench_command(),  train_command(),
      eval_command(),    explain_command(), report_command(),
  };
  return table;
}

}  // namespace polyprobe::app
