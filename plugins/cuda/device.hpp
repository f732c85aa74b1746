// CUDA error checking and RAII owners for device memory, streams and cuBLAS handles.
// Every CUDA and cuBLAS call of the plugin goes through check(), so a failure becomes a
// C++ exception with the runtime's own error text, which pp::guard turns into a status at
// the ABI boundary.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace polyprobe::cuda {

// Thrown when a device allocation fails, so that callers can shrink a chunk and retry.
struct OutOfMemory : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  // Clear the sticky "last error" of a non-fatal failure so later calls do not see it.
  (void)cudaGetLastError();
  const std::string message = std::string("CUDA: ") + what + ": " + cudaGetErrorName(status) +
                              ": " + cudaGetErrorString(status);
  if (status == cudaErrorMemoryAllocation) throw OutOfMemory(message);
  throw std::runtime_error(message);
}

inline const char* cublas_status_text(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "architecture mismatch";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "mapping error";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "execution failed";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "internal error";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "not supported";
    default:
      return "unknown status";
  }
}

inline void check(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  const std::string message = std::string("cuBLAS: ") + what + ": " + cublas_status_text(status);
  if (status == CUBLAS_STATUS_ALLOC_FAILED) throw OutOfMemory(message);
  throw std::runtime_error(message);
}

// What the plugin's buffers hold on the device now and at most so far, in bytes (all
// sessions of the process; cuBLAS's own workspace is not counted). Host-thread only.
struct DeviceMemory {
  static std::size_t& live() {
    static std::size_t bytes = 0;
    return bytes;
  }
  static std::size_t& peak() {
    static std::size_t bytes = 0;
    return bytes;
  }
  static void add(std::size_t bytes) {
    live() += bytes;
    peak() = std::max(peak(), live());
  }
  static void remove(std::size_t bytes) { live() -= bytes; }
};

// Device memory for `n` elements of T; never copied, only moved.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t n) { resize(n); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }

  // Reallocates (contents lost) when `n` differs from the current size.
  void resize(std::size_t n) {
    if (n == size_) return;
    release();
    if (n == 0) return;
    void* p = nullptr;
    check(cudaMalloc(&p, n * sizeof(T)), "cudaMalloc");
    data_ = static_cast<T*>(p);
    size_ = n;
    DeviceMemory::add(n * sizeof(T));
  }
  // Grows only: chunk buffers are reused across calls.
  void reserve(std::size_t n) {
    if (n > size_) resize(n);
  }
  void upload(const T* host, std::size_t n, cudaStream_t stream) {
    resize(n);
    if (n > 0)
      check(cudaMemcpyAsync(data_, host, n * sizeof(T), cudaMemcpyHostToDevice, stream),
            "cudaMemcpyAsync host to device");
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  void release() noexcept {
    if (data_ != nullptr) {
      (void)cudaFree(data_);
      DeviceMemory::remove(size_ * sizeof(T));
    }
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

// A stream the session made itself (destroyed with it), or the host's (left alone).
class Stream {
 public:
  explicit Stream(void* external) {
    if (external != nullptr) {
      stream_ = static_cast<cudaStream_t>(external);
    } else {
      check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
      owned_ = true;
    }
  }
  ~Stream() {
    if (owned_) (void)cudaStreamDestroy(stream_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  void synchronize() const { check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

 private:
  cudaStream_t stream_ = nullptr;
  bool owned_ = false;
};

// A CUDA event for timing work on a stream (destroyed with the object).
class Event {
 public:
  Event() { check(cudaEventCreate(&event_), "cudaEventCreate"); }
  ~Event() {
    if (event_ != nullptr) (void)cudaEventDestroy(event_);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& o) noexcept : event_(std::exchange(o.event_, nullptr)) {}
  Event& operator=(Event&&) = delete;
  void record(cudaStream_t stream) { check(cudaEventRecord(event_, stream), "cudaEventRecord"); }
  // Milliseconds from `start` to this event; both must have completed.
  float since(const Event& start) const {
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, start.event_, event_), "cudaEventElapsedTime");
    return ms;
  }

 private:
  cudaEvent_t event_ = nullptr;
};

class Blas {
 public:
  explicit Blas(cudaStream_t stream) {
    check(cublasCreate(&handle_), "cublasCreate");
    check(cublasSetStream(handle_, stream), "cublasSetStream");
    // Candidates are compared by tiny loss differences: the default mode never trades
    // precision (no TF32 for float32), and atomics stay off, so GEMMs are reproducible.
    check(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
    check(cublasSetAtomicsMode(handle_, CUBLAS_ATOMICS_NOT_ALLOWED), "cublasSetAtomicsMode");
  }
  ~Blas() { (void)cublasDestroy(handle_); }
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

}  // namespace polyprobe::cuda
