/* polyprobe plugin ABI: the only thing that crosses between the host and a plugin.
 *
 * A plugin is a shared library that exports one C symbol, polyprobe_plugin_entry. The host
 * calls it once with its PP_PLUGIN_API_VERSION; the plugin returns a static descriptor
 * (pp_plugin) or NULL when it cannot speak that version. Everything here is plain data and
 * function pointers: no C++ types, no exceptions, no Eigen or STL. Every fallible call
 * returns PP_OK or another status and, on failure, writes a one-line reason into the
 * caller's pp_error. Tensors cross as views (pp_tensor) and are never owned by the callee.
 * Whoever creates an object frees it through the matching destroy.
 *
 * Versioning: a struct that may grow starts with struct_size; new fields are only
 * appended, and a reader checks struct_size before touching a field past the first
 * version. PP_PLUGIN_API_VERSION changes only when an existing field changes meaning.
 * API 3 (this one) names devices instead of enumerating them: a device is a type
 * (pp_device_type: cpu, gpu, accelerator) and a name ("cpu", "cuda", "rocm", ...) that a
 * plugin declares with each capability, operation and session; and every attribute
 * struct of ops.h starts with struct_size. A plugin built for API 2 is refused with the
 * version it was built against: rebuilding it against this header is all a layer plugin
 * needs; a backend also fills in the device names (docs/plugins.md, "What breaks in API 3").
 *
 * The entry function is a pure function of host_api_version: the host may call it again
 * with older versions, only to name the version a plugin that declined was built against.
 */
#ifndef POLYPROBE_PLUGIN_ABI_H
#define POLYPROBE_PLUGIN_ABI_H

#include <stddef.h>
#include <stdint.h>

#include <polyprobe/plugin/operations.h>
#include <polyprobe/plugin/ops.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PP_PLUGIN_API_VERSION 3u
#define PP_ENTRY_SYMBOL "polyprobe_plugin_entry"

/* Status codes. */
enum { PP_OK = 0, PP_FAILED = 1, PP_UNSUPPORTED = 2 };

/* A reason, written by the callee on failure (NUL-terminated, truncated if long). */
typedef struct pp_error {
  char message[1024];
} pp_error;

typedef enum pp_dtype {
  PP_DTYPE_F32 = 1,
  PP_DTYPE_F64 = 2,
  PP_DTYPE_I64 = 3,
  PP_DTYPE_BF16 = 4,
  PP_DTYPE_F16 = 5
} pp_dtype;
#define PP_DTYPE_BIT(t) (1u << (t))

/* Devices. A device is a type and a name. The name is what users choose with --device
 * ("cpu", "cuda", "rocm", "metal", "sycl", ...: an open set, any name a loaded plugin
 * declares with a capability); the type says what kind of processor and memory it is, so
 * the host and other plugins know whether a pointer is host memory. "cpu" is the one
 * device of type PP_DEVICE_TYPE_CPU: the host's processors and memory. Names are lower
 * case letters, digits, '_' and '-', at most 32 characters. */
typedef enum pp_device_type {
  PP_DEVICE_TYPE_CPU = 0,        /* the host's processors and memory (the device "cpu") */
  PP_DEVICE_TYPE_GPU = 1,        /* a GPU with memory of its own: "cuda", "rocm", "metal", ... */
  PP_DEVICE_TYPE_ACCELERATOR = 2 /* any other processor with memory of its own (an NPU, ...) */
} pp_device_type;
#define PP_DEVICE_NAME_CPU "cpu"
#define PP_DEVICE_NAME_CUDA "cuda"
/* The types of the devices "cpu" and "cuda", for code that compares a tensor's or a
 * session's device type (a CUDA backend only ever receives its own device's work). */
#define PP_DEVICE_CPU PP_DEVICE_TYPE_CPU
#define PP_DEVICE_CUDA PP_DEVICE_TYPE_GPU

/* A strided view of memory owned by the caller. Strides count elements, not bytes. */
typedef struct pp_tensor {
  void* data;
  int32_t dtype;  /* pp_dtype */
  int32_t device; /* pp_device_type of the memory: PP_DEVICE_TYPE_CPU = host memory; any
                     other type = the memory of the device the call is on (the session's,
                     the accumulator's, the operation's) */
  int32_t device_index;
  int32_t ndim;
  const int64_t* shape;
  const int64_t* strides; /* NULL = contiguous row-major */
} pp_tensor;

