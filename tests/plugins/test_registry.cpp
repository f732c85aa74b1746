// The registry against real misbehaving plugins: each failure is recorded with its reason,
// never thrown, and never stops the other plugins from loading.
#include <polyprobe/error.hpp>
#include <polyprobe/evaluator.hpp>
#include <polyprobe/loss.hpp>
#include <polyprobe/model.hpp>
#include <polyprobe/registry.hpp>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

using namespace polyprobe;

namespace {

const PluginInfo* by_file(const PluginRegistry& registry, const std::string& stem) {
  for (const PluginInfo& info : registry.plugins())
    if (info.path.filename() == "libpolyprobe_" + stem + ".so") return &info;
  return nullptr;
}

PluginRegistry& fixtures() {
  static PluginRegistry registry;
  static bool loaded = false;
  if (!loaded) {
    registry.load_directories(
        {POLYPROBE_FIXTURE_PLUGIN_DIR, PluginRegistry::executable_plugin_dir()});
    loaded = true;
  }
  return registry;
}

Model tiny_mlp() {
  LayerFactory factory = LayerFactory::with_builtins();
  Model model(Shape{{3}});
  model.add(factory.create("linear", {{"out_features", 4}}, model.output_shape()));
  model.add(factory.create("relu", {}, model.output_shape()));
  model.add(factory.create("linear", {{"out_features", 2}}, model.output_shape()));
  model.initialize(1);
  return model;
}

}  // namespace

TEST_CASE("a well-formed plugin loads and is available") {
  const PluginInfo* ok = by_file(fixtures(), "ok");
  REQUIRE(ok != nullptr);
  CHECK(ok->loaded);
  CHECK(ok->available);
  CHECK(ok->name == "fixture_ok");
  CHECK(ok->abi == PP_PLUGIN_API_VERSION);
  CHECK(ok->score == 5);
  CHECK(ok->reason.empty());
  REQUIRE(ok->capabilities.size() == 1);
  CHECK(ok->capabilities[0].component == "evaluator");
}

TEST_CASE("every broken plugin is recorded with its reason and the others still load") {
  struct Case {
    const char* file;
    const char* reason_part;
  };
  const Case cases[] = {
      {"wrong_abi", "built against plugin API 1; this polyprobe is API 3: rebuild it"},
      {"api2",
       "it was built against plugin API 2; this polyprobe is API 3: rebuild it against the "
       "installed package"},
      {"bad_device", "has no valid device (type gpu, name 'Not A Name')"},
      {"declines", "declined this host's plugin API version"},
      {"throws", "entry function threw: fixture entry exploded"},
      {"no_device", "unusable on this machine: no CUDA device is present"},
      {"no_entry", "does not export polyprobe_plugin_entry"},
      {"not_a_library", "not a shared library (invalid ELF header)"},
      {"bad_name", "no valid name"},
  };
  for (const Case& c : cases) {
    INFO(c.file);
    const PluginInfo* info = by_file(fixtures(), c.file);
    REQUIRE(info != nullptr);
    CHECK_FALSE(info->available);
    CHECK_THAT(info->reason, Catch::Contains(c.reason_part));
  }
  // The real plugin still loaded beside the broken ones.
  const PluginInfo* cpu = fixtures().find("cpu_tbb");
  REQUIRE(cpu != nullptr);
  CHECK(cpu->available);
}

TEST_CASE("a file that is not a shared library gets a clean reason, not Boost's errno") {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("polyprobe_not_elf_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream(dir / "libpolyprobe_text.so") << "this is text, not an ELF shared object\n";
    std::ofstream(dir / "libpolyprobe_short_elf.so", std::ios::binary) << "\x7f"
                                                                          "ELF";
    // An ELF header and nothing behind it: dlopen's own reason, unwrapped.
    std::string body =
        "\x7f"
        "ELF";
    body.resize(256, '\0');
    std::ofstream(dir / "libpolyprobe_broken_elf.so", std::ios::binary) << body;
  }
  PluginRegistry registry;
  registry.load_directories({dir});
  std::filesystem::remove_all(dir);
  const PluginInfo* text = by_file(registry, "text");
  const PluginInfo* short_elf = by_file(registry, "short_elf");
  const PluginInfo* broken = by_file(registry, "broken_elf");
  REQUIRE(text != nullptr);
  REQUIRE(short_elf != nullptr);
  REQUIRE(broken != nullptr);
  CHECK(text->reason == "not a shared library (invalid ELF header)");
  CHECK(short_elf->reason == "not a shared library (truncated ELF header)");
  CHECK_THAT(broken->reason, Catch::StartsWith("cannot load the library: "));
  for (const PluginInfo* info : {text, short_elf, broken}) {
    CHECK_FALSE(info->available);
    CHECK_THAT(info->reason, !Catch::Contains("Bad file descriptor") &&
                                 !Catch::Contains("boost::") && !Catch::Contains("dlerror") &&
                                 !Catch::Contains(dir.string()));
  }
}

