// The training loop: epochs of minibatches through the polytope optimizer, validation, the
// best state, early stopping, metrics, checkpoints.
//
// train() runs PolytopeOptimizer::step once per minibatch (registering the evaluator on each
// new batch), measures the validation split after every epoch (or every `validate_every`
// steps) and when the time limit ends the run, keeps the parameters with the best validation
// accuracy (ties: lower validation loss) and restores them at the end, so the model it leaves
// behind is the best one seen, not the last: a late collapse never costs the best state. It
// stops after `epochs`, after `patience` validations without improvement, at the time limit,
// or when `stop` becomes true (e.g. on Ctrl-C), always between two steps; a stopped run writes
// its checkpoint and then also restores the best validated state, so the caller can save the
// best-so-far weights while --resume continues from the checkpoint's current state. Checkpoints
// hold everything needed to continue exactly (parameters, best state, optimizer state, data
// position) and are written atomically (temporary file, then rename), so an interrupted run keeps
// its last complete checkpoint.
//
// Non-finite losses: the optimizer already gives a non-finite candidate a finite penalty above
// every finite cost of its block. train() also checks the incumbent after every step: a step
// whose minibatch loss is not finite is reverted (the parameters before it restored, the
// metrics record says "reverted"), a validation whose loss is not finite never becomes the
// best state, and when the incumbent itself is not finite before the step (nothing can make it
// finite), or `max_reverted_steps` steps in a row were reverted, train() throws
// NonFiniteLossError naming the first layer whose output is not finite; in the second case the
// model holds the best validated state (the error says which), as a finished run's would. train()
// refuses an optimizer whose radius model is trust_region: its deferred comparisons assume a
// stationary objective, which a minibatch stream is not (use the manual step API).
#pragma once

#include <polyprobe/data.hpp>
#include <polyprobe/error.hpp>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <utility>

