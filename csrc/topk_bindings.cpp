/**
 * @file topk_bindings.cpp
 * @brief Python bindings of the topk op family (csrc/topk.cu). Nothing registered yet.
 */
#include <pybind11/pybind11.h>

#include "binding_utils.h"

namespace eagle_kernels {

void register_topk(pybind11::module_& module) { static_cast<void>(module); }

}  // namespace eagle_kernels