/* What a plugin can provide. */
typedef enum pp_component {
  PP_COMPONENT_EVALUATOR = 1,    /* scores candidate sets (name = the evaluation path) */
  PP_COMPONENT_ACCUMULATOR = 2,  /* reduce-by-key (name = the strategy) */
  PP_COMPONENT_LAYER = 3,        /* a layer kind (name = the kind, as in model files) */
  PP_COMPONENT_SUBSPACE = 4,     /* a parameter subspace */
  PP_COMPONENT_RADIUS_MODEL = 5, /* a radius model */
  PP_COMPONENT_OPERATION = 6     /* a named operation (operations.h; name = the operation) */
} pp_component;

/* One declared capability. */
typedef struct pp_capability {
  int32_t component;       /* pp_component */
  const char* name;        /* path, strategy, layer kind, ... */
  int32_t device;          /* pp_device_type of the device it runs on */
  const char* device_name; /* the device's name, as in --device ("cpu", "cuda", "rocm", ...);
                              NULL = "cpu", only with PP_DEVICE_TYPE_CPU */
  uint32_t dtypes;         /* OR of PP_DTYPE_BIT(...) */
  uint32_t flags;          /* component-specific; 0 for now */
  const char* summary;     /* one line for `polyprobe plugins` */
} pp_capability;

/* Layer contracts: what a layer lets evaluators exploit (docs/design.md section 1). A false
 * declaration is caught by probing and costs speed, never correctness. */
enum {
  PP_CONTRACT_ELEMENTWISE = 1u << 0,    /* no parameters, y[i] = f(x[i]) for any f */
  PP_CONTRACT_AFFINE = 1u << 1,         /* y = x Q(W)^T + Qb(b); params = W (out x in), b */
  PP_CONTRACT_SITE_LOCAL = 1u << 2,     /* parameters act per position (conv, attention) */
  PP_CONTRACT_PREFIX_REUSABLE = 1u << 3 /* output depends only on input and own parameters */
};
/* A scalar function with context (the layer that declared it): y = fn(ctx, x). */
typedef double (*pp_scalar_fn)(const void* ctx, double x);

#define PP_MAX_DIMS 8
#define PP_MAX_LAYER_PARAMS 8

typedef struct pp_param_spec {
  const char* name; /* PyTorch's name within the module: "weight", "bias", ... */
  int32_t ndim;
  int64_t shape[PP_MAX_DIMS];
} pp_param_spec;

/* What a created layer tells the host about itself. */
typedef struct pp_layer_info {
  uint32_t struct_size;
  int32_t out_ndim; /* per-sample output shape */
  int64_t out_shape[PP_MAX_DIMS];
  int32_t n_params;
  pp_param_spec params[PP_MAX_LAYER_PARAMS];
  uint32_t contract;             /* OR of PP_CONTRACT_* */
  pp_scalar_fn elementwise_fn;   /* (optional) elementwise: the scalar function f */
  pp_scalar_fn weight_transform; /* (optional) affine: Q; NULL = identity */
  pp_scalar_fn bias_transform;   /* (optional) affine: Qb; NULL = identity */
  const void* fn_ctx;            /* the ctx passed to the three functions above */
} pp_layer_info;

/* A layer kind provided by a plugin. Activations are [batch, features] row-major, the
 * features of one sample flattened from its per-sample shape. */
typedef struct pp_layer_kind {
  uint32_t struct_size;
  const char* kind;    /* as written in model files, e.g. "triangle_wave" */
  const char* summary; /* one line */
  /* Creates a layer for one per-sample input shape from JSON attributes ("{}" if none). */
  int (*create)(const char* attrs_json, int32_t in_ndim, const int64_t* in_shape, void** self,
                pp_error* err);
  void (*destroy)(void* self);
  int (*describe)(const void* self, pp_layer_info* info, pp_error* err);
  /* in [B, in_features], params [n] (flat, the layer's parameters in declared order), out
   * [B, out_features]; all three of one dtype, F32 or F64. */
  int (*forward)(const void* self, const pp_tensor* in, const pp_tensor* params, pp_tensor* out,
                 pp_error* err);
  /* (optional) initial parameter values; NULL = zeros. */
  int (*init_params)(const void* self, uint64_t seed, double* params, int64_t count, pp_error* err);
} pp_layer_kind;

/* --- Candidate evaluation ------------------------------------------------------------ */

