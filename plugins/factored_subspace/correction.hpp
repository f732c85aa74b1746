// The "factored_correction" operation (plugin/operations.h): x B^T for a layer's input and
// all of its subspace directions at once, the factor every candidate of a factored subspace
// shares. The CPU version is a blocked GEMM (Eigen, oneTBB over fixed blocks of samples); the
// CUDA one, built only with CUDA (POLYPROBE_FACTORED_CUDA), is cuBLAS's GEMM on the caller's
// stream.
//
// correction_cpu.cpp is compiled for the instruction set of POLYPROBE_FACTORED_SUBSPACE_ARCH
// and includes none of the SDK's inline helpers, so no code of that instruction set can leak
// into the rest of the plugin (which any x86-64 CPU runs: the subspace itself).
#pragma once

#include <polyprobe/plugin/abi.h>

#include <string>

namespace polyprobe::factored {

// Empty when the arguments describe a valid projection, else what is wrong with them.
std::string project_args_error(const pp_factored_project_args& args);

// Empty when this CPU has the instruction set correction_cpu.cpp was compiled for, else why
// not (the operation is then not offered on the CPU; the subspace still is).
std::string cpu_unusable_reason();
// Computes args.out on the CPU (float32 or float64), for arguments project_args_error
// accepts. Thread-safe; the result does not depend on args.threads.
void project_cpu(const pp_factored_project_args& args);

#ifdef POLYPROBE_FACTORED_CUDA
// Queues the projection (device pointers, arguments project_args_error accepts) on
// args.stream. Throws std::runtime_error on a CUDA or cuBLAS error.
void project_cuda(const pp_factored_project_args& args);
#endif

}  // namespace polyprobe::factored
