// Loading the PyTorch parity fixtures written by tools/make_fixtures.py.
#pragma once

#include <polyprobe/batch.hpp>
#include <polyprobe/model_file.hpp>
#include <polyprobe/safetensors.hpp>

#include <filesystem>
#include <string>
#include <vector>

namespace polyprobe::testing {

inline std::filesystem::path fixture_dir() { return POLYPROBE_FIXTURE_DIR; }

// The case names (the fixture folder's *.json files), sorted.
std::vector<std::string> fixture_cases();

struct Fixture {
  ModelFile file;           // with the fixture's weights assigned
  Batch batch;              // inputs, and labels or targets for loss cases
  Matrix<double> expected;  // PyTorch's output [B, out]
  double objective = 0.0;   // loss cases: PyTorch's mean loss + l2 |theta|^2
  bool has_objective = false;
};

Fixture load_fixture(const std::string& name);

}  // namespace polyprobe::testing