/* One layer of a model as an evaluator sees it. Built-in kinds carry a typed operation
 * (op != PP_OP_CUSTOM, op_attrs points to the pp_*_attrs struct ops.h names for it), so no
 * plugin parses JSON or calls back into the host for them. A third-party kind has
 * op == PP_OP_CUSTOM: its attrs_json, declared scalar functions and host_forward (a CPU
 * function of the host) are all an evaluator gets, and a device backend declines it. */
typedef struct pp_layer_view {
  const char* kind;
  const char* attrs_json; /* the model file's attributes, for messages and custom kinds */
  int32_t in_ndim;
  const int64_t* in_shape;
  int32_t out_ndim;
  const int64_t* out_shape;
  int64_t param_offset; /* into the flat parameter vector */
  int64_t param_count;
  uint32_t contract; /* as declared; see pp_layer_info */
  pp_scalar_fn elementwise_fn;
  pp_scalar_fn weight_transform;
  pp_scalar_fn bias_transform;
  const void* fn_ctx;
  /* The host's own forward of this layer (CPU, F32 or F64), so a CPU evaluator can run
   * kinds it does not know and probe the contracts of those it does. */
  const void* host_layer;
  int (*host_forward)(const void* host_layer, const pp_tensor* in, const pp_tensor* params,
                      pp_tensor* out, pp_error* err);
  int32_t op;           /* pp_op_kind */
  const void* op_attrs; /* the op's attribute struct; NULL for PP_OP_CUSTOM and parameter-free
                           ops without attributes (flatten) */
} pp_layer_view;

typedef struct pp_model_view {
  uint32_t struct_size;
  int32_t n_layers;
  const pp_layer_view* layers;
  int64_t n_params;
  int32_t in_ndim;
  const int64_t* in_shape;
} pp_model_view;

/* The objective: mean per-sample loss plus l2 * sum(theta^2). */
typedef struct pp_loss_view {
  uint32_t struct_size;
  const char* name; /* "cross_entropy", "mse", "hinge", "zero_one" */
  double l2;
} pp_loss_view;

/* A minibatch. The host sends F64 host tensors; a device backend copies them once per
 * set_batch and keeps them resident until the next one. */
typedef struct pp_batch_view {
  uint32_t struct_size;
  pp_tensor inputs;  /* [B, in_features], F64 */
  pp_tensor labels;  /* [B] I64 for classification losses, else data NULL */
  pp_tensor targets; /* [B, out_features] F64 for regression losses, else data NULL */
} pp_batch_view;

/* One search coordinate of a rank-one subspace: theta moves the rows x cols parameter
 * tensor at `offset` (row-major, a bias is rows x 1) by theta * u v^T, where u = e_row when
 * row >= 0, else the dense u[rows], and v = e_col when col >= 0, else the dense v[cols]. */
typedef struct pp_subspace_coord {
  int64_t offset;
  int64_t rows, cols;
  int64_t row, col;
  const double* u;
  const double* v;
} pp_subspace_coord;

/* A subspace as evaluators see it: particles' coords index `coords`, displacements and
 * moves are in subspace coordinates, and the incumbent stays the model's parameters. */
typedef struct pp_subspace_view {
  uint32_t struct_size;
  const char* kind;                /* "hybrid", "factored", ... */
  int64_t dimension;               /* number of coordinates */
  int64_t n_params;                /* parameters it maps into */
  const pp_subspace_coord* coords; /* [dimension] */
} pp_subspace_view;

