// The Moré–Garbow–Hillstrom functions, written from the 1981 paper's definitions.
#include "mgh_problems.hpp"

#include <cmath>
#include <numbers>

namespace polyprobe::app {

namespace {

using Residuals = std::function<void(std::span<const double>, std::vector<double>&)>;

// f = sum of squared residuals.
std::function<double(std::span<const double>)> sum_of_squares(Residuals residuals) {
  return [residuals = std::move(residuals)](std::span<const double> x) {
    thread_local std::vector<double> r;
    r.clear();
    residuals(x, r);
    double s = 0;
    for (double v : r) s += v * v;
    return s;
  };
}

double at(std::span<const double> x, int i) { return x[static_cast<std::size_t>(i)]; }

MghProblem make(std::string name, std::vector<double> x0, Residuals r) {
  MghProblem p;
  p.name = std::move(name);
  p.n = static_cast<int>(x0.size());
  p.x0 = std::move(x0);
  p.f = sum_of_squares(std::move(r));
  return p;
}

MghProblem extended_rosenbrock(int n) {
  std::vector<double> x0(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) x0[static_cast<std::size_t>(i)] = i % 2 == 0 ? -1.2 : 1.0;
  return make("rosenbrock", x0, [](std::span<const double> x, std::vector<double>& r) {
    for (std::size_t i = 0; i + 1 < x.size(); i += 2) {
      r.push_back(10 * (x[i + 1] - x[i] * x[i]));
      r.push_back(1 - x[i]);
    }
  });
}

MghProblem extended_powell_singular(int n) {
  std::vector<double> x0(static_cast<std::size_t>(n));
  const double start[4] = {3, -1, 0, 1};
  for (int i = 0; i < n; ++i) x0[static_cast<std::size_t>(i)] = start[i % 4];
  return make("powell_singular", x0, [](std::span<const double> x, std::vector<double>& r) {
    for (std::size_t i = 0; i + 3 < x.size(); i += 4) {
      r.push_back(x[i] + 10 * x[i + 1]);
      r.push_back(std::sqrt(5.0) * (x[i + 2] - x[i + 3]));
      r.push_back((x[i + 1] - 2 * x[i + 2]) * (x[i + 1] - 2 * x[i + 2]));
      r.push_back(std::sqrt(10.0) * (x[i] - x[i + 3]) * (x[i] - x[i + 3]));
    }
  });
}

MghProblem variably_dimensioned(int n) {
  std::vector<double> x0(static_cast<std::size_t>(n));
  for (int j = 1; j <= n; ++j) x0[static_cast<std::size_t>(j - 1)] = 1 - static_cast<double>(j) / n;
  return make("variably_dimensioned", x0, [](std::span<const double> x, std::vector<double>& r) {
    double s = 0;
    for (std::size_t j = 0; j < x.size(); ++j) {
      r.push_back(x[j] - 1);
      s += static_cast<double>(j + 1) * (x[j] - 1);
    }
    r.push_back(s);
    r.push_back(s * s);
  });
}

MghProblem trigonometric(int n) {
  return make("trigonometric", std::vector<double>(static_cast<std::size_t>(n), 1.0 / n),
              [](std::span<const double> x, std::vector<double>& r) {
                const double n_ = static_cast<double>(x.size());
                double cos_sum = 0;
                for (double v : x) cos_sum += std::cos(v);
                for (std::size_t i = 0; i < x.size(); ++i)
                  r.push_back(n_ - cos_sum + static_cast<double>(i + 1) * (1 - std::cos(x[i])) -
                              std::sin(x[i]));
              });
}

MghProblem penalty_one(int n) {
  std::vector<double> x0(static_cast<std::size_t>(n));
  for (int j = 0; j < n; ++j) x0[static_cast<std::size_t>(j)] = j + 1;
  return make("penalty_1", x0, [](std::span<const double> x, std::vector<double>& r) {
    double s = 0;
    for (double v : x) {
      r.push_back(std::sqrt(1e-5) * (v - 1));
      s += v * v;
    }
    r.push_back(s - 0.25);
  });
}

MghProblem brown_almost_linear(int n) {
  return make("brown_almost_linear", std::vector<double>(static_cast<std::size_t>(n), 0.5),
              [](std::span<const double> x, std::vector<double>& r) {
                double sum = 0, prod = 1;
                for (double v : x) {
                  sum += v;
                  prod *= v;
                }
                for (std::size_t i = 0; i + 1 < x.size(); ++i)
                  r.push_back(x[i] + sum - static_cast<double>(x.size() + 1));
                r.push_back(prod - 1);
              });
}

std::vector<double> boundary_start(int n) {
  std::vector<double> x0(static_cast<std::size_t>(n));
  const double h = 1.0 / (n + 1);
  for (int i = 1; i <= n; ++i) x0[static_cast<std::size_t>(i - 1)] = i * h * (i * h - 1);
  return x0;
}

MghProblem discrete_boundary_value(int n) {
  return make(
      "discrete_boundary_value", boundary_start(n),
      [](std::span<const double> x, std::vector<double>& r) {
        const int n_ = static_cast<int>(x.size());
        const double h = 1.0 / (n_ + 1);
        for (int i = 0; i < n_; ++i) {
          const double left = i > 0 ? at(x, i - 1) : 0.0;
          const double right = i + 1 < n_ ? at(x, i + 1) : 0.0;
          const double t = (i + 1) * h;
          r.push_back(2 * at(x, i) - left - right + h * h * std::pow(at(x, i) + t + 1, 3) / 2);
        }
      });
}

MghProblem discrete_integral_equation(int n) {
  return make("discrete_integral_equation", boundary_start(n),
              [](std::span<const double> x, std::vector<double>& r) {
                const int n_ = static_cast<int>(x.size());
                const double h = 1.0 / (n_ + 1);
                for (int i = 0; i < n_; ++i) {
                  const double ti = (i + 1) * h;
                  double lower = 0, upper = 0;
                  for (int j = 0; j < n_; ++j) {
                    const double tj = (j + 1) * h;
                    const double c = std::pow(at(x, j) + tj + 1, 3);
                    if (j <= i)
                      lower += tj * c;
                    else
                      upper += (1 - tj) * c;
                  }
                  r.push_back(at(x, i) + h * ((1 - ti) * lower + ti * upper) / 2);
                }
              });
}

MghProblem broyden_tridiagonal(int n) {
  return make("broyden_tridiagonal", std::vector<double>(static_cast<std::size_t>(n), -1.0),
              [](std::span<const double> x, std::vector<double>& r) {
                const int n_ = static_cast<int>(x.size());
                for (int i = 0; i < n_; ++i) {
                  const double left = i > 0 ? at(x, i - 1) : 0.0;
                  const double right = i + 1 < n_ ? at(x, i + 1) : 0.0;
                  r.push_back((3 - 2 * at(x, i)) * at(x, i) - left - 2 * right + 1);
                }
              });
}

MghProblem broyden_banded(int n) {
  return make("broyden_banded", std::vector<double>(static_cast<std::size_t>(n), -1.0),
              [](std::span<const double> x, std::vector<double>& r) {
                const int n_ = static_cast<int>(x.size());
                for (int i = 0; i < n_; ++i) {
                  double s = 0;
                  for (int j = std::max(0, i - 5); j <= std::min(n_ - 1, i + 1); ++j)
                    if (j != i) s += at(x, j) * (1 + at(x, j));
                  r.push_back(at(x, i) * (2 + 5 * at(x, i) * at(x, i)) + 1 - s);
                }
              });
}

MghProblem linear_full_rank(int n) {
  return make("linear_full_rank", std::vector<double>(static_cast<std::size_t>(n), 1.0),
              [](std::span<const double> x, std::vector<double>& r) {
                double s = 0;
                for (double v : x) s += v;
                const double m = static_cast<double>(x.size());
                for (double v : x) r.push_back(v - 2 * s / m - 1);
              });
}

MghProblem chebyquad(int n) {
  std::vector<double> x0(static_cast<std::size_t>(n));
  for (int j = 1; j <= n; ++j)
    x0[static_cast<std::size_t>(j - 1)] = static_cast<double>(j) / (n + 1);
  return make("chebyquad", x0, [](std::span<const double> x, std::vector<double>& r) {
    const int n_ = static_cast<int>(x.size());
    std::vector<double> mean(static_cast<std::size_t>(n_), 0.0);
    for (double v : x) {
      // Shifted Chebyshev polynomials on [0, 1] by the three-term recurrence.
      const double y = 2 * v - 1;
      double prev = 1, cur = y;
      for (int i = 1; i <= n_; ++i) {
        mean[static_cast<std::size_t>(i - 1)] += cur / n_;
        const double next = 2 * y * cur - prev;
        prev = cur;
        cur = next;
      }
    }
    for (int i = 1; i <= n_; ++i) {
      const double integral = i % 2 == 0 ? -1.0 / (i * i - 1.0) : 0.0;
      r.push_back(mean[static_cast<std::size_t>(i - 1)] - integral);
    }
  });
}

}  // namespace

std::vector<MghProblem> mgh_problems() {
  std::vector<MghProblem> p;
  p.push_back(extended_rosenbrock(2));
  p.push_back(
      make("freudenstein_roth", {0.5, -2}, [](std::span<const double> x, std::vector<double>& r) {
        r.push_back(-13 + x[0] + ((5 - x[1]) * x[1] - 2) * x[1]);
        r.push_back(-29 + x[0] + ((x[1] + 1) * x[1] - 14) * x[1]);
      }));
  p.push_back(
      make("powell_badly_scaled", {0, 1}, [](std::span<const double> x, std::vector<double>& r) {
        r.push_back(1e4 * x[0] * x[1] - 1);
        r.push_back(std::exp(-x[0]) + std::exp(-x[1]) - 1.0001);
      }));
  p.push_back(make("beale", {1, 1}, [](std::span<const double> x, std::vector<double>& r) {
    const double y[3] = {1.5, 2.25, 2.625};
    for (int i = 1; i <= 3; ++i) r.push_back(y[i - 1] - x[0] * (1 - std::pow(x[1], i)));
  }));
  p.push_back(
      make("jennrich_sampson", {0.3, 0.4}, [](std::span<const double> x, std::vector<double>& r) {
        for (int i = 1; i <= 10; ++i)
          r.push_back(2 + 2 * i - (std::exp(i * x[0]) + std::exp(i * x[1])));
      }));
  p.push_back(
      make("helical_valley", {-1, 0, 0}, [](std::span<const double> x, std::vector<double>& r) {
        double theta = std::atan(x[1] / x[0]) / (2 * std::numbers::pi);
        if (x[0] < 0) theta += 0.5;
        if (x[0] == 0) theta = x[1] >= 0 ? 0.25 : -0.25;
        r.push_back(10 * (x[2] - 10 * theta));
        r.push_back(10 * (std::sqrt(x[0] * x[0] + x[1] * x[1]) - 1));
        r.push_back(x[2]);
      }));
  p.push_back(make("bard", {1, 1, 1}, [](std::span<const double> x, std::vector<double>& r) {
    const double y[15] = {0.14, 0.18, 0.22, 0.25, 0.29, 0.32, 0.35, 0.39,
                          0.37, 0.58, 0.73, 0.96, 1.34, 2.10, 4.39};
    for (int i = 1; i <= 15; ++i) {
      const double u = i, v = 16 - i, w = std::min(u, v);
      r.push_back(y[i - 1] - (x[0] + u / (v * x[1] + w * x[2])));
    }
  }));
  p.push_back(make("box_3d", {0, 10, 20}, [](std::span<const double> x, std::vector<double>& r) {
    for (int i = 1; i <= 10; ++i) {
      const double t = 0.1 * i;
      r.push_back(std::exp(-t * x[0]) - std::exp(-t * x[1]) -
                  x[2] * (std::exp(-t) - std::exp(-10 * t)));
    }
  }));
  p.push_back(extended_powell_singular(4));
  p.push_back(make("wood", {-3, -1, -3, -1}, [](std::span<const double> x, std::vector<double>& r) {
    r.push_back(10 * (x[1] - x[0] * x[0]));
    r.push_back(1 - x[0]);
    r.push_back(std::sqrt(90.0) * (x[3] - x[2] * x[2]));
    r.push_back(1 - x[2]);
    r.push_back(std::sqrt(10.0) * (x[1] + x[3] - 2));
    r.push_back((x[1] - x[3]) / std::sqrt(10.0));
  }));
  p.push_back(make("kowalik_osborne", {0.25, 0.39, 0.415, 0.39},
                   [](std::span<const double> x, std::vector<double>& r) {
                     const double y[11] = {0.1957, 0.1947, 0.1735, 0.1600, 0.0844, 0.0627,
                                           0.0456, 0.0342, 0.0323, 0.0235, 0.0246};
                     const double u[11] = {4,     2,   1,      0.5,    0.25,  0.167,
                                           0.125, 0.1, 0.0833, 0.0714, 0.0625};
                     for (int i = 0; i < 11; ++i)
                       r.push_back(y[i] - x[0] * (u[i] * u[i] + u[i] * x[1]) /
                                              (u[i] * u[i] + u[i] * x[2] + x[3]));
                   }));
  p.push_back(
      make("brown_dennis", {25, 5, -5, -1}, [](std::span<const double> x, std::vector<double>& r) {
        for (int i = 1; i <= 20; ++i) {
          const double t = i / 5.0;
          const double a = x[0] + t * x[1] - std::exp(t);
          const double b = x[2] + x[3] * std::sin(t) - std::cos(t);
          r.push_back(a * a + b * b);
        }
      }));
  p.push_back(
      make("biggs_exp6", {1, 2, 1, 1, 1, 1}, [](std::span<const double> x, std::vector<double>& r) {
        for (int i = 1; i <= 13; ++i) {
          const double t = 0.1 * i;
          const double y = std::exp(-t) - 5 * std::exp(-10 * t) + 3 * std::exp(-4 * t);
          r.push_back(x[2] * std::exp(-t * x[0]) - x[3] * std::exp(-t * x[1]) +
                      x[5] * std::exp(-t * x[4]) - y);
        }
      }));
  p.push_back(make(
      "watson", std::vector<double>(6, 0.0), [](std::span<const double> x, std::vector<double>& r) {
        for (int i = 1; i <= 29; ++i) {
          const double t = i / 29.0;
          double s1 = 0, s2 = 0;
          for (std::size_t j = 0; j < x.size(); ++j) {
            if (j > 0)
              s1 += static_cast<double>(j) * x[j] * std::pow(t, static_cast<double>(j) - 1);
            s2 += x[j] * std::pow(t, static_cast<double>(j));
          }
          r.push_back(s1 - s2 * s2 - 1);
        }
        r.push_back(x[0]);
        r.push_back(x[1] - x[0] * x[0] - 1);
      }));
  p.push_back(chebyquad(8));
  // n >= 10
  for (int n : {10, 30, 100}) p.push_back(extended_rosenbrock(n));
  for (int n : {12, 40}) p.push_back(extended_powell_singular(n));
  for (int n : {10, 50}) p.push_back(variably_dimensioned(n));
  for (int n : {10, 50}) p.push_back(trigonometric(n));
  for (int n : {10, 50}) p.push_back(penalty_one(n));
  for (int n : {10, 30}) p.push_back(brown_almost_linear(n));
  for (int n : {10, 50}) p.push_back(discrete_boundary_value(n));
  for (int n : {10, 30}) p.push_back(discrete_integral_equation(n));
  for (int n : {10, 100}) p.push_back(broyden_tridiagonal(n));
  for (int n : {10, 50}) p.push_back(broyden_banded(n));
  for (int n : {10, 50}) p.push_back(linear_full_rank(n));
  p.push_back(chebyquad(10));
  return p;
}

}  // namespace polyprobe::app
