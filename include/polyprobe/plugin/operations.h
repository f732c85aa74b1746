/* Named operations: the kernel registry of the plugin ABI.
 *
 * A plugin may offer operations (pp_operation) besides evaluators and layers: a kernel with
 * a well-known name ("sdpa", ...), for one device (a type and a name, as in abi.h) and a set
 * of dtypes, behind a C function table whose layout the name fixes. The host collects the
 * operations of every available plugin and hands out the best one for (name, device name,
 * dtype): to its own layers and to evaluator sessions through pp_session_options.host. So an
 * evaluator uses a fused attention without knowing which plugin provides it, and a model works the
 * same when no plugin offers one (the caller then computes the operation itself).
 *
 * Choice, for each (name, device, dtype): the highest score, then the plugin's name. An
 * operation's own probe (optional) can make it unusable on this machine (no GPU) while the
 * rest of its plugin stays usable.
 *
 * Everything here is plain C, like abi.h. An operation's function table is immutable and
 * lives as long as the process (plugins are never unloaded); its functions are reentrant
 * and may be called from any number of threads at once.
 */
#ifndef POLYPROBE_PLUGIN_OPERATIONS_H
#define POLYPROBE_PLUGIN_OPERATIONS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct pp_error;

/* One operation a plugin offers. */
typedef struct pp_operation {
  uint32_t struct_size;
  const char* name; /* well-known name; fixes what `table` points to (PP_OPERATION_SDPA, ...) */
  int32_t device;   /* pp_device_type of the tensors it takes */
  const char* device_name; /* their device's name ("cpu", "cuda", ...); NULL = "cpu", only
                              with PP_DEVICE_TYPE_CPU */
  uint32_t dtypes;         /* OR of PP_DTYPE_BIT(...) */
  int32_t score;           /* > 0; the host prefers the highest among those that serve */
  const char* summary;     /* one line for `polyprobe plugins` and --explain */
  /* (optional) 0 = unusable on this machine, with the reason in *why; else usable. */
  int32_t (*probe)(struct pp_error* why);
  const void* table; /* the function table named by `name`, e.g. a pp_sdpa_table */
} pp_operation;

/* What the host offers a plugin's session (pp_session_options.host). */
typedef struct pp_host_api {
  uint32_t struct_size;
  const void* ctx; /* the host's; pass it back */
  /* The best usable operation `name` for (device, dtype), or NULL when none is loaded (the
   * caller computes it itself). `device` is a pp_device_type: PP_DEVICE_TYPE_CPU asks for
   * the device "cpu" (host memory), the session's own type for the session's device (the
   * name it was created with); any other type finds nothing. The result lives as long as
   * the process. */
  const pp_operation* (*find_operation)(const void* ctx, const char* name, int32_t device,
                                        int32_t dtype);
  /* The plugin that provides `op` (for messages and --explain), never NULL. */
  const char* (*operation_provider)(const void* ctx, const pp_operation* op);
} pp_host_api;

/* --- "sdpa": scaled-dot-product attention ---------------------------------------------- */

#define PP_OPERATION_SDPA "sdpa"

typedef enum pp_sdpa_weighting {
  PP_SDPA_SOFTMAX = 0,
  /* The one-hot of each row's largest score, the first (lowest key index) on ties: as
   * torch.argmax and the host's explicit attention. */
  PP_SDPA_ARGMAX = 1
} pp_sdpa_weighting;

/* A batch of independent attention problems, indexed by (b0, b1, head):
 *   out[b0, b1, h] = weigh(scale * Q K^T, masked) V
 * with Q [q_len, head_dim], K [kv_len, head_dim], V [kv_len, v_dim], out [q_len, v_dim].
 * Two batch dimensions let a caller share one operand across the first (candidates that
 * share the keys and values of an unperturbed projection give stride 0 there) while the
 * second runs over samples.
 *
 * Each tensor is given by a pointer and four element strides: b0, b1, head, row; the
 * columns of a row are contiguous. A stride may be 0 (broadcast) for Q, K and V, never for
 * `out`, whose problems must not overlap. Every tensor is of `dtype` on `device`. */
