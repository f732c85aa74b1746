#include "cli.hpp"

#include <polyprobe/plugin/abi.h>

#include <Eigen/Core>
#include <boost/version.hpp>
#include <iostream>

namespace polyprobe::app {

Command version_command() {
  Command c;
  c.name = "version";
  c.summary = "print the version of polyprobe, its plugin API and its dependencies";
  c.uses_plugins = false;
  c.run = [](Context& ctx) {
    *ctx.out << "polyprobe " << POLYPROBE_VERSION << " (plugin API " << PP_PLUGIN_API_VERSION
             << ", Eigen " << EIGEN_WORLD_VERSION << "." << EIGEN_MAJOR_VERSION << "."
             << EIGEN_MINOR_VERSION << ", Boost " << BOOST_VERSION / 100000 << "."
             << BOOST_VERSION / 100 % 1000 << ")\n";
    return 0;
  };
  return c;
}

}  // namespace polyprobe::app