TEST_CASE("a layer declared as a capability and shipped as a layer kind is listed once") {
  const PluginInfo* info = by_file(fixtures(), "layer_caps");
  REQUIRE(info != nullptr);
  CHECK(info->available);
  int layers = 0;
  for (const CapabilityInfo& c : info->capabilities)
    if (c.component == "layer" && c.name == "fixture_double") {
      ++layers;
      CHECK(c.summary == "y = 2 x");  // completed from the layer kind
    }
  CHECK(layers == 1);
}

TEST_CASE("two plugins with the same name: the first found wins, the second says why") {
  const PluginInfo* a = by_file(fixtures(), "dup_a");
  const PluginInfo* b = by_file(fixtures(), "dup_b");
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  CHECK(a->available);
  CHECK_FALSE(b->available);
  CHECK_THAT(b->reason, Catch::Contains("duplicate") && Catch::Contains("dup_a"));
}

TEST_CASE("the same file reached twice is loaded once") {
  PluginRegistry registry;
  registry.load_directories({POLYPROBE_FIXTURE_PLUGIN_DIR, POLYPROBE_FIXTURE_PLUGIN_DIR});
  int count = 0;
  for (const PluginInfo& info : registry.plugins())
    count += info.path.filename() == "libpolyprobe_ok.so";
  CHECK(count == 1);
}

TEST_CASE("the search path puts explicit directories first, then the environment, never the cwd") {
  ::setenv("POLYPROBE_PLUGIN_PATH", "/env/a::/env/b:", 1);
  const auto dirs = PluginRegistry::search_path({"/explicit"});
  ::unsetenv("POLYPROBE_PLUGIN_PATH");
  REQUIRE(dirs.size() >= 3);
  CHECK(dirs[0] == "/explicit");
  CHECK(dirs[1] == "/env/a");
  CHECK(dirs[2] == "/env/b");
  for (const auto& dir : dirs) CHECK_FALSE(dir.empty());
  // The last entry is the executable's own plugin folder.
  CHECK(dirs.back() == PluginRegistry::executable_plugin_dir());
}

TEST_CASE("relative POLYPROBE_PLUGIN_PATH entries are ignored with a warning") {
  ::setenv("POLYPROBE_PLUGIN_PATH", ".:/env/a:plugins", 1);
  std::vector<std::string> warnings;
  const auto dirs = PluginRegistry::search_path({"/explicit"}, &warnings);
  ::unsetenv("POLYPROBE_PLUGIN_PATH");
  for (const auto& dir : dirs) CHECK(dir.is_absolute());
  CHECK(dirs[1] == "/env/a");
  REQUIRE(warnings.size() == 2);
  CHECK_THAT(warnings[0],
             Catch::Contains("entry '.' is a relative path") && Catch::Contains("ignored"));
  CHECK_THAT(warnings[1], Catch::Contains("entry 'plugins' is a relative path"));
}

