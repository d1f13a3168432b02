// The CPU kernels for AVX2 with FMA: 8 fp32 lanes. Chosen at run time when the processor has
// them and no AVX-512 (cpu_bindings.cpp); see isa_impl.h.
#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>
#define EK_ISA_AVX2
#define EK_ISA_NAMESPACE avx2
#include "isa_impl.h"

namespace eagle_kernels {
namespace cpu {
const KernelTable& avx2_kernels() {
  static const KernelTable table{"avx2", avx2::linear, avx2::rms_norm, avx2::silu_mul,
                                 avx2::rope, avx2::tree_attention,
                                 avx2::decoder_layer, avx2::soft_ce_forward,
                                 avx2::soft_ce_backward,
                                 avx2::topk_log_softmax, avx2::eagle2_expand,
                                 avx2::build_tree, avx2::eagle2_rerank,
                                 avx2::greedy_accept, avx2::compact_kv,
                                 avx2::record_tokens, avx2::greedy_step};
  return table;
}
}  // namespace cpu
}  // namespace eagle_kernels
#endif