/* Fixed for a session: what it is created with. */
typedef struct pp_session_options {
  uint32_t struct_size;
  int32_t dtype;           /* compute dtype, pp_dtype */
  int32_t device;          /* pp_device_type of the device the session runs on */
  const char* device_name; /* that device's name, one the plugin declared for an evaluator
                              capability ("cpu", "cuda", "rocm", ...); never NULL */
  int32_t device_index;
  int32_t threads;                  /* CPU threads; 0 = all the process may use */
  int64_t chunk_size;               /* candidates held at once; 0 = automatic */
  const pp_subspace_view* subspace; /* (optional) NULL = particles move raw parameters */
  const char* path; /* (optional) force one evaluation path; NULL or "auto" = choose */
  void* stream;     /* (optional) the native queue of the session's device, whatever that
                       device's API queues work on: a cudaStream_t for "cuda", a hipStream_t
                       for a ROCm backend, an id<MTLCommandQueue> for Metal, a sycl::queue*
                       for SYCL; NULL on the cpu. The host passes it through unread; NULL =
                       the session makes its own. The host never synchronises it: every call
                       that returns results to host memory has completed its work. */
  /* --- appended: named operations (operations.h) --- */
  const pp_host_api* host; /* (optional) the host's operations; valid for the session's life */
  /* --- appended: candidate_autocast --- */
  /* (optional) 0 = candidates compute in `dtype`; PP_DTYPE_BF16 or PP_DTYPE_F16 = the
   * candidates' forwards run in that precision with float32 accumulation, the incumbent's in
   * `dtype` (candidate_autocast). The host sends it only to a plugin whose evaluator
   * capability for the device carries the matching PP_EVALUATOR_AUTOCAST_* flag; the session
   * declines (session_supports, with the reason) what it cannot run that way. */
  int32_t candidate_dtype;
} pp_session_options;

/* pp_capability::flags of an evaluator: the reduced candidate dtypes it runs
 * (pp_session_options::candidate_dtype). */
enum { PP_EVALUATOR_AUTOCAST_BF16 = 1u << 0, PP_EVALUATOR_AUTOCAST_F16 = 1u << 1 };

/* Whether the host sent an appended field of a struct (older hosts send fewer). */
#define PP_HAS_FIELD(ptr, type, field) \
  ((ptr)->struct_size >= offsetof(type, field) + sizeof((ptr)->field))

/* The particle structure of an optimizer: fixed for a run, it crosses once (set_particles).
 * Particle p covers the search coordinates coords[p*d .. p*d+d) (-1 = padding, which does
 * not exist in the model): raw parameter indices, or subspace coordinates with a subspace.
 * The polytope (template [V d], unit radius) and the probe count K describe how the
 * optimizer's candidates are generated from per-step directions (pp_score_request). */
typedef struct pp_particle_layout {
  uint32_t struct_size;
  int32_t d;
  int64_t n_particles;
  const int64_t* coords;  /* [n_particles * d] */
  int32_t n_vertices;     /* V; 0 when the caller only scores explicit candidates */
  int32_t n_probes;       /* K >= 1 */
  const double* polytope; /* [V * d], row-major; may be NULL when n_vertices == 0 */
} pp_particle_layout;

typedef enum pp_candidate_form {
  /* The optimizer's candidates: particle i (where active[i]) at each vertex v and probe
   * k = 1..K, displaced by probe_radius * k / (K + 1) * directions[i, v, :]. losses is
   * [P * V * K] in (i, v, k) order; entries of inactive particles are left untouched. */
  PP_CANDIDATES_POLYTOPE = 1,
  /* Any set: candidate c moves particle particle[c] by displacement[c*d .. c*d+d). The V x
   * K candidates of one particle should be adjacent (every fast path relies on it).
   * losses is [count]. Screening, reuse and ask/tell use this form. */
  PP_CANDIDATES_EXPLICIT = 2
} pp_candidate_form;

typedef struct pp_score_request {
  uint32_t struct_size;
  int32_t form; /* pp_candidate_form */
  /* PP_CANDIDATES_POLYTOPE */
  const double* directions; /* [P * V * d]: the particle's rotated (and shaped) template,
                               unit radius; host memory */
  double probe_radius;
  const uint8_t* active; /* (optional) [P]; NULL = every particle */
  /* PP_CANDIDATES_EXPLICIT */
  int64_t count;
  const int64_t* particle;    /* [count] */
  const double* displacement; /* [count * d] */
  /* --- appended: the transport half of a step on the session's device --- */
  /* (optional, PP_CANDIDATES_POLYTOPE) the rotations the directions came from, [P * d * d],
   * row-major R_i with directions[i, v, :] = R_i t_v (t_v = row v of the bound polytope);
   * host memory. A device session may upload these (per particle) and build the directions
   * itself instead of uploading [P V d]. NULL when the directions are not plain rotations of
   * the template (a metric shapes them): then read `directions`. */
  const double* rotations;
  /* --- appended: rotations the session draws itself --- */
  /* (optional, PP_CANDIDATES_POLYTOPE; only to a session whose draws_rotations(self, d)
   * returned nonzero) Nonzero: directions and rotations are NULL, and R_i is particle i's
   * rotation at step rotation_step of the optimizer's counter-based stream under
   * rotation_seed, which the session computes itself with the same bits as the host
   * (kernels/plane_rotation.hpp for d = 2); directions[i, v, :] = R_i t_v as above. */
  int32_t rotations_from_stream;
  uint64_t rotation_seed;
  uint64_t rotation_step;
} pp_score_request;

