// The host app as users meet it: exit codes, one-line errors, help, config files and the
// plugin listing.
#include "app/run_process.hpp"

#include <polyprobe/plugin/abi.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

const std::string exe = POLYPROBE_EXE;

// The shell prefix that caps a run's address space, so that a regression which allocates
// without bound fails fast instead of taking the machine's memory. Not under AddressSanitizer,
// whose shadow memory needs terabytes of address space at start (the app is built alike).
std::string memory_capped() {
#if defined(__SANITIZE_ADDRESS__)
  return "";
#else
  return "ulimit -v 4000000; ";
#endif
}

ProcessResult polyprobe(const std::string& args,
                        const std::string& env = "POLYPROBE_PLUGIN_PATH=") {
  return run_process(env + " " + exe + " " + args);
}

std::string write_file(const std::string& name, const std::string& text) {
  std::filesystem::create_directories(POLYPROBE_TEST_TMP);
  const std::string path = std::string(POLYPROBE_TEST_TMP) + "/" + name;
  std::ofstream(path) << text;
  return path;
}

int lines(const std::string& text) {
  return static_cast<int>(std::count(text.begin(), text.end(), '\n'));
}

}  // namespace

TEST_CASE("no arguments prints the overview and fails, --help succeeds") {
  const auto bare = polyprobe("");
  CHECK(bare.exit_code == 2);
  CHECK_THAT(bare.out, Catch::Contains("commands:") && Catch::Contains("plugins"));
  const auto help = polyprobe("--help");
  CHECK(help.exit_code == 0);
  CHECK_THAT(help.out, Catch::Contains("usage: polyprobe COMMAND"));
}

TEST_CASE("every command has --help that names its options") {
  for (const char* command : {"plugins", "version", "bench"}) {
    INFO(command);
    const auto r = polyprobe(std::string(command) + " --help");
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.out, Catch::Contains("usage: polyprobe " + std::string(command)) &&
                          Catch::Contains("--config"));
  }
}

TEST_CASE("an unknown command or option is a one-line usage error, exit 2") {
  const auto unknown = polyprobe("frobnicate");
  CHECK(unknown.exit_code == 2);
  CHECK_THAT(unknown.err, Catch::Contains("unknown command 'frobnicate'"));
  CHECK(lines(unknown.err) == 1);
  const auto option = polyprobe("plugins --colour");
  CHECK(option.exit_code == 2);
  CHECK_THAT(option.err, Catch::Contains("unrecognised option '--colour'"));
  CHECK(lines(option.err) == 1);
}

TEST_CASE("config files: missing, unknown keys and valid ones") {
  const auto missing = polyprobe("plugins --config /nonexistent/polyprobe.cfg");
  CHECK(missing.exit_code == 2);
  CHECK_THAT(missing.err,
             Catch::Contains("config file '/nonexistent/polyprobe.cfg' cannot be read"));
  const auto bad = polyprobe("plugins --config " + write_file("bad.cfg", "colour = blue\n"));
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, Catch::Contains("colour"));
  const auto good = polyprobe("plugins --config " + write_file("good.cfg", "json = true\n"));
  CHECK(good.exit_code == 0);
  CHECK(nlohmann::json::parse(good.out)["plugins"].is_array());
}

TEST_CASE("a --plugin-dir that does not exist is an error") {
  const auto r = polyprobe("plugins --plugin-dir /nonexistent/plugins");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("'/nonexistent/plugins' is not a directory"));
}

TEST_CASE("option --no-operation withholds an operation, and explain says who projects x B^T") {
  // A name no loaded plugin offers is a usage error listing the ones offered.
  const auto typo =
      polyprobe("explain --workload mnist128-factored-r2 --no-operation factored_corection");
  CHECK(typo.exit_code == 2);
  CHECK_THAT(typo.err,
             Catch::Contains("--no-operation 'factored_corection': no loaded plugin offers "
                             "it (offered: factored_correction, sdpa"));
  const std::string args = "explain --workload mnist128-factored-r32 --threads 1";
  const auto with = polyprobe(args);
  REQUIRE(with.exit_code == 0);
  CHECK_THAT(with.out, Catch::Contains("subspace directions x B^T: factored_correction from "
                                       "factored_subspace for layers 0 (32 directions), 2 (32 "
                                       "directions)"));
  const auto without = polyprobe(args + " --no-operation factored_correction");
  REQUIRE(without.exit_code == 0);
  CHECK_THAT(without.out, Catch::Contains("subspace directions x B^T: one product per direction "
                                          "(no factored_correction operation loaded for cpu, "
                                          "float32)"));
  const auto listed = polyprobe("plugins --no-operation factored_correction");
  CHECK_THAT(listed.out, Catch::Contains("operation factored_correction (cpu) not offered: "
                                         "withheld by the host (--no-operation"));
}

TEST_CASE("plugins --json describes every plugin, broken ones with their reason") {
  const auto r =
      polyprobe("plugins --json --plugin-dir " + std::string(POLYPROBE_FIXTURE_PLUGIN_DIR));
  REQUIRE(r.exit_code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["plugin_api"] == PP_PLUGIN_API_VERSION);
  bool cpu_available = false, wrong_abi_reason = false, api2_reason = false,
       not_library_reason = false, fakeaccel_device = false;
  for (const auto& p : j["plugins"]) {
    for (const char* key :
         {"name", "version", "abi", "path", "available", "reason", "capabilities"})
      CHECK(p.contains(key));
    if (p["name"] == "cpu_tbb") cpu_available = p["available"].get<bool>();
    // A descriptor of another API version is not read past its version, so the plugin
    // is named by its file.
    if (p["path"].get<std::string>().ends_with("libpolyprobe_wrong_abi.so"))
      wrong_abi_reason =
          p["reason"].get<std::string>().find(
              "built against plugin API 1; this polyprobe is API 3") != std::string::npos;
    // A plugin built for API 2 declines API 3 and is named by the version it answers.
    if (p["path"].get<std::string>().ends_with("libpolyprobe_api2.so")) {
      api2_reason = p["reason"] ==
                    "it was built against plugin API 2; this polyprobe is API 3: rebuild it "
                    "against the installed package";
      CHECK(p["abi"] == 2);
      CHECK_FALSE(p["available"].get<bool>());
    }
    if (p["name"] == "fixture_fakeaccel")
      for (const auto& c : p["capabilities"])
        fakeaccel_device = c["device"] == "fakeaccel" && c["device_type"] == "accelerator";
    if (p["path"].get<std::string>().ends_with("libpolyprobe_not_a_library.so"))
      not_library_reason = p["reason"] == "not a shared library (invalid ELF header)";
  }
  CHECK(cpu_available);
  CHECK(wrong_abi_reason);
  CHECK(api2_reason);
  CHECK(not_library_reason);
  CHECK(fakeaccel_device);
}

