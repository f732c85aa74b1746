// Runs the polyprobe executable as a user would, capturing exit code and output.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

struct ProcessResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs `command` through /bin/sh with stdout and stderr captured separately.
inline ProcessResult run_process(const std::string& command) {
  namespace fs = std::filesystem;
  static int counter = 0;
  const fs::path dir = fs::temp_directory_path() / ("polyprobe-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path out = dir / ("out" + std::to_string(counter)),
                 err = dir / ("err" + std::to_string(counter++));
  const std::string full = command + " >" + out.string() + " 2>" + err.string() + " </dev/null";
  const int status = std::system(full.c_str());
  ProcessResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  auto slurp = [](const fs::path& p) {
    std::ifstream f(p);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  };
  r.out = slurp(out);
  r.err = slurp(err);
  fs::remove(out);
  fs::remove(err);
  return r;
}