TEST_CASE("a plugin folder anyone may write, and a plugin shadowing another, are warned of") {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("polyprobe-open-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // The fixture plugin "fixture_ok" under another file name, in a folder open to all.
  std::filesystem::copy_file(
      std::filesystem::path(POLYPROBE_FIXTURE_PLUGIN_DIR) / "libpolyprobe_ok.so",
      dir / "libpolyprobe_ok_copy.so");
  std::filesystem::permissions(dir, std::filesystem::perms::others_write,
                               std::filesystem::perm_options::add);
  PluginRegistry registry;
  registry.load_directories({dir, POLYPROBE_FIXTURE_PLUGIN_DIR});
  std::filesystem::remove_all(dir);
  const auto warned = [&](const std::string& text) {
    return std::any_of(registry.warnings().begin(), registry.warnings().end(),
                       [&](const std::string& w) { return w.find(text) != std::string::npos; });
  };
  CHECK(warned("plugin folder '" + dir.string() + "' is writable by every user"));
  CHECK(warned("plugin 'fixture_ok' from " + (dir / "libpolyprobe_ok_copy.so").string() +
               " shadows the plugin of that name"));
  // The folder of the test's fixtures is not open to all: no warning names it.
  CHECK_FALSE(warned("plugin folder '" + std::string(POLYPROBE_FIXTURE_PLUGIN_DIR) + "'"));
}

TEST_CASE("evaluator selection: automatic, explicit, unknown and unable") {
  const Model model = tiny_mlp();
  const auto loss = make_loss("cross_entropy");

  SECTION("automatic picks the best plugin that can serve and says why") {
    Selection sel;
    auto evaluator = fixtures().make_evaluator(model, *loss, {}, &sel);
    CHECK(sel.chosen == "cpu_tbb");
    CHECK(evaluator->name() == "cpu_tbb");
    bool mentions_no_device = false;
    for (const auto& r : sel.reasons)
      mentions_no_device |= r.find("fixture_no_device") != std::string::npos;
    CHECK(mentions_no_device);
  }
  SECTION("an explicit reference request is honoured") {
    EvaluatorRequest request;
    request.backend = "reference";
    Selection sel;
    auto evaluator = fixtures().make_evaluator(model, *loss, request, &sel);
    CHECK(evaluator->name() == "reference");
  }
  SECTION("an unknown backend is an error naming the known ones") {
    EvaluatorRequest request;
    request.backend = "no_such_backend";
    CHECK_THROWS_WITH(
        fixtures().make_evaluator(model, *loss, request),
        Catch::Contains("unknown backend 'no_such_backend'") && Catch::Contains("cpu_tbb"));
  }
  SECTION("an explicit backend that cannot serve is an error with its reason") {
    EvaluatorRequest request;
    request.backend = "fixture_no_device";
    CHECK_THROWS_WITH(fixtures().make_evaluator(model, *loss, request),
                      Catch::Contains("cannot serve") && Catch::Contains("no CUDA device"));
  }
  SECTION("a plugin without an evaluator API cannot be chosen explicitly") {
    EvaluatorRequest request;
    request.backend = "fixture_ok";
    CHECK_THROWS_WITH(fixtures().make_evaluator(model, *loss, request),
                      Catch::Contains("provides no evaluator"));
  }
  SECTION("with no plugin at all, automatic selection falls back to the reference and says so") {
    PluginRegistry empty;
    Selection sel;
    auto evaluator = empty.make_evaluator(model, *loss, {}, &sel);
    CHECK(sel.chosen == "reference");
    REQUIRE_FALSE(sel.reasons.empty());
    CHECK_THAT(sel.reasons.back(), Catch::Contains("no plugin can serve"));
  }
  SECTION("cuda with no plugin that serves it is an error, not a silent cpu run") {
    // The fixtures alone: the shipped cuda plugin would serve it on a machine with a GPU.
    PluginRegistry fixtures_only;
    fixtures_only.load_directories({POLYPROBE_FIXTURE_PLUGIN_DIR});
    EvaluatorRequest request;
    request.device = "cuda";
    CHECK_THROWS_WITH(fixtures_only.make_evaluator(model, *loss, request),
                      Catch::Contains("no plugin can evaluate on cuda"));
  }
  SECTION("an unknown device is an error that lists the known ones") {
    EvaluatorRequest request;
    request.device = "tpu";
    CHECK_THROWS_WITH(fixtures().make_evaluator(model, *loss, request),
                      Catch::Contains("unknown device 'tpu' (known: cpu, cuda, fakeaccel)") &&
                          Catch::Contains("--plugin-dir DIR or POLYPROBE_PLUGIN_PATH"));
    PluginRegistry empty;
    CHECK_THROWS_WITH(empty.make_evaluator(model, *loss, request),
                      Catch::Contains("unknown device 'tpu' (known: cpu, cuda)"));
  }
  SECTION("a device a plugin declares reaches that plugin's evaluator, with type and name") {
    EvaluatorRequest request;
    request.device = "fakeaccel";
    Selection sel;
    CHECK_THROWS_WITH(
        fixtures().make_evaluator(model, *loss, request, &sel),
        Catch::Contains("fixture_fakeaccel reached with device accelerator/fakeaccel"));
    CHECK(sel.chosen == "fixture_fakeaccel");
    // The reference runs on the cpu only.
    request.backend = "reference";
    CHECK_THROWS_WITH(fixtures().make_evaluator(model, *loss, request),
                      Catch::Contains("runs on the cpu"));
  }
  SECTION("a plugin built for API 2, chosen by name, is refused with its version") {
    EvaluatorRequest request;
    request.backend = "api2";
    CHECK_THROWS_WITH(fixtures().make_evaluator(model, *loss, request),
                      Catch::Contains("built against plugin API 2; this polyprobe is API 3: "
                                      "rebuild it against the installed package"));
  }
  SECTION("candidate_autocast is refused by every backend that does not declare it") {
    EvaluatorRequest request;
    request.options.dtype = DType::f32;
    request.options.candidate_dtype = CandidateDType::bf16;
    // Automatic on the cpu: no plugin offers it, and the reference is not a silent fallback.
    Selection sel;
    CHECK_THROWS_WITH(fixtures().make_evaluator(model, *loss, request, &sel),
                      Catch::Contains("no plugin can run candidate_autocast") &&
                          Catch::Contains("--candidate-dtype bf16"));
    bool cpu_tbb_says_why = false;
    for (const auto& r : sel.reasons)
      cpu_tbb_says_why |= r.find(
                              "cpu_tbb: declined: it does not offer candidate_autocast in "
                              "bf16") != std::string::npos;
    CHECK(cpu_tbb_says_why);
    request.backend = "cpu_tbb";
    request.options.candidate_dtype = CandidateDType::fp16;
    CHECK_THROWS_WITH(fixtures().make_evaluator(model, *loss, request),
                      Catch::Contains("cannot serve") &&
                          Catch::Contains("does not offer candidate_autocast in fp16"));
    request.backend = "reference";
    CHECK_THROWS_WITH(fixtures().make_evaluator(model, *loss, request),
                      Catch::Contains("reference evaluator") &&
                          Catch::Contains("candidate_autocast (--candidate-dtype fp16)"));
    CHECK_THROWS_WITH(make_reference_evaluator(model, *loss, nullptr, request.options),
                      Catch::Contains("candidate_autocast"));
  }
}

TEST_CASE("candidate dtypes parse by their names and nothing else") {
  CHECK(parse_candidate_dtype("same") == CandidateDType::compute);
  CHECK(parse_candidate_dtype("bf16") == CandidateDType::bf16);
  CHECK(parse_candidate_dtype("bfloat16") == CandidateDType::bf16);
  CHECK(parse_candidate_dtype("fp16") == CandidateDType::fp16);
  CHECK(parse_candidate_dtype("float16") == CandidateDType::fp16);
  CHECK(to_string(CandidateDType::bf16) == "bf16");
  CHECK_THROWS_WITH(parse_candidate_dtype("int8"),
                    Catch::Contains("unknown candidate dtype 'int8'") && Catch::Contains("bf16"));
}

TEST_CASE("a plugin's own benchmark: missing, unavailable and absent ones are clear errors") {
  const PluginRegistry& registry = fixtures();
  const auto error_of = [&](const std::string& plugin) -> std::string {
    try {
      registry.run_plugin_bench(plugin, "cheri", nlohmann::json::object());
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  CHECK_THAT(error_of("no_such_plugin"), Catch::Contains("no plugin named 'no_such_plugin'"));
  CHECK_THAT(error_of("fixture_ok"), Catch::Contains("offers no benchmarks of its own"));
  const PluginInfo* no_device = by_file(registry, "no_device");
  REQUIRE(no_device != nullptr);
  CHECK_THAT(error_of(no_device->name),
             Catch::Contains("is unavailable here: unusable on this machine"));
}