TEST_CASE("plugins lists subspace kinds and radius models, and train uses and explains them") {
  const std::string path = "POLYPROBE_PLUGIN_PATH=" + std::string(POLYPROBE_EXAMPLE_PLUGIN_DIR);
  const auto r = polyprobe("plugins", path);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("    radius_model plateau: ") &&
                        Catch::Contains("    subspace factored: ") &&
                        Catch::Contains("subspace kinds (--subspace): full, hybrid, factored "
                                        "(factored_subspace)") &&
                        Catch::Contains("plateau (plateau)"));
  const auto json = nlohmann::json::parse(polyprobe("plugins --json", path).out);
  CHECK(json["subspace_kinds"].size() == 3);
  CHECK(json["radius_models"].back()["name"] == "plateau");
  CHECK(json["radius_models"].back()["provider"] == "plateau");
  const auto t = polyprobe(
      "train --epochs 1 --quiet --explain --subspace factored --subspace-rank 2 "
      "--radius-model plateau --radius-options '{\"patience\": 2}'",
      path);
  CHECK(t.exit_code == 0);
  CHECK_THAT(t.out, Catch::Contains("; subspace factored (") &&
                        Catch::Contains("; radius model plateau (plugin)") &&
                        Catch::Contains("test accuracy: "));
  CHECK_THAT(t.err, Catch::Contains("subspace factored: plugin factored_subspace") &&
                        Catch::Contains("radius model plateau: plugin plateau"));
}

TEST_CASE("POLYPROBE_PLUGIN_PATH is searched and the table shows reasons") {
  const auto r =
      polyprobe("plugins", "POLYPROBE_PLUGIN_PATH=" + std::string(POLYPROBE_FIXTURE_PLUGIN_DIR));
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("fixture_no_device") && Catch::Contains("no CUDA device") &&
                        Catch::Contains("cpu_tbb") && Catch::Contains("available"));
}

TEST_CASE("plugins: the search path in the order applied, one line per layer, aligned columns") {
  const std::string a = std::string(POLYPROBE_TEST_TMP) + "/search_a";
  std::filesystem::create_directories(a);
  const std::string b = POLYPROBE_FIXTURE_PLUGIN_DIR;
  const auto r = polyprobe("plugins --plugin-dir " + a + " --plugin-dir " + b);
  REQUIRE(r.exit_code == 0);
  const std::size_t at_a = r.out.find("\n  " + a + "\n"), at_b = r.out.find("\n  " + b + "\n");
  REQUIRE(at_a != std::string::npos);
  REQUIRE(at_b != std::string::npos);
  CHECK(at_a < at_b);
  const auto json = nlohmann::json::parse(
      polyprobe("plugins --json --plugin-dir " + a + " --plugin-dir " + b).out);
  REQUIRE(json["search_path"].size() >= 2);
  CHECK(json["search_path"][0] == a);
  CHECK(json["search_path"][1] == b);

  // A layer declared as a capability and shipped as a layer kind: listed once.
  std::size_t count = 0;
  for (std::size_t at = r.out.find("layer fixture_double"); at != std::string::npos;
       at = r.out.find("layer fixture_double", at + 1))
    ++count;
  CHECK(count == 1);
  // Every row's VERSION column starts where the header's does, long names included.
  std::istringstream lines(r.out);
  std::string line;
  std::size_t version_col = std::string::npos;
  int rows = 0;
  while (std::getline(lines, line)) {
    if (line.starts_with("NAME")) version_col = line.find("VERSION");
    if (version_col == std::string::npos || line.empty() || line[0] == ' ' ||
        line.starts_with("NAME") || line.starts_with("The core") ||
        line.starts_with("subspace kinds") || line.starts_with("radius models"))
      continue;
    ++rows;
    INFO(line);
    REQUIRE(line.size() > version_col);
    CHECK(line[version_col - 1] == ' ');
    CHECK(line[version_col] != ' ');
    CHECK(line.find("ABI") == std::string::npos);
  }
  CHECK(rows >= 3);
  CHECK_THAT(r.out,
             Catch::Contains("fixture_layer_caps_with_a_long_name  1.0.0-a-long-version  3"));
}

TEST_CASE("version names the plugin API") {
  const auto r = polyprobe("version");
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::StartsWith("polyprobe ") && Catch::Contains("plugin API 3"));
}

TEST_CASE("an unknown --backend or an unservable --device fails with the reason, exit 1") {
  const auto backend = polyprobe("train --backend no_such_backend --epochs 1 --quiet");
  CHECK(backend.exit_code == 1);
  CHECK_THAT(backend.err,
             Catch::Contains("unknown backend 'no_such_backend'") && Catch::Contains("cpu_tbb"));
  CHECK(lines(backend.err) == 1);
  const auto device = polyprobe("train --device cuda --epochs 1 --quiet");
  CHECK(device.exit_code == 1);
  CHECK_THAT(device.err, Catch::Contains("no plugin can evaluate on cuda"));
}

TEST_CASE("train accepts any device a loaded plugin declares and lists the known ones for others") {
  const std::string fixtures = " --plugin-dir " + std::string(POLYPROBE_FIXTURE_PLUGIN_DIR);
  const auto table = polyprobe("plugins" + fixtures);
  REQUIRE(table.exit_code == 0);
  CHECK_THAT(table.out,
             Catch::Contains("evaluator fixture [accelerator/fakeaccel; float32,float64]"));
  CHECK_THAT(table.out, Catch::Contains("evaluator fixture [gpu/cuda; float64]"));
  CHECK_THAT(table.out, Catch::Contains("[cpu/cpu; float32,float64]"));
  CHECK_THAT(table.out, Catch::Contains("built against plugin API 2; this polyprobe is API 3: "
                                        "rebuild it against the installed package"));
  // The fixture's evaluator is chosen for its device, and says so from session_create.
  const auto accel = polyprobe("train --epochs 1 --quiet --device fakeaccel" + fixtures);
  CHECK(accel.exit_code == 1);
  CHECK_THAT(accel.err,
             Catch::Contains("fixture_fakeaccel reached with device accelerator/fakeaccel"));
  const auto unknown = polyprobe("train --epochs 1 --quiet --device nosuchaccel" + fixtures);
  CHECK(unknown.exit_code == 1);
  CHECK_THAT(unknown.err,
             Catch::Contains("unknown device 'nosuchaccel' (known: cpu, cuda, fakeaccel)") &&
                 Catch::Contains("--plugin-dir") && Catch::Contains("POLYPROBE_PLUGIN_PATH"));
  // Without the fixture folder the device is not known.
  const auto without = polyprobe("train --epochs 1 --quiet --device fakeaccel");
  CHECK(without.exit_code == 1);
  CHECK_THAT(without.err, Catch::Contains("unknown device 'fakeaccel' (known: cpu, cuda"));
  // A plugin built for API 2, chosen by name, is refused with its version.
  const auto api2 = polyprobe("train --epochs 1 --quiet --backend api2" + fixtures);
  CHECK(api2.exit_code == 1);
  CHECK_THAT(api2.err, Catch::Contains("built against plugin API 2; this polyprobe is API 3: "
                                       "rebuild it against the installed package"));
}