/* The transport half of an optimizer step (docs/plugins.md, "Which kernels of a step a
 * backend takes over"): the cost matrix C[i, v] = mean over k of the [P V K] losses of the
 * last polytope score call made with losses == NULL (they stayed on the device), its
 * per-block statistics, the non-finite penalty, the cost scaling, the solve, the
 * barycentric move and the quadratic model's per-block sums. In brief: C[i, v] = mean over
 * k of L[i, v, k]; per block, a non-finite C becomes worst + margin (1 + |worst|) and the
 * block is rescaled (PP_COST_*); softmax W[i, v] = exp(-(C[i, v] - min_v C[i, v]) / eps)
 * normalised per row, Sinkhorn the log-domain iteration with uniform marginals from the
 * given duals, top-k equal weights on the k cheapest vertices (ties to the lower index);
 * moves[i] = step_radius R_i sum_v W[i, v] t_v; the quadratic sums from the outer probe.
 * Every sum over particles adds partials of fixed 64-particle chunks in chunk order, which
 * is what keeps the trajectory independent of threads and ranks. docs/plugins.md ("The
 * transport kernels by formula") states each formula and its reduction order. The
 * optimizer's logic (radii, schedules, radius models, momentum, checkpoints) stays in the
 * core, which sends what it decided and receives per-particle and per-block results only. */
enum { PP_SOLVER_SINKHORN = 1, PP_SOLVER_SOFTMAX = 2, PP_SOLVER_TOP_K = 3 };
enum { PP_COST_SCALING_NONE = 0, PP_COST_MEAN = 1, PP_COST_MAX = 2, PP_COST_MIN_MAX = 3 };

/* What the transport call reports per block (particles [first, first + count)). */
typedef struct pp_transport_block {
  double cost_sum;    /* sum of the finite entries of C over the block (before the penalty) */
  int64_t finite;     /* their number */
  double best_cost;   /* their minimum (+inf when none) */
  int32_t iterations; /* Sinkhorn iterations run (0 for the closed-form rules) */
  int32_t converged;  /* 1 when the Sinkhorn marginals met the tolerance (1 otherwise) */
  double slope;       /* quadratic model: sum over the block of g_i . m_i (finite terms) */
  double curvature;   /* sum of c_i |m_i|^2 over the same terms */
} pp_transport_block;

typedef struct pp_transport_request {
  uint32_t struct_size;
  int32_t solver; /* PP_SOLVER_* */
  int32_t top_k;  /* PP_SOLVER_TOP_K: vertices kept per row (greedy = 1) */
  int32_t sinkhorn_max_iterations;
  double sinkhorn_tolerance;
  double temperature;
  int32_t cost_scaling;    /* PP_COST_* */
  double nonfinite_margin; /* non-finite cost -> max finite + margin (1 + |max|) per block */
  int64_t n_blocks;
  const int64_t* block_first; /* [n_blocks]; the blocks tile [0, P) in order */
  const int64_t* block_count;
  double step_radius; /* moves[i] = step_radius * sum_v W[i, v] directions[i, v, :] */
  /* Sinkhorn duals per block, warm-started across steps (host memory, in and out):
   * duals_f [P] (rows, at block_first) and duals_g [n_blocks * V]; duals_fresh[b] = 1 starts
   * block b from g = 0 with exact rows. NULL for the other solvers. */
  double* duals_f;
  double* duals_g;
  const uint8_t* duals_fresh;
  /* The quadratic model (NULL incumbents = none): f(X) shared (n_incumbents = 1) or per
   * particle (= P); the fit uses the outer probe's losses (k = K) and scaled_radius. */
  const double* incumbents;
  int64_t n_incumbents;
  double scaled_radius;
  /* Outputs, host memory. */
  double* moves;              /* [P * d] */
  pp_transport_block* blocks; /* [n_blocks] */
  double* weights;            /* (optional) [P * V], the transport plan's rows; NULL = not wanted */
} pp_transport_request;

/* An evaluator session: created once per (model structure, loss, subspace,
 * options); it keeps the batch, the particle layout and the incumbent, on its device, so
 * what is fixed for a run crosses once and what changes per step is small. Calls on one
 * session come from one host thread at a time; sessions are independent of each other.
 * Every call returns PP_OK or writes a reason into err. */
