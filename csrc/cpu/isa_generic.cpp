// The portable CPU kernels: 4-lane structs the compiler vectorises for the baseline of the
// build target (any processor, any architecture); see isa_impl.h.
#define EK_ISA_GENERIC
#define EK_ISA_NAMESPACE generic
#include "isa_impl.h"

namespace eagle_kernels {
namespace cpu {
const KernelTable& generic_kernels() {
  static const KernelTable table{"generic", generic::linear, generic::rms_norm,
                                 generic::silu_mul, generic::rope, generic::tree_attention,
                                 generic::decoder_layer, generic::soft_ce_forward,
                                 generic::soft_ce_backward,
                                 generic::topk_log_softmax, generic::eagle2_expand,
                                 generic::build_tree, generic::eagle2_rerank,
                                 generic::greedy_accept, generic::compact_kv,
                                 generic::record_tokens, generic::greedy_step};
  return table;
}
}  // namespace cpu
}  // namespace eagle_kernels