#if POLYPROBE_HAVE_NLOPT
TEST_CASE("bench dfo runs seeds, records where each run solved and averages the profile") {
  const std::string json = std::string(POLYPROBE_TEST_TMP) + "/dfo.json";
  std::filesystem::create_directories(POLYPROBE_TEST_TMP);
  const auto r = polyprobe(
      "bench dfo --quiet --dfo-problems beale,rosenbrock-10 --dfo-threads 2 --dfo-seeds 2 "
      "--dfo-solvers polyprobe-tr-dn-bfgs,nlopt-neldermead --json " +
      json);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("randomized ones 2 seeds each"));
  std::ifstream file(json);
  const auto doc = nlohmann::json::parse(file);
  // solved_at_sg[path][tau] over every run, to recompute the profiles from.
  std::map<std::string, std::map<std::string, std::vector<double>>> solved;
  std::map<std::string, int> runs;
  for (const auto& rec : doc["records"]) {
    if (!rec.contains("solved_at_sg")) continue;
    const std::string path = rec["path"];
    ++runs[path];
    CHECK(rec.contains("seed") == (path == "polyprobe-tr-dn-bfgs"));
    CHECK(rec["evaluations"].get<int64_t>() <= rec["budget"].get<int64_t>());
    for (const char* tau : {"1e-3", "1e-5"}) {
      const auto& at = rec["solved_at_sg"][tau];
      solved[path][tau].push_back(at.is_null() ? 1e9 : at.get<double>());
    }
  }
  CHECK(runs["polyprobe-tr-dn-bfgs"] == 4);  // 2 problems x 2 seeds
  CHECK(runs["nlopt-neldermead"] == 2);
  int profiles = 0;
  for (const auto& rec : doc["records"]) {
    if (!rec.contains("profile") || rec["group"] != "all") continue;
    ++profiles;
    const std::string path = rec["path"];
    const std::string tau = rec["tau"].get<double>() == 1e-3 ? "1e-3" : "1e-5";
    CHECK(rec["seeds"].get<int>() == (path == "polyprobe-tr-dn-bfgs" ? 2 : 1));
    for (const auto& [budget, fraction] : rec["profile"].items()) {
      const auto& at = solved[path][tau];
      const double expected =
          static_cast<double>(std::count_if(at.begin(), at.end(),
                                            [&](double sg) { return sg <= std::stod(budget); })) /
          static_cast<double>(at.size());
      CHECK(fraction.get<double>() == Approx(expected));
    }
  }
  CHECK(profiles == 4);  // 2 solvers x 2 tolerances

  const auto seeds = polyprobe("bench dfo --dfo-seeds 0");
  CHECK(seeds.exit_code == 2);
  CHECK_THAT(seeds.err, Catch::Contains("--dfo-seeds must be at least 1"));
  const auto metric = polyprobe("bench dfo --dfo-config metric=newton");
  CHECK(metric.exit_code == 2);
  CHECK_THAT(metric.err, Catch::Contains("unknown metric 'newton'"));
}
#endif

// Without NLopt (cmake/PolyprobeDependencies.cmake) the build still has `bench dfo`: `all`
// runs the polyprobe solvers and says the baselines are unavailable, and naming one is a
// one-line error naming the missing package. In a build with NLopt this checks the other
// side; tests/app/nlopt_optional.sh builds the host without NLopt and checks it there.
TEST_CASE("bench dfo without NLopt: the polyprobe solvers only, an NLopt baseline refused") {
  const auto named = polyprobe("bench dfo --quiet --dfo-problems beale --dfo-solvers nlopt-sbplx");
  const auto all = polyprobe("bench dfo --quiet --dfo-problems beale --dfo-threads 1");
  if (POLYPROBE_HAVE_NLOPT) {
    CHECK(named.exit_code == 0);
    CHECK(all.exit_code == 0);
    CHECK_THAT(all.out, Catch::Contains("nlopt-sbplx"));
    CHECK_THAT(all.out, !Catch::Contains("NLopt baselines unavailable"));
    return;
  }
  CHECK(named.exit_code == 1);
  CHECK_THAT(named.err, Catch::Contains("nlopt-sbplx is an NLopt baseline") &&
                            Catch::Contains("built without NLopt") &&
                            Catch::Contains("libnlopt-cxx-dev"));
  REQUIRE(all.exit_code == 0);
  CHECK_THAT(all.out,
             Catch::Contains("NLopt baselines unavailable") && Catch::Contains("polyprobe-tr-dn"));
  CHECK_THAT(all.out, !Catch::Contains("nlopt-"));
}

TEST_CASE("mistakes say how to fix them: the nearest option, the file and line, the weights") {
  const auto option = polyprobe("train --hiden 3");
  CHECK(option.exit_code == 2);
  CHECK_THAT(option.err, Catch::Contains("'--hiden' (did you mean --hidden?)"));
  CHECK(lines(option.err) == 1);
  const std::string config = write_file("typo.ini", "epochs = 3\n# a comment\nhiden = 4\n");
  const auto key = polyprobe("train --config " + config);
  CHECK(key.exit_code == 2);
  CHECK_THAT(key.err, Catch::Contains("config file '" + config +
                                      "', line 3: unknown option 'hiden' (did you mean hidden?)"));
  const auto far = polyprobe("plugins --colour");
  CHECK_THAT(far.err, !Catch::Contains("did you mean"));
  const auto weights = polyprobe("eval --weights /nonexistent/missing.safetensors");
  CHECK(weights.exit_code == 1);
  CHECK_THAT(weights.err, Catch::Contains("/nonexistent/missing.safetensors") &&
                              !Catch::Contains("missing.json"));
  const auto mse = polyprobe("train --loss mse --quiet --epochs 1");
  CHECK(mse.exit_code == 1);
  CHECK_THAT(mse.err, Catch::Contains("needs regression targets") &&
                          Catch::Contains("the data has class labels"));
}

TEST_CASE("help prints number defaults as typed") {
  const auto help = polyprobe("train --help");
  CHECK_THAT(help.out, Catch::Contains("(=0.15)") && Catch::Contains("(=0.02)") &&
                           !Catch::Contains("0.1499999"));
}