typedef struct pp_session_api {
  uint32_t struct_size;
  /* Binds a minibatch (copied or uploaded; the view need not outlive the call). */
  int (*set_batch)(void* self, const pp_batch_view* batch, pp_error* err);
  /* Binds the particle structure (copied). Called once per optimizer, again only when the
   * caller's particle structure changes. */
  int (*set_particles)(void* self, const pp_particle_layout* layout, pp_error* err);
  /* Sets the incumbent: theta [n_params], F64, host memory (copied). */
  int (*set_incumbent)(void* self, const pp_tensor* theta, pp_error* err);
  /* Moves the incumbent: particle p by moves[p*d .. p*d+d) in search coordinates (through
   * the subspace when there is one); padding entries are ignored. The host applies the same
   * move to its own copy, so neither sends the incumbent again. */
  int (*move_incumbent)(void* self, const double* moves, pp_error* err);
  /* Scores a candidate set around the incumbent into host `losses`, and, when
   * incumbent_loss is not NULL, the incumbent itself in the same call (its forward, which
   * every path reuses as the prefix, runs once). */
  int (*score)(void* self, const pp_score_request* request, double* losses, double* incumbent_loss,
               pp_error* err);
  /* Copies the incumbent into theta [n_params] (F64, host): validation, checkpoints, tests. */
  int (*read_incumbent)(void* self, pp_tensor* theta, pp_error* err);
  /* (optional) JSON describing the paths taken and declined, valid until the next call. */
  const char* (*explain)(void* self);
  void (*destroy)(void* self);
  /* --- appended (check with PP_HAS_FIELD) --- */
  /* (optional) The transport half of the step just scored (pp_transport_request). A session
   * that offers it accepts losses == NULL in a PP_CANDIDATES_POLYTOPE score call: the losses
   * then stay on its device for this call, which must come next. */
  int (*transport)(void* self, const pp_transport_request* request, pp_error* err);
  /* (optional) Nonzero when the session draws the rotations of particles of dimension d from
   * the optimizer's stream itself (pp_score_request::rotations_from_stream), so a step sends
   * no per-particle data up. Only asked of a session that offers transport: the host then
   * never needs the step's directions. */
  int (*draws_rotations)(void* self, int32_t d);
} pp_session_api;

typedef struct pp_accumulator_api {
  uint32_t struct_size;
  /* out[keys[i], :] += values[i, :] for rows of width `width`; out is [n_keys, width]. The
   * result must not depend on thread count when the strategy claims determinism. Tensors
   * name their device; keys live where values do. */
  int (*accumulate)(void* self, int64_t n, const int64_t* keys, const pp_tensor* values,
                    int64_t n_keys, pp_tensor* out, pp_error* err);
  void (*destroy)(void* self);
  /* (optional) threads for later calls; 0 = all the process may use. */
  int (*set_threads)(void* self, int32_t threads, pp_error* err);
  /* (optional) the strategy that ran in the last call ("auto" resolves to one). */
  const char* (*last_strategy)(void* self);
  /* (optional, device backends) A benchmark on data that lives on the backend's device,
   * which the host cannot allocate: see pp_accumulate_benchmark. *json receives a JSON
   * object, valid until the next call on `self`. */
  int (*device_benchmark)(void* self, const struct pp_accumulate_benchmark* spec, const char** json,
                          pp_error* err);
} pp_accumulator_api;

/* What device_benchmark runs: n_rows rows of `width` values (uniform in [-1, 1)) with keys
 * uniform in [0, n_keys), both generated on the device from `seed`; one untimed-then-timed
 * cold call and `repeats` timed calls of the accumulator, each into a zeroed output, then
 * `repeats` device-to-device copies of the value bytes (at most 4 GiB) as the bandwidth
 * yardstick, all timed with device events; and the largest difference from the segment
 * strategy's sum (the core reference's order) on the same data. The JSON holds
 * "strategy_used", "cold_ms", "times_ms", "copy_times_ms", "value_bytes", "copy_bytes",
 * "max_abs_diff", "max_abs_sum". */
typedef struct pp_accumulate_benchmark {
  uint32_t struct_size;
  int64_t n_keys, n_rows, width;
  int32_t repeats;
  uint64_t seed;
} pp_accumulate_benchmark;

