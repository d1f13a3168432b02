/**
 * @file bindings.cpp
 * @brief The eagle_kernels._C module: one register_<family>() call per op family.
 *
 * Each family's functions are registered in its own <family>_bindings.cpp. GPU launchers take
 * device addresses and a stream handle and return as soon as the kernel is queued; the *_host
 * twins run the same per-tree / per-path code on CPU addresses (how CI checks the kernels
 * without a GPU). source_digests() says which sources were compiled in (a GPU verdict proves
 * one set of sources; see csrc/source_digests.py, which generates source_digests.h).
 */
#include <pybind11/pybind11.h>

#include "binding_utils.h"
#include "source_digests.h"

PYBIND11_MODULE(_C, module) {
  module.doc() = "eagle_kernels CUDA kernels (csrc/): raw-pointer launchers and host twins";
  eagle_kernels::register_tree(module);
  eagle_kernels::register_acceptance(module);
  eagle_kernels::register_topk(module);
  eagle_kernels::register_kv(module);
  eagle_kernels::register_sampling(module);
  eagle_kernels::register_attention(module);
  module.def(
      "source_digests",
      [] {
        pybind11::dict digests;
        for (const auto& row : eagle_kernels::kSourceDigests) digests[row[0]] = row[1];
        return digests;
      },
      "{function name: digest of the csrc sources of its op family} as compiled into this "
      "module (csrc/source_digests.py).");
}