TEST_CASE(
    "train's built-in model: cnn on digits, mlp with --hidden, refused where it cannot apply") {
  // Default on digits: conv, relu, max-pool, flatten, linear with 16 channels (2730 parameters).
  const auto cnn = polyprobe("train --epochs 1 --threads 1");
  REQUIRE(cnn.exit_code == 0);
  CHECK_THAT(cnn.out, Catch::Contains("model: 5 layers, 2730 parameters"));
  CHECK_THAT(cnn.out, Catch::Contains("trained 41 steps"));  // batch 32: ceil(1298 / 32)
  const auto mlp = polyprobe("train --epochs 1 --threads 1 --hidden 8");
  REQUIRE(mlp.exit_code == 0);
  CHECK_THAT(mlp.out, Catch::Contains("model: 4 layers, 610 parameters"));
  CHECK_THAT(mlp.out, Catch::Contains("trained 11 steps"));  // batch 128
  std::string table = "f1,f2,label\n";                       // samples of shape [2]: no image
  for (int i = 0; i < 40; ++i)
    table +=
        std::to_string(i % 7) + "," + std::to_string(i % 3) + "," + std::to_string(i % 2) + "\n";
  const std::string flat = write_file("flat.csv", table);
  struct Bad {
    std::string args;
    const char* says;
  };
  for (const Bad& bad : {
           Bad{"--arch rnn", "--arch must be cnn or mlp, got 'rnn'"},
           Bad{"--arch cnn --hidden 8", "--hidden sizes --arch mlp"},
           Bad{"--arch mlp --channels 8", "--channels sizes --arch cnn"},
           Bad{"--channels 0", "--channels must be positive"},
           Bad{"--model m.json --channels 8", "--channels describes the built-in model"},
           Bad{"--arch cnn --data " + flat, "--arch cnn needs image samples"},
       }) {
    INFO(bad.args);
    const auto r = polyprobe("train " + bad.args);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains(bad.says));
  }
}

TEST_CASE("the training summary names the epoch the progress line showed last") {
  // --patience 1 stops at a validation: with --validate-every 4 at the end of epoch 4 (44 =
  // 4 x 11 steps of the mlp's batch of 128), with 5 one step into epoch 5.
  for (const char* every : {"4", "5"}) {
    INFO("--validate-every " << every);
    const auto r = polyprobe(
        std::string("train --arch mlp --epochs 20 --patience 1 --validate-every ") + every);
    REQUIRE(r.exit_code == 0);
    // Without a terminal the progress is one line per validation: "epoch E/N  step S/T ...".
    const std::string last = r.err.substr(r.err.rfind("epoch ", r.err.size() - 2));
    // "epoch E/N  step S/T": the three numbers (GCC 12's <regex> trips -Wmaybe-uninitialized
    // in the sanitizer build, so this is parsed by hand).
    std::string epoch, epochs, step;
    {
      std::istringstream in(last);
      std::string word, fraction;
      in >> word >> fraction;
      REQUIRE(word == "epoch");
      epoch = fraction.substr(0, fraction.find('/'));
      epochs = fraction.substr(fraction.find('/') + 1);
      in >> word >> fraction;
      REQUIRE(word == "step");
      step = fraction.substr(0, fraction.find('/'));
      REQUIRE(!epoch.empty());
      REQUIRE(!epochs.empty());
      REQUIRE(!step.empty());
    }
    const bool inside = std::string(every) == "5";
    CHECK_THAT(r.out,
               Catch::Contains("trained " + step + " steps (" +
                               (inside ? "epoch " + epoch + "/" + epochs + ": " +
                                             std::to_string(std::stoi(epoch) - 1) + " complete and "
                                       : epoch + " of " + epochs + " epochs, ")));
  }
  const auto full = polyprobe("train --quiet --epochs 2 --batch 512");
  CHECK_THAT(full.out, Catch::Contains("trained 6 steps (2 epochs, "));
  CHECK_THAT(full.out, Catch::Contains(" s (steps "));
  CHECK_THAT(full.out, Catch::Contains(" s, minibatch records "));
}

namespace {

// The cells of a table line: what lies between runs of two or more spaces.
std::vector<std::string> cells(const std::string& line) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < line.size()) {
    const std::size_t gap = line.find("  ", at);
    const std::string cell = line.substr(at, gap == std::string::npos ? gap : gap - at);
    if (!cell.empty()) out.push_back(cell);
    if (gap == std::string::npos) break;
    at = line.find_first_not_of(' ', gap);
  }
  return out;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

}  // namespace

TEST_CASE("bench tables keep their columns apart") {
  const auto r = polyprobe("bench asktell --quiet --repeats 1");
  REQUIRE(r.exit_code == 0);
  const auto table = split_lines(r.out);
  REQUIRE(table.size() == 10);  // the header and 3 sizes x 3 variants
  CHECK(cells(table[0]) == std::vector<std::string>{"workload", "path", "threads", "candidates",
                                                    "cold ms", "median ms", "iqr ms",
                                                    "max rel diff"});
  for (const std::string& row : table) CHECK(cells(row).size() == 8);
}

TEST_CASE("bench scale takes its workloads from --workloads too, never ignoring it") {
  const auto r = polyprobe("bench scale --quiet --repeats 1 --workloads mnist64-full");
  REQUIRE(r.exit_code == 0);
  const auto table = split_lines(r.out);
  REQUIRE(table.size() == 2);  // the header and the one workload
  CHECK(cells(table[1]).front() == "mnist64-full");
  const auto both = polyprobe("bench scale --workloads mnist64-full --scale-workloads mlp256-full");
  CHECK(both.exit_code == 2);
  CHECK_THAT(both.err, Catch::Contains("give the workloads once"));
  const auto unknown = polyprobe("bench scale --workloads no-such-workload");
  CHECK(unknown.exit_code != 0);
  CHECK_THAT(unknown.err, Catch::Contains("unknown workload 'no-such-workload'"));
}

TEST_CASE("bench step times rotations drawn by the host and, where it can, the backend") {
  const std::string json = std::string(POLYPROBE_TEST_TMP) + "/rotations.json";
  std::filesystem::create_directories(POLYPROBE_TEST_TMP);
  const auto r = polyprobe(
      "bench step --quiet --workloads mlp64-full --bench-threads 1 --repeats 1 --no-peak "
      "--regimes step@train --rotations host,device --transports device,host --json " +
      json);
  REQUIRE(r.exit_code == 0);
  std::ifstream in(json);
  const auto records = nlohmann::json::parse(in).at("records");
  // host transport: host rotations only (the backend draws only where it solves); device
  // transport: both, and cpu_tbb draws none, so the record says the host drew them.
  std::vector<std::string> paths;
  for (const auto& record : records) {
    paths.push_back(record.at("path").get<std::string>());
    CHECK(record.at("rotations") == "host");
  }
  CHECK(paths == std::vector<std::string>{"step@train+host-rotations", "step@train",
                                          "step@train+host-transport"});
  const auto unknown = polyprobe("bench step --rotations sideways --workloads mlp64-full");
  CHECK(unknown.exit_code != 0);
  CHECK_THAT(unknown.err, Catch::Contains("--rotations: unknown 'sideways' (host, device)"));
}

TEST_CASE("bench suites refuse another suite's options, naming the suites that read them") {
  // Each would otherwise run on its own defaults: forward would time the CPU.
  const auto device = polyprobe("bench forward --bench-device cuda");
  CHECK(device.exit_code == 2);
  CHECK_THAT(device.err, Catch::Contains("--bench-device is not an option of `bench forward`") &&
                             Catch::Contains("read by: step, accumulate"));
  const auto repeats = polyprobe("bench dfo --repeats 3");
  CHECK(repeats.exit_code == 2);
  CHECK_THAT(repeats.err, Catch::Contains("--repeats is not an option of `bench dfo`"));
  const auto threads = polyprobe("bench asktell --scale-threads 2");
  CHECK(threads.exit_code == 2);
  CHECK_THAT(threads.err, Catch::Contains("(it is read by: scale)"));
  const auto paths = polyprobe("bench scale --paths sparse");
  CHECK(paths.exit_code == 2);
  CHECK_THAT(paths.err, Catch::Contains("--paths is not an option of `bench scale`"));
}

