// The plugin SDK's C++ helpers (include/polyprobe/plugin/plugin.hpp) on their own: a session
// class becomes the ABI's session table, exceptions become status codes with their message,
// and optional members are NULL exactly when the class lacks them.
#include <polyprobe/plugin/plugin.hpp>

#include <catch2/catch.hpp>

#include <memory>
#include <stdexcept>
#include <string>

namespace {

// The least a session provides; counts what it was asked.
struct PlainSession {
  static inline int live = 0;
  int batches = 0;
  double incumbent = 0;
  PlainSession() { ++live; }
  PlainSession(const PlainSession&) = delete;
  PlainSession& operator=(const PlainSession&) = delete;
  ~PlainSession() { --live; }
  void set_batch(const pp_batch_view& /*batch*/) { ++batches; }
  void set_particles(const pp_particle_layout& layout) {
    if (layout.d <= 0) throw std::invalid_argument("particle dimension must be positive");
  }
  void set_incumbent(const pp_tensor& theta) { incumbent = pp::as_span<const double>(theta)[0]; }
  void move_incumbent(const double* moves) { incumbent += moves[0]; }
  void score(const pp_score_request& request, double* losses, double* incumbent_loss) {
    if (request.form != PP_CANDIDATES_EXPLICIT) throw std::runtime_error("explicit sets only");
    for (int64_t c = 0; c < request.count; ++c) losses[c] = incumbent + request.displacement[c];
    if (incumbent_loss != nullptr) *incumbent_loss = incumbent;
  }
  void read_incumbent(pp_tensor& theta) const { pp::as_span<double>(theta)[0] = incumbent; }
};

// Everything, the optional members included.
struct FullSession : PlainSession {
  std::string text = R"({"path": "toy"})";
  const char* explain() { return text.c_str(); }
  void transport(const pp_transport_request& /*request*/) { throw 42; }  // not a std::exception
};

}  // namespace

TEST_CASE("the session helper turns a class into the session table, errors into reasons") {
  const pp_session_api& api = pp::session_api_of<PlainSession>;
  CHECK(api.struct_size == sizeof(pp_session_api));
  CHECK(api.explain == nullptr);
  CHECK(api.transport == nullptr);

  void* self = nullptr;
  const pp_session_api* handed = nullptr;
  pp::hand_over_session(std::make_unique<PlainSession>(), &self, &handed);
  REQUIRE(handed == &api);
  REQUIRE(PlainSession::live == 1);

  pp_error err{};
  pp_batch_view batch{};
  CHECK(api.set_batch(self, &batch, &err) == PP_OK);
  CHECK(static_cast<PlainSession*>(self)->batches == 1);

  pp_particle_layout layout{};
  layout.struct_size = sizeof(layout);
  layout.d = 0;
  CHECK(api.set_particles(self, &layout, &err) == PP_FAILED);
  CHECK(std::string(err.message) == "particle dimension must be positive");

  double theta_value = 1.5;
  const int64_t shape[1] = {1};
  pp_tensor theta{&theta_value, PP_DTYPE_F64, PP_DEVICE_TYPE_CPU, 0, 1, shape, nullptr};
  CHECK(api.set_incumbent(self, &theta, &err) == PP_OK);
  const double move = 0.25;
  CHECK(api.move_incumbent(self, &move, &err) == PP_OK);

  const int64_t particle[2] = {0, 0};
  const double displacement[2] = {1.0, -2.0};
  pp_score_request request{};
  request.struct_size = sizeof(request);
  request.form = PP_CANDIDATES_EXPLICIT;
  request.count = 2;
  request.particle = particle;
  request.displacement = displacement;
  double losses[2] = {0, 0};
  double incumbent_loss = 0;
  CHECK(api.score(self, &request, losses, &incumbent_loss, &err) == PP_OK);
  CHECK(losses[0] == 2.75);
  CHECK(losses[1] == -0.25);
  CHECK(incumbent_loss == 1.75);
  request.form = PP_CANDIDATES_POLYTOPE;
  CHECK(api.score(self, &request, losses, nullptr, &err) == PP_FAILED);
  CHECK(std::string(err.message) == "explicit sets only");

  double read = 0;
  pp_tensor out{&read, PP_DTYPE_F64, PP_DEVICE_TYPE_CPU, 0, 1, shape, nullptr};
  CHECK(api.read_incumbent(self, &out, &err) == PP_OK);
  CHECK(read == 1.75);
  // A tensor of the wrong dtype is a reason, not a crash.
  float wrong = 0;
  pp_tensor bad{&wrong, PP_DTYPE_F32, PP_DEVICE_TYPE_CPU, 0, 1, shape, nullptr};
  CHECK(api.read_incumbent(self, &bad, &err) == PP_FAILED);
  CHECK(std::string(err.message) == "tensor has dtype float32, expected float64");

  api.destroy(self);
  CHECK(PlainSession::live == 0);
}

TEST_CASE("the session helper fills the optional members a class provides") {
  const pp_session_api& api = pp::session_api_of<FullSession>;
  REQUIRE(api.explain != nullptr);
  REQUIRE(api.transport != nullptr);
  void* self = nullptr;
  const pp_session_api* handed = nullptr;
  pp::hand_over_session(std::make_unique<FullSession>(), &self, &handed);
  CHECK(std::string(api.explain(self)) == R"({"path": "toy"})");
  pp_error err{};
  pp_transport_request request{};
  CHECK(api.transport(self, &request, &err) == PP_FAILED);
  CHECK(std::string(err.message) == "unknown exception");
  api.destroy(self);
  CHECK(PlainSession::live == 0);
}

TEST_CASE("answer_supports: an empty reason serves, any other is the reason") {
  pp_error why{};
  CHECK(pp::answer_supports(&why, [] { return std::string(); }) == 1);
  CHECK(pp::answer_supports(&why, [] { return std::string("no conv on this device"); }) == 0);
  CHECK(std::string(why.message) == "no conv on this device");
  CHECK(pp::answer_supports(&why, []() -> std::string {
          throw std::invalid_argument("layer 2: unknown op");
        }) == 0);
  CHECK(std::string(why.message) == "layer 2: unknown op");
}