typedef struct pp_sdpa_args {
  uint32_t struct_size;
  int32_t dtype;     /* pp_dtype: F32 or F64 as the operation declares */
  int32_t weighting; /* pp_sdpa_weighting */
  int32_t causal;    /* 1: query i sees keys j <= i (top-left, as PyTorch's is_causal); 0: all */
  int64_t b0, b1, heads;
  int64_t q_len, kv_len, head_dim, v_dim;
  double scale; /* usually 1 / sqrt(head_dim) */
  const void* q;
  int64_t q_strides[4];
  const void* k;
  int64_t k_strides[4];
  const void* v;
  int64_t v_strides[4];
  void* out;
  int64_t out_strides[4];
  int32_t threads; /* CPU: 1 = the calling thread only; 0 = the operation may use all the
                      process may use (callers already inside a parallel loop pass 1) */
  void* stream;    /* a device's native queue to run on, as pp_session_options.stream (a
                      cudaStream_t for "cuda"; NULL = the device's default queue, and NULL on
                      the cpu); the call returns once the work is queued */
} pp_sdpa_args;

typedef struct pp_sdpa_table {
  uint32_t struct_size;
  /* Computes the attention. PP_UNSUPPORTED (with the reason) for arguments it does not
   * serve (a dtype, a head size), so the caller computes it itself; PP_FAILED on bad
   * arguments. Never keeps a pointer past the call. */
  int (*run)(const pp_sdpa_args* args, struct pp_error* err);
} pp_sdpa_table;

/* --- "factored_correction": the shared factor of a factored subspace's correction ----- */

#define PP_OPERATION_FACTORED_CORRECTION "factored_correction"

/* A linear layer in a factored subspace computes x W^T + (x B^T) A^T for every candidate:
 * x W^T is the incumbent's, the candidates differ only in a few entries of A, and x B^T is
 * the factor they all share. This operation computes that factor for a layer's input x
 * and n directions (the rows of B, or any dense input directions of a subspace) at once:
 *   out[j, b] = sum_i dirs[j, i] x[b, i]     (j < n_dirs, b < samples, i < width)
 * i.e. (x B^T)^T, direction-major, the form a delta path reads it in. The caller then adds
 * each candidate's few terms theta (x B^T)[:, j] to the units its A-coordinates move.
 *
 * Rows are given by a pointer and an element stride (the columns of a row are contiguous);
 * every tensor is of `dtype` on the operation's device. The result depends on the shapes
 * and values only, never on `threads` (fixed work blocks), so a run is reproducible. */
typedef struct pp_factored_project_args {
  uint32_t struct_size;
  int32_t dtype; /* pp_dtype: F32 or F64 as the operation declares */
  int64_t samples, width, n_dirs;
  const void* x; /* [samples, width], row stride x_stride >= width */
  int64_t x_stride;
  const void* dirs; /* [n_dirs, width], row stride dirs_stride >= width */
  int64_t dirs_stride;
  void* out; /* [n_dirs, samples], row stride out_stride >= samples; must not overlap x, dirs */
  int64_t out_stride;
  int32_t threads; /* CPU: 1 = the calling thread only; 0 = all the process may use */
  void* stream;    /* a device's native queue to run on, as pp_session_options.stream (a
                      cudaStream_t for "cuda"; NULL = the device's default queue, and NULL on
                      the cpu); the call returns once the work is queued */
} pp_factored_project_args;

typedef struct pp_factored_correction_table {
  uint32_t struct_size;
  /* Computes `out`. PP_UNSUPPORTED (with the reason) for arguments it does not serve, so the
   * caller computes them itself; PP_FAILED on bad arguments. Never keeps a pointer past the
   * call. */
  int (*project)(const pp_factored_project_args* args, struct pp_error* err);
} pp_factored_correction_table;

#ifdef __cplusplus
}
#endif

#endif /* POLYPROBE_PLUGIN_OPERATIONS_H */