TEST_CASE("bench suites run on the options they declare, shared ones given explicitly") {
  // A suite sees only its own options and those it declares it shares (BenchSuite::shared):
  // reading another would fail here rather than quietly take a default.
  for (const char* command :
       {"bench forward --quiet --workloads mlp64-full --bench-threads 1 --bench-backend cpu_tbb "
        "--repeats 1",
        "bench step --quiet --workloads mlp64-full --bench-threads 1 --bench-backend cpu_tbb "
        "--bench-device cpu --repeats 1 --no-peak --regimes evaluation --parity-sample 8",
        "bench accumulate --quiet --accumulate-keys 100 --bench-threads 1 --bench-backend cpu_tbb "
        "--bench-device cpu --repeats 1"}) {
    INFO(command);
    const auto r = polyprobe(command);
    CHECK(r.exit_code == 0);
    CHECK(r.err.empty());
    CHECK(split_lines(r.out).size() >= 2);  // the header and a record
  }
}

TEST_CASE("bench dfo closes with one row per run, not the profiles again") {
  const auto r = polyprobe(
      "bench dfo --quiet --dfo-problems rosenbrock --dfo-max-n 10 "
      "--dfo-solvers polyprobe-tr-dn,nlopt-sbplx");
  REQUIRE(r.exit_code == 0);
  const auto text = split_lines(r.out);
  const auto runs = std::find_if(text.begin(), text.end(),
                                 [](const std::string& l) { return l.starts_with("runs"); });
  REQUIRE(runs != text.end());
  REQUIRE(std::distance(runs, text.end()) == 6);  // the title, the header, 2 problems x 2
  CHECK(cells(runs[1]) == std::vector<std::string>{"problem", "solver", "seed", "evaluations", "f0",
                                                   "best", "f_L", "solved at 1e-3",
                                                   "solved at 1e-5", "stop", "ms"});
  for (auto row = runs + 2; row != text.end(); ++row) {
    INFO(*row);
    const auto c = cells(*row);
    REQUIRE(c.size() == 11);
    CHECK_THAT(c[0], Catch::StartsWith("rosenbrock-"));
    CHECK(std::stoi(c[3]) > 0);                // evaluations
    CHECK(std::stod(c[4]) > 0);                // f0 of Rosenbrock's start
    CHECK(std::stod(c[5]) < std::stod(c[4]));  // best
  }
}

TEST_CASE("train offers the whole optimizer: subspaces, blocks, probes, momentum, screens") {
  // Each runs two epochs on digits and ends with the test accuracy.
  const std::vector<std::pair<std::string, std::string>> runs = {
      {"--subspace hybrid --subspace-rank 4 --step-radius 1", "subspace hybrid ("},
      {"--subspace factored --subspace-rank 2", "subspace factored ("},
      {"--blocks per_layer --solver softmax --num-probe 2", ""},
      {"--momentum --radius-model fixed --amortize-steps 2", ""},
      {"--radius-model fixed --multifidelity-screen --screen-fidelity 0.2", ""},
  };
  for (const auto& [args, says] : runs) {
    INFO(args);
    const auto r = polyprobe("train --epochs 2 --quiet " + args);
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.out, Catch::Contains("test accuracy: ") && Catch::Contains(says));
  }
  // The same options from a config file.
  const std::string config =
      write_file("optimizer.ini", "epochs = 1\nsubspace = hybrid\nmax-subspace-dim = 300\n");
  const auto from_file = polyprobe("train --quiet --config " + config);
  CHECK(from_file.exit_code == 0);
  CHECK_THAT(from_file.out, Catch::Contains("subspace hybrid (300 coordinates)"));
}

TEST_CASE("an invalid optimizer combination in train is one line naming the rule, exit 2") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--top-k 3", "--top-k has no effect here: it applies with --solver top_k"},
      {"--subspace-rank 4", "--subspace-rank has no effect here"},
      {"--adaptive-probes", "adaptive_probes cannot run with the quadratic"},
      {"--radius-model trust_region", "trust_region needs one fixed objective"},
      {"--subspace spectral", "unknown subspace kind 'spectral' (kinds: full, hybrid, factored)"},
      {"--num-probe two", "--num-probe: expected an integer, got 'two'"},
      {"--momentum=maybe", "--momentum: expected on or off"},
      {"--radius-options {}x", "--radius-options has no effect here"},
      {"--schedule-clock time", "add --time-limit SECONDS"},
      {"--schedule-clock wall --time-limit 5", "--schedule-clock: unknown clock 'wall'"},
      {"--schedule-clock time --time-limit 5 --schedule power",
       "--schedule-clock time has no effect with --schedule power"},
  };
  for (const auto& [args, says] : cases) {
    INFO(args);
    const auto r = polyprobe("train --epochs 1 " + args);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::StartsWith("polyprobe train: error: ") && Catch::Contains(says));
    CHECK(lines(r.err) == 1);
    CHECK(r.out.empty());
  }
  const std::string config = write_file("combination.ini", "top-k = 3\n");
  const auto from_file = polyprobe("train --config " + config);
  CHECK(from_file.exit_code == 2);
  CHECK_THAT(from_file.err, Catch::Contains("--top-k has no effect here"));
}

TEST_CASE("train --help groups the optimizer options") {
  const auto help = polyprobe("train --help");
  REQUIRE(help.exit_code == 0);
  for (const char* group :
       {"optimizer: subspace:", "optimizer: particles and polytope:",
        "optimizer: radii and schedule:", "optimizer: transport:", "optimizer: blocks:",
        "optimizer: momentum:", "optimizer: budget controls:"})
    CHECK_THAT(help.out, Catch::Contains(group));
  CHECK_THAT(help.out, Catch::Contains("--num-probe N (=1)") &&
                           Catch::Contains("needs --solver top_k") &&
                           !Catch::Contains("--trust-min"));
}

TEST_CASE("bench dfo --dfo-config reads the option table's keys") {
  const auto unknown = polyprobe("bench dfo --dfo-config no_such_key=1");
  CHECK(unknown.exit_code == 2);
  CHECK_THAT(unknown.err, Catch::Contains("--dfo-config: unknown optimizer option 'no_such_key'"));
  const auto training = polyprobe("bench dfo --dfo-config subspace=hybrid");
  CHECK(training.exit_code == 2);
  CHECK_THAT(training.err, Catch::Contains("--subspace applies to polyprobe train only"));
  const auto ignored = polyprobe("bench dfo --dfo-config radius=quadratic,trust_min=0.1");
  CHECK(ignored.exit_code == 2);
  CHECK_THAT(ignored.err, Catch::Contains("--trust-min has no effect here"));
}