/* --- Subspaces ------------------------------------------------------------------------ */

/* One parameter tensor of a model as a subspace kind sees it. */
typedef struct pp_param_entry {
  const char* name; /* PyTorch's name, "0.weight" */
  int32_t layer;    /* index into the model view's layers */
  int32_t ndim;
  const int64_t* shape;
  int64_t offset; /* into the flat parameter vector */
  int64_t size;
} pp_param_entry;

/* How the user asked for a subspace (--subspace-rank, --subspace-dim, the seed). */
typedef struct pp_subspace_options {
  uint32_t struct_size;
  int64_t rank;          /* basis rank per weight, >= 1 */
  int64_t max_dimension; /* bound on the number of coordinates; 0 = none */
  uint64_t seed;         /* the bases' random stream */
} pp_subspace_options;

/* A subspace kind provided by a plugin: a linear map from search coordinates to parameter
 * changes, described to evaluators as rank-one coordinates (pp_subspace_view), the form
 * every backend's subspace path reads. The optimizer absorbs every move into the model's
 * parameters, so the incumbent stays at coordinate 0. A subspace object is fixed once
 * created: the host recreates it from the same options and seed on resume, so it needs no
 * state. To rotate the subspace (--subspace-rotation-interval) the host creates it again with
 * another seed, then destroys the old one (sessions created with the old view are never
 * called again, only destroyed, and new ones get the new view); the new object must
 * have the same dimension and the same coordinate layout (each coordinate moving the same
 * tensor along a row or a column as before, only along other vectors), which the host
 * checks. */
typedef struct pp_subspace_kind {
  uint32_t struct_size;
  const char* kind;    /* as in --subspace, e.g. "factored" */
  const char* summary; /* one line for `polyprobe plugins` */
  /* Creates the subspace of a model: `entries` are its parameter tensors in order, `model`
   * says which layer each belongs to (op, transforms, contract). A model it cannot span is
   * refused with PP_UNSUPPORTED and the reason (what, where, what to use instead). The views
   * need not outlive the call. */
  int (*create)(const pp_model_view* model, const pp_param_entry* entries, int32_t n_entries,
                const pp_subspace_options* options, void** self, pp_error* err);
  void (*destroy)(void* self);
  /* Fills `view` (struct_size is set by the caller): kind, dimension, n_params and coords.
   * What it points to belongs to the subspace and stays valid and unchanged until destroy. */
  int (*describe)(const void* self, pp_subspace_view* view, pp_error* err);
} pp_subspace_kind;

/* --- Radius models --------------------------------------------------------------------- */

/* What a radius model is told about the optimizer it serves: fixed for a run. */
typedef struct pp_radius_config {
  uint32_t struct_size;
  const char* options_json; /* the user's --radius-options, "{}" when none */
  double step_radius;       /* the configured base radii, before schedule and multipliers */
  double probe_radius;
  int64_t total_steps; /* the run's planned steps (schedules end there) */
  int32_t particle_dim;
  int32_t n_vertices;
  int32_t n_probes;
  int32_t subspace; /* 1 when the search runs over a subspace's coordinates */
} pp_radius_config;

/* pp_radius_model_kind.flags */
enum {
  /* every scored step evaluates the incumbent f(X) and reports it (observe_incumbent) */
  PP_RADIUS_NEEDS_INCUMBENT = 1u << 0
};

/* A radius model provided by a plugin: the core's RadiusModel (radius_model.hpp) across the
 * boundary. Each scored step the optimizer reads the multipliers on its scheduled radii,
 * scores the candidates, reports the mean candidate cost (and the incumbent's loss when
 * PP_RADIUS_NEEDS_INCUMBENT), asks how far to move along each block's transport move given
 * that block's local quadratic model, and records the predicted change. Calls on one model
 * come from one host thread at a time. Every call but destroy returns PP_OK or a reason. */