namespace polyprobe {

class Evaluator;
class Loss;
class Model;
class PolytopeOptimizer;

// What a progress display needs after each step.
struct TrainProgress {
  int64_t step = 0;   // steps done (1-based after the first)
  int64_t epoch = 0;  // 0-based epoch of this step
  int64_t steps_per_epoch = 0;
  int64_t epochs = 0;
  double loss = 0;            // objective of the updated parameters on this minibatch
  double accuracy = 0;        // their accuracy on this minibatch
  int64_t batch_samples = 0;  // samples in this minibatch
  int64_t candidates = 0;     // candidates scored so far
  double seconds = 0;         // since the start (of this run and the ones it resumes)
  std::optional<double> validation_accuracy;  // set when the validation split was measured
  bool reverted = false;  // the step made the minibatch loss non-finite and was undone
  double epsilon = 0;     // the schedule's epsilon this step (the radii's and transport's scale)
};

struct TrainOptions {
  int64_t epochs = 10;
  int64_t batch_size = 64;
  uint64_t seed = 0;           // minibatch order
  int64_t patience = 0;        // validations without improvement before stopping; 0 = off
  int64_t validate_every = 0;  // steps between validations; 0 = at the end of every epoch
  double time_limit_s = 0;     // stop (between steps) after this long; 0 = no limit
  // The optimizer's linear or cosine schedule (and momentum's warm-up) advances by the larger
  // of two fractions of the run, its steps' (of total_steps) and its seconds' (of
  // time_limit_s), so a run the time limit cuts still ends annealed. Needs time_limit_s > 0
  // and a schedule that depends on the run's length. The steps then depend on the clock.
  bool schedule_over_time = false;
  DType dtype = DType::f32;               // precision of validation forwards
  std::filesystem::path metrics_path;     // JSON lines; empty = none
  std::filesystem::path checkpoint_path;  // written after every epoch; empty = none
  bool resume = false;                    // continue from checkpoint_path
  int64_t max_reverted_steps = 20;        // consecutive non-finite steps before giving up
  // Metrics only: whenever a validation finds a new best state, also measure the test split,
  // and write the test accuracy of the best state so far into every validation record
  // ("best_test_accuracy"), so one run gives the curve of the restored state's test accuracy
  // against time. Its time counts in "seconds". A resumed run knows it from its next best.
  bool record_test = false;
  const std::atomic<bool>* stop = nullptr;
  std::function<void(const TrainProgress&)> on_progress;
  // Called once, before the first step, when a checkpoint was read (resume): the step, epoch
  // and seconds it continues from.
  std::function<void(const TrainProgress&)> on_resume;
  // --- Several processes training one run together (polyprobe_distributed, docs/scale.md):
  // each calls train() on the same inputs and stays bit-identical with the others.
  // false: write no metrics and no checkpoints (another process does); resume still reads.
  bool write_files = true;
  // (optional) Called twice after every step, in the same order on every process, with this
  // process's reason to stop (a StopReason bit, or 0): first the time limit, then `stop`
  // (checked after on_progress), which depend on its clock and its signals; returns the reason
  // every process acts on (the leader's), so that all stop after the same step.
  std::function<uint32_t(uint32_t)> agree_on_stop;
  // (optional, with schedule_over_time) Called before every step, in the same order on every
  // process, with this process's seconds; returns the leader's, so that every process's
  // schedule reads the same clock.
  std::function<double(double)> agree_on_clock;
};

// The reasons agree_on_stop carries.
enum StopReason : uint32_t { stop_time_limit = 1, stop_interrupted = 2 };

struct TrainResult {
  int64_t steps = 0;
  int64_t epochs_completed = 0;
  int64_t evaluations = 0;  // candidates scored
  double seconds = 0;
  double best_validation_accuracy = 0;
  double best_validation_loss = 0;
  int64_t best_epoch = -1;  // -1: no validation happened; the final state is kept
  int64_t best_step = -1;   // steps done when the best state was measured
  int64_t validations = 0;
  bool stopped_early = false;  // patience ran out
  bool reached_time_limit = false;
  bool interrupted = false;    // `stop` was set; the checkpoint (if any) holds the current state,
                               // the model the best validated one (if any validation happened)
  int64_t reverted_steps = 0;  // steps undone because they made the loss non-finite
  int64_t resumed_from_step = -1;  // the checkpoint's step when resuming; -1 otherwise
  // Where this run's wall time went, in seconds: the optimizer's steps (the minibatch handed to
  // the evaluator included), the record of each step's minibatch after it, and validation
  // (with the test split it records and the checkpoint it writes). The rest is the loop's own.
  struct Phases {
    double step = 0, record = 0, validation = 0;
  } seconds_in;
};

// The incumbent's loss cannot be made finite. `layer_kind` is the kind of the first layer whose
// output is not finite although its input is ("" when every layer is finite and the loss is
// not, or the data or parameters are), so a caller can name the plugin that provides it.
class NonFiniteLossError : public Error {
 public:
  NonFiniteLossError(const std::string& message, std::string kind)
      : Error(message), layer_kind(std::move(kind)) {}
  std::string layer_kind;
  // When train() gives up after max_reverted_steps, it leaves the best validated state in the
  // model (else the last finite one), for the caller to save: its step (-1: none validated)
  // and validation accuracy.
  int64_t best_step = -1;
  double best_validation_accuracy = 0;
};

struct EvaluationResult {
  double loss = 0;      // mean per-sample loss (without the l2 term)
  double accuracy = 0;  // fraction of samples whose first maximal output is the label
  int64_t samples = 0;
};

// Loss and accuracy of the model's current parameters on `data`, in `dtype`, on `threads`
// (0: all the process may use). The rows go in chunks of a fixed size whose partial sums are
// added in order, so the result does not depend on the thread count.
EvaluationResult evaluate_model(const Model& model, const Loss& loss, const Dataset& data,
                                DType dtype = DType::f32, int threads = 1);

// Trains `model` in place (see the header comment). `evaluator` must have been made for this
// model and loss; `optimizer` for this model.
TrainResult train(Model& model, const Loss& loss, PolytopeOptimizer& optimizer,
                  Evaluator& evaluator, const DataSplits& data, const TrainOptions& options);

}  // namespace polyprobe