TEST_CASE("bench --json and report -o into a missing folder fail naming it, leaving nothing") {
  const std::string missing = std::string(POLYPROBE_TEST_TMP) + "/no-such-folder";
  std::filesystem::remove_all(missing);
  const auto bench = polyprobe(
      "bench dfo --quiet --dfo-problems beale --dfo-threads 1 --dfo-seeds 1 "
      "--dfo-solvers polyprobe-default --json " +
      missing + "/dfo.json");
  CHECK(bench.exit_code == 1);
  CHECK_THAT(bench.err, Catch::Contains("the folder '" + missing + "' does not exist"));
  const std::string metrics = std::string(POLYPROBE_TEST_TMP) + "/for-report.jsonl";
  REQUIRE(polyprobe("train --quiet --epochs 1 --metrics " + metrics).exit_code == 0);
  const auto report = polyprobe("report " + metrics + " -o " + missing + "/r.html");
  CHECK(report.exit_code == 1);
  CHECK_THAT(report.err, Catch::Contains("the folder '" + missing + "' does not exist"));
  CHECK(!std::filesystem::exists(missing));
}

TEST_CASE("a metrics file that is a device is refused before the run, naming it") {
  // /dev/full opens for writing and fails every write: polyprobe never writes through a
  // device, so it is refused before any work (a full disk is caught at the record it loses).
  if (!std::filesystem::exists("/dev/full")) {
    WARN("no /dev/full on this system: not checked");
    return;
  }
  const auto r = polyprobe("train --quiet --epochs 1 --metrics /dev/full");
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("the --metrics file '/dev/full': it is a character device"));
  CHECK(r.out.empty());
}

TEST_CASE("the metrics file ends with the restored state's test result") {
  const std::string path = std::string(POLYPROBE_TEST_TMP) + "/final-test.jsonl";
  std::filesystem::create_directories(POLYPROBE_TEST_TMP);
  std::filesystem::remove(path);
  const auto r = polyprobe("train --quiet --epochs 2 --metrics " + path);
  REQUIRE(r.exit_code == 0);
  std::ifstream file(path);
  std::string line, last;
  while (std::getline(file, line)) last = line;
  const nlohmann::json record = nlohmann::json::parse(last);
  CHECK(record.at("split") == "test");
  // The accuracy printed last is the recorded one, rounded.
  const std::string printed = r.out.substr(r.out.rfind("test accuracy: ") + 15);
  CHECK(std::abs(100 * record.at("accuracy").get<double>() - std::stod(printed)) <= 0.05);
  CHECK(record.at("seconds").get<double>() > 0);
  CHECK(record.at("restored_step").get<int64_t>() <= record.at("step").get<int64_t>());
  // `polyprobe report` draws the file (the test record is not a step).
  const auto report = polyprobe("report " + path + " -o " + path + ".html");
  CHECK(report.exit_code == 0);

  // --metrics-test: every validation record carries the best state's test accuracy, and the
  // last one is the restored state's, the one the run ends with.
  std::filesystem::remove(path);
  const auto tracked = polyprobe("train --quiet --epochs 3 --metrics " + path + " --metrics-test");
  REQUIRE(tracked.exit_code == 0);
  std::ifstream again(path);
  std::vector<nlohmann::json> validations;
  nlohmann::json final_test;
  while (std::getline(again, line)) {
    const nlohmann::json rec = nlohmann::json::parse(line);
    if (rec.value("split", "") == "validation") validations.push_back(rec);
    if (rec.value("split", "") == "test") final_test = rec;
  }
  REQUIRE(validations.size() == 3);
  for (const nlohmann::json& v : validations) CHECK(v.contains("best_test_accuracy"));
  CHECK(validations.back().at("best_test_accuracy") == final_test.at("accuracy"));
  const auto alone = polyprobe("train --quiet --epochs 1 --metrics-test");
  CHECK(alone.exit_code == 2);
  CHECK_THAT(alone.err,
             Catch::Contains("--metrics-test writes into the metrics file: add --metrics"));
}

// The configurations the docs recommend are files users run as they are: each must be
// accepted whole and train (a second of it), and the recommended one is the documented cnn.
TEST_CASE("the example configs train as the docs describe them") {
  const char* env = std::getenv("POLYPROBE_FASHION_MNIST_DIR");
  const std::filesystem::path data =
      env != nullptr && *env != '\0' ? env : "/usr/share/datasets/fashion-mnist";
  if (!std::filesystem::exists(data)) {
    std::cerr << "skipped: the example configs train on Fashion-MNIST, not found at " << data
              << " (Debian: apt-get install dataset-fashion-mnist)\n";
    std::exit(77);
  }
  // From the repository root, as the configs say to run them (their model paths are relative).
  std::filesystem::current_path(std::filesystem::path(POLYPROBE_EXAMPLE_CONFIG_DIR) / ".." / "..");
  int configs = 0;
  for (const auto& entry : std::filesystem::directory_iterator(POLYPROBE_EXAMPLE_CONFIG_DIR)) {
    if (entry.path().extension() != ".ini") continue;
    ++configs;
    INFO(entry.path());
    const auto r = polyprobe("train --quiet --config " + entry.path().string() +
                             " --time-limit 1 --validate-every 1000000");
    CHECK(r.exit_code == 0);
    CHECK(r.err.empty());
    CHECK_THAT(r.out, Catch::Contains("test accuracy: "));
    if (entry.path().filename() == "fashion-mnist.ini")
      CHECK_THAT(r.out, Catch::Contains("model: 5 layers, 31530 parameters"));
  }
  CHECK(configs >= 3);
}

TEST_CASE("bench cheri runs on the cuda plugin only, and says so") {
  const auto cpu = polyprobe("bench cheri");
  CHECK(cpu.exit_code == 2);
  CHECK_THAT(cpu.err, Catch::Contains("pass --bench-device cuda"));
  const auto batches = polyprobe("bench cheri --bench-device cuda --cheri-batches 16,x");
  CHECK(batches.exit_code == 2);
  CHECK_THAT(batches.err, Catch::Contains("--cheri-batches"));
  // Without a GPU the plugin is unavailable; with one, a batch of 0 is refused before any
  // work: a one-line error and exit 1 either way.
  const auto empty = polyprobe("bench cheri --bench-device cuda --cheri-batches 0");
  CHECK(empty.exit_code == 1);
  CHECK_THAT(empty.err, Catch::Contains("unavailable here") || Catch::Contains("no plugin named") ||
                            Catch::Contains("batch sizes must be positive"));
  CHECK(lines(empty.err) == 1);
}