typedef struct pp_radius_model_kind {
  uint32_t struct_size;
  const char* name;    /* as in --radius-model, e.g. "plateau" */
  const char* summary; /* one line for `polyprobe plugins` */
  uint32_t flags;      /* OR of PP_RADIUS_* */
  /* Creates a model for one optimizer. A configuration it cannot serve (bad options, a
   * search it was not made for) is refused with PP_UNSUPPORTED and the reason. */
  int (*create)(const pp_radius_config* config, void** self, pp_error* err);
  void (*destroy)(void* self);
  /* The multipliers on the scheduled step and probe radii for the coming step (> 0). */
  int (*multipliers)(const void* self, double* step, double* probe, pp_error* err);
  /* (optional) The mean candidate cost of the step just scored. */
  int (*observe_costs)(void* self, double mean_cost, pp_error* err);
  /* (optional) f(X) of a scored step; comparable = 0 when the objective (minibatch) changed or
   * a momentum-only step intervened since the last recorded prediction. */
  int (*observe_incumbent)(void* self, double loss, int32_t comparable, pp_error* err);
  /* (optional; NULL = 1) The step length along a block's transport move m, as a multiple of
   * it, given the block's model q(a) = a slope + a^2 curvature / 2. */
  int (*move_scale)(const void* self, double slope, double curvature, double* scale, pp_error* err);
  /* (optional) The predicted change of the step just taken (sum over blocks); at_boundary =
   * 1 when a step length hit its cap. */
  int (*record_prediction)(void* self, double predicted_change, int32_t at_boundary, pp_error* err);
  /* (optional) Forget any deferred comparison (objective changed, resync). */
  void (*invalidate)(void* self);
  /* Its state for checkpoints, as bytes: writes at most `capacity` bytes into `data` and the
   * size of the whole state into *size (data == NULL asks for the size alone). Resuming from
   * it must continue bit for bit. */
  int (*save)(const void* self, uint8_t* data, int64_t capacity, int64_t* size, pp_error* err);
  /* Restores a state written by save (of the same name); a state it cannot read is refused
   * with the reason. */
  int (*load)(void* self, const uint8_t* data, int64_t size, pp_error* err);
} pp_radius_model_kind;

/* --- The descriptor -------------------------------------------------------------------- */

typedef struct pp_plugin {
  uint32_t api_version; /* PP_PLUGIN_API_VERSION the plugin was built with */
  uint32_t struct_size;
  const char* name; /* unique among loaded plugins, e.g. "cpu_tbb" */
  const char* version;
  const char* vendor;
  const char* summary;
  /* Scores the plugin on this machine; 0 = unusable, with the reason in *why. */
  int32_t (*probe)(pp_error* why);
  const pp_capability* caps;
  int32_t n_caps;
  const pp_layer_kind* layers;
  int32_t n_layers;
  /* (optional) 1 if a session forced to evaluator `path` (NULL = automatic) can serve this
   * model, loss and options, else 0 and *why. Cheap: the host calls it while choosing. */
  int (*session_supports)(const char* path, const pp_model_view* model, const pp_loss_view* loss,
                          const pp_session_options* options, pp_error* why);
  /* (optional) creates an evaluator session. The host keeps the model, loss and subspace
   * views (and everything they point to) valid until the session is destroyed; the options
   * struct itself need not outlive the call. */
  int (*session_create)(const pp_model_view* model, const pp_loss_view* loss,
                        const pp_session_options* options, void** self, const pp_session_api** api,
                        pp_error* err);
  /* (optional) creates an accumulator of `strategy`. */
  int (*accumulator_create)(const char* strategy, int32_t dtype, void** self,
                            const pp_accumulator_api** api, pp_error* err);
  /* Appended after accumulator_create (read when struct_size covers them): */
  const pp_subspace_kind* subspaces; /* (optional) the subspace kinds it adds */
  int32_t n_subspaces;
  const pp_radius_model_kind* radius_models; /* (optional) the radius models it adds */
  int32_t n_radius_models;
  /* (optional, appended: check with PP_HAS_FIELD) runs the plugin's own kernel benchmark
   * `suite` on its device, for `polyprobe bench`: options and the result are JSON text, the
   * result {"records": [{...}, ...]} with the fields of the host's bench records. *result
   * points into plugin memory, valid until the plugin's next bench call; host thread only. */
  int (*bench)(const char* suite, const char* options_json, const char** result_json,
               pp_error* err);
  /* --- appended: named operations (operations.h) --- */
  const pp_operation* operations; /* (optional) what the plugin offers the host and sessions */
  int32_t n_operations;
} pp_plugin;

/* The one exported symbol. Returns NULL when the plugin cannot serve host_api_version. */
typedef const pp_plugin* (*pp_plugin_entry_fn)(uint32_t host_api_version);

#ifdef __cplusplus
}
#endif

#endif /* POLYPROBE_PLUGIN_ABI_H */
