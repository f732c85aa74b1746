// Moré–Garbow–Hillstrom test problems for derivative-free benchmarks.
//
// Each problem is a nonlinear least-squares function f(x) = sum_i r_i(x)^2 with its standard
// starting point (Moré, Garbow and Hillstrom, ACM TOMS 7(1), 1981), instantiated at the
// dimensions used by Moré and Wild's derivative-free benchmark (SIAM J. Optim. 20(1), 2009)
// and a few larger ones, n from 2 to 100. `polyprobe bench dfo` runs every solver on them.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <vector>

namespace polyprobe::app {

struct MghProblem {
  std::string name;  // "rosenbrock", "broyden_tridiagonal", ...
  int n = 0;
  std::vector<double> x0;
  std::function<double(std::span<const double>)> f;
};

// The benchmark set: every problem at each of its dimensions.
std::vector<MghProblem> mgh_problems();

}  // namespace polyprobe::app