namespace {

namespace fs = std::filesystem;

// A fresh folder under the test's temporary folder.
fs::path fresh_folder(const std::string& name) {
  const fs::path dir = fs::path(POLYPROBE_TEST_TMP) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string slurp(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::stringstream s;
  s << file.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("outputs that are not regular files are refused before any work and left as they are") {
  const fs::path dir = fresh_folder("not-regular");
  const fs::path fifo = dir / "fifo";
  REQUIRE(std::system(("mkfifo " + fifo.string()).c_str()) == 0);
  // A link to the null device: the run must neither replace the link nor write through it.
  const fs::path null_link = dir / "null-link";
  fs::create_symlink("/dev/null", null_link);
  for (const fs::path& target : {fifo, null_link}) {
    INFO(target);
    const auto save = polyprobe("train --quiet --epochs 1 --save " + target.string());
    CHECK(save.exit_code == 1);
    CHECK_THAT(save.err, Catch::Contains("refusing to write the --save file '" + target.string()) &&
                             Catch::Contains("polyprobe writes only regular files"));
    CHECK(save.out.empty());  // refused before the data is even read
    CHECK_FALSE(fs::exists(target.string() + ".json"));
    CHECK_FALSE(fs::exists(target.string() + ".ckpt"));
  }
  CHECK(fs::is_fifo(fs::symlink_status(fifo)));
  CHECK(fs::is_symlink(fs::symlink_status(null_link)));
  CHECK(fs::is_character_file(fs::status("/dev/null")));
  // As inputs, a FIFO would block the open until a writer came: refused at once (`timeout`
  // ends a regression that waits).
  const fs::path fifo_csv = dir / "data.csv";
  REQUIRE(std::system(("mkfifo " + fifo_csv.string()).c_str()) == 0);
  const std::string bounded = "timeout 30 env POLYPROBE_PLUGIN_PATH= " + exe;
  const auto data = run_process(bounded + " train --quiet --epochs 1 --data " + fifo_csv.string());
  CHECK(data.exit_code == 1);
  CHECK_THAT(data.err, Catch::Contains("'" + fifo_csv.string() + "' is not a regular file"));
  const auto read_fifo =
      run_process(bounded + " report " + fifo.string() + " -o " + (dir / "r.html").string());
  CHECK(read_fifo.exit_code == 1);
  CHECK_THAT(read_fifo.err, Catch::Contains("is not a regular file"));
  const std::string metrics = write_file("not-regular.jsonl", "{\"step\":1,\"seconds\":1}\n");
  const auto report = polyprobe("report " + metrics + " -o " + fifo.string());
  CHECK(report.exit_code == 2);
  CHECK_THAT(report.err,
             Catch::Contains("refusing to write the -o file") && Catch::Contains("a FIFO"));
  CHECK(fs::is_fifo(fs::symlink_status(fifo)));
}

TEST_CASE("an empty output name is refused, not ignored") {
  for (const char* option : {"save", "metrics", "checkpoint"}) {
    INFO(option);
    const auto r = polyprobe(std::string("train --quiet --epochs 1 --") + option + " ''");
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains(std::string("--") + option +
                                      " needs a file name, got an empty one"));
  }
}

TEST_CASE("a read-only output file and a loaded plugin are refused, unchanged") {
  const fs::path dir = fresh_folder("protected-outputs");
  const fs::path read_only = dir / "kept.safetensors";
  std::ofstream(read_only) << "precious";
  fs::permissions(read_only,
                  fs::perms::owner_read | fs::perms::group_read | fs::perms::others_read);
  const auto r = polyprobe("train --quiet --epochs 1 --save " + read_only.string());
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("it is read-only"));
  CHECK(slurp(read_only) == "precious");
  CHECK((fs::status(read_only).permissions() & fs::perms::owner_write) == fs::perms::none);

  // A plugin this very run loaded (copied, so the fixture itself is never at risk).
  const fs::path plugins = dir / "plugins";
  fs::create_directories(plugins);
  const fs::path plugin = plugins / "libpolyprobe_fixture_nan_layer.so";
  fs::copy_file(fs::path(POLYPROBE_FIXTURE_PLUGIN_DIR) / plugin.filename(), plugin);
  const std::string before = slurp(plugin);
  const auto onto_plugin = polyprobe("train --quiet --epochs 1 --plugin-dir " + plugins.string() +
                                     " --metrics " + plugin.string());
  CHECK(onto_plugin.exit_code == 1);
  CHECK_THAT(onto_plugin.err, Catch::Contains("a shared library in use by this process"));
  CHECK(slurp(plugin) == before);
}

TEST_CASE("a run whose outputs another process is writing is refused, naming the lock") {
  const fs::path dir = fresh_folder("locked-outputs");
  const fs::path save = dir / "run.safetensors";
  // `flock` holds the lock file as a second polyprobe run would for its whole run.
  const auto r = run_process("flock " + (dir / ".run.safetensors.lock").string() +
                             " env POLYPROBE_PLUGIN_PATH= " + exe +
                             " train --quiet --epochs 1 --save " + save.string());
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err,
             Catch::Contains("another process is writing the --save file '" + save.string() + "'"));
  CHECK_FALSE(fs::exists(save));
  // Alone, the run takes the lock, and leaves no lock file behind.
  CHECK(polyprobe("train --quiet --epochs 1 --batch 512 --save " + save.string()).exit_code == 0);
  CHECK(fs::exists(save));
  CHECK_FALSE(fs::exists(dir / ".run.safetensors.lock"));
}

TEST_CASE("a run that fails on non-finite losses saves its best validated state and says so") {
  const fs::path dir = fresh_folder("failed-run");
  const fs::path plugins = dir / "plugins";
  fs::create_directories(plugins);
  fs::copy_file(fs::path(POLYPROBE_FIXTURE_PLUGIN_DIR) / "libpolyprobe_fixture_nan_layer.so",
                plugins / "libpolyprobe_fixture_nan_layer.so");
  // nan_shift turns NaN once a step moves its shifts: every step is reverted, and after the
  // limit of reverted steps in a row the run gives up, validated after every step.
  const std::string model = write_file(
      "nan-model.json",
      R"({"polyprobe_model": 1, "input_shape": [64], "layers": [)"
      R"({"kind": "nan_shift", "max_moved": 2}, {"kind": "linear", "out_features": 10}]})");
  const fs::path save = dir / "best.safetensors";
  const std::string common = "--quiet --plugin-dir " + plugins.string();
  const auto r = polyprobe("train " + common + " --model " + model +
                           " --epochs 3 --batch 100 --validate-every 1 --save " + save.string());
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("steps in a row made the training loss non-finite") &&
                        Catch::Contains("saved the best validated weights (validation accuracy") &&
                        Catch::Contains("step 1)") && Catch::Contains(save.string()) &&
                        Catch::Contains("would repeat the same steps"));
  REQUIRE(fs::exists(save));
  const auto evaluated = polyprobe("eval " + common + " --weights " + save.string());
  CHECK(evaluated.exit_code == 0);
  CHECK_THAT(evaluated.out, Catch::Contains("test accuracy: "));
  // The checkpoint is not weights: eval says what it is.
  const auto checkpoint = polyprobe("eval " + common + " --weights " + save.string() + ".ckpt");
  CHECK(checkpoint.exit_code == 1);
  CHECK_THAT(checkpoint.err, Catch::Contains("is a polyprobe training checkpoint, not a weights"));
}

