/**
 * @file binding_utils.h
 * @brief Helpers shared by the pybind11 registration files (host compiler only).
 *
 * Python passes tensors as raw addresses (``tensor.data_ptr()``) and streams as raw handles
 * (``torch.cuda.Stream.cuda_stream``), both Python ints: csrc/ never sees a torch type, so it
 * builds with plain nvcc + pybind11. The Python ops validate dtype, shape, device and
 * contiguity once; these helpers only turn those ints back into pointers, check sizes, select
 * the tensors' device and turn CUDA errors into Python exceptions.
 */
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include <cuda_runtime.h>
#include <pybind11/pybind11.h>

namespace eagle_kernels {
namespace bindings {

/// Address (a Python int from Tensor.data_ptr()) -> typed pointer.
template <typename T>
T* as_ptr(std::uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

/// Stream handle (a Python int from torch.cuda.Stream.cuda_stream; 0 = legacy default stream).
inline cudaStream_t as_stream(std::uintptr_t handle) {
  return reinterpret_cast<cudaStream_t>(handle);
}

/// Raise ValueError when a size check (tree::size_error, ...) returned a message.
inline void check_sizes(const char* error) {
  if (error != nullptr) throw pybind11::value_error(error);
}

/// Raise RuntimeError with the CUDA error string when `status` is not cudaSuccess.
inline void check_cuda(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  cudaGetLastError();  // clear the (non-sticky) error so later calls start clean
  throw std::runtime_error(std::string(what) + ": CUDA error: " + cudaGetErrorString(status));
}

/**
 * @brief Make the device that owns `device_pointer` current for this scope, then restore.
 *
 * The module links its own static CUDA runtime, whose current device is not torch's: without
 * this a tensor on cuda:1 would be launched against device 0. Also rejects host pointers with
 * ValueError instead of letting the kernel fault.
 */
class DeviceGuard {
 public:
  DeviceGuard(const void* device_pointer, const char* what) {
    cudaPointerAttributes attributes{};
    check_cuda(cudaPointerGetAttributes(&attributes, device_pointer), what);
    if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged) {
      throw pybind11::value_error(std::string(what) + ": expected CUDA device memory "
                                  "(use the *_host entry points for CPU tensors)");
    }
    check_cuda(cudaGetDevice(&previous_), what);
    if (attributes.device != previous_) check_cuda(cudaSetDevice(attributes.device), what);
    switched_ = attributes.device != previous_;
  }
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

}  // namespace bindings

/// One registration function per op family (each in its own <family>_bindings.cpp).
void register_tree(pybind11::module_& module);
void register_acceptance(pybind11::module_& module);
void register_topk(pybind11::module_& module);
void register_kv(pybind11::module_& module);
void register_sampling(pybind11::module_& module);
void register_attention(pybind11::module_& module);

}  // namespace eagle_kernels