TEST_CASE("configuration that would be ignored or unbounded is refused, naming it") {
  const fs::path dir = fresh_folder("config-inputs");
  const auto folder = polyprobe("train --epochs 1 --config " + dir.string());
  CHECK(folder.exit_code == 2);
  CHECK_THAT(folder.err, Catch::Contains("is a folder; --config takes a file"));
  // A device that never ends: refused before reading (the memory limit keeps a regression
  // from taking the machine's memory).
  const fs::path zero = dir / "zero";
  fs::create_symlink("/dev/zero", zero);
  const auto endless = run_process(memory_capped() + "POLYPROBE_PLUGIN_PATH= " + exe +
                                   " train --config " + zero.string());
  CHECK(endless.exit_code == 2);
  CHECK_THAT(endless.err, Catch::Contains("is not a regular file"));
  const std::string nested = write_file("nested.ini", "epochs = 1\nconfig = other.ini\n");
  const auto include = polyprobe("train --config " + nested);
  CHECK(include.exit_code == 2);
  CHECK_THAT(include.err, Catch::Contains("line 2: a config file cannot name another"));
  const auto seed = polyprobe("train --seed -1 --epochs 1");
  CHECK(seed.exit_code == 2);
  CHECK_THAT(seed.err, Catch::Contains("--seed must be >= 0, got -1"));
}

TEST_CASE("huge values are not echoed whole, and huge keys are refused at once") {
  const auto seconds_of = [](const auto& body) {
    const auto start = std::chrono::steady_clock::now();
    body();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const std::string value(100000, '7');
  ProcessResult r;
  CHECK(seconds_of([&] { r = polyprobe("train --epochs x" + value); }) < 5);
  CHECK(r.exit_code == 2);
  CHECK(r.err.size() < 3000);
  CHECK_THAT(r.err, Catch::Contains("characters left out"));
  CHECK(seconds_of([&] { r = polyprobe("train --" + std::string(100000, 'k')); }) < 5);
  CHECK(r.exit_code == 2);
  CHECK(r.err.size() < 3000);
  const std::string long_line = write_file("long-key.ini", std::string(5000, 'k') + " = 1\n");
  r = polyprobe("train --config " + long_line);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("line 1: the line is 5004 characters long"));
  CHECK(r.err.size() < 3000);
  const std::string huge = write_file("huge-key.ini", std::string(10'000'000, 'k') + " = 1\n");
  CHECK(seconds_of([&] { r = polyprobe("train --config " + huge); }) < 5);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("is 10000005 bytes, more than the limit of 1048576"));
}

TEST_CASE(
    "report: an overflowing number names its line, and huge finite values draw finite charts") {
  const std::string overflow = write_file("overflow.jsonl",
                                          "{\"step\":1,\"seconds\":1}\n"
                                          "{\"step\":2,\"seconds\":1e999}\n");
  const auto r = polyprobe("report " + overflow + " -o " + overflow + ".html");
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("line 2: a number is too large"));
  const std::string huge = write_file("huge.jsonl",
                                      "{\"step\":1,\"seconds\":1,\"loss\":1e308}\n"
                                      "{\"step\":2,\"seconds\":2,\"loss\":-1.7e308}\n"
                                      "{\"step\":3,\"seconds\":1e308,\"loss\":0.5}\n");
  const auto drawn = polyprobe("report " + huge + " -o " + huge + ".html");
  REQUIRE(drawn.exit_code == 0);
  const std::string page = slurp(huge + ".html");
  CHECK(page.find("nan") == std::string::npos);
  CHECK(page.find("inf") == std::string::npos);
}

TEST_CASE("sizes too large for the machine are refused before allocating, naming the option") {
  const auto channels = polyprobe("train --quiet --epochs 1 --channels 100000000");
  CHECK(channels.exit_code == 2);
  CHECK_THAT(channels.err, Catch::Contains("--channels 100000000 gives the built-in cnn") &&
                               Catch::Contains("choose a smaller --channels"));
  CHECK_THAT(channels.err, !Catch::Contains("bad_alloc"));
  // The candidates of a step are known once the optimizer exists (the memory limit keeps a
  // regression from taking the machine's memory).
  const auto probes = run_process(memory_capped() + "POLYPROBE_PLUGIN_PATH= " + exe +
                                  " train --quiet --epochs 1 --num-probe 1000000");
  CHECK(probes.exit_code == 2);
  CHECK_THAT(probes.err, Catch::Contains("candidates (--num-probe 1000000") &&
                             Catch::Contains("lower --num-probe or --batch"));
}

TEST_CASE("eval fails on a loss that is not finite, and a CSV byte-order mark is not data") {
  const fs::path dir = fresh_folder("eval-nonfinite");
  const fs::path weights = dir / "w.safetensors";
  REQUIRE(polyprobe("train --quiet --epochs 1 --arch mlp --hidden 4 --batch 512 --save " +
                    weights.string())
              .exit_code == 0);
  // Features so large that the model's outputs overflow.
  std::string csv = "\xEF\xBB\xBF";
  for (int row = 0; row < 10; ++row) {
    for (int i = 0; i < 64; ++i) csv += (i % 2 ? "-1e300," : "1e300,");
    csv += std::to_string(row) + "\n";
  }
  const std::string data = write_file("overflow.csv", csv);
  const auto r =
      polyprobe("eval --weights " + weights.string() + " --data " + data + " --split all");
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("loss is"));
  // The byte-order mark did not turn the first row into a header: all 10 rows are evaluated.
  CHECK_THAT(r.out, Catch::Contains("all split, 10 samples"));
}

TEST_CASE("plugin search says when a plugin shadows the shipped one and when its folder is open") {
  const fs::path dir = fresh_folder("shadowing-plugins");
  const fs::path shipped =
      (fs::path(exe).parent_path() / "../lib/polyprobe/plugins/libpolyprobe_cpu_tbb.so")
          .lexically_normal();
  if (!fs::exists(shipped)) {
    WARN("the shipped cpu_tbb plugin is not built: not checked");
    return;
  }
  // The same plugin under another file name, found first: the shipped file is not loaded.
  fs::copy_file(shipped, dir / "libpolyprobe_cpu_tbb_copy.so");
  fs::permissions(dir, fs::perms::others_write, fs::perm_options::add);
  const auto r = polyprobe("plugins --plugin-dir " + dir.string());
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.err, Catch::Contains("warning: plugin 'cpu_tbb' from " +
                                    (dir / "libpolyprobe_cpu_tbb_copy.so").string() +
                                    " shadows the plugin of that name at"));
  CHECK_THAT(r.err, Catch::Contains("warning: plugin folder '" + dir.string() +
                                    "' is writable by every user"));
  // A relative entry of POLYPROBE_PLUGIN_PATH is ignored, with a warning.
  const auto relative = polyprobe("plugins", "POLYPROBE_PLUGIN_PATH=.");
  CHECK(relative.exit_code == 0);
  CHECK_THAT(relative.err, Catch::Contains("POLYPROBE_PLUGIN_PATH entry '.' is a relative path"));
  fs::permissions(dir, fs::perms::others_write, fs::perm_options::remove);
}
