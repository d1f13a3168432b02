// The CPU kernels for AVX-512 (F, VL, BW, DQ) with FMA: 16 fp32 lanes. Chosen at run time
// when the processor has them (cpu_bindings.cpp); see isa_impl.h.
#if defined(__x86_64__)
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c")
// GCC 12 flags its own _mm512_extractf64x4_pd (an intentionally undefined upper half).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#define EK_ISA_AVX512
#define EK_ISA_NAMESPACE avx512
#include "isa_impl.h"

namespace eagle_kernels {
namespace cpu {
const KernelTable& avx512_kernels() {
  static const KernelTable table{"avx512", avx512::linear, avx512::rms_norm, avx512::silu_mul,
                                 avx512::rope, avx512::tree_attention,
                                 avx512::decoder_layer, avx512::soft_ce_forward,
                                 avx512::soft_ce_backward,
                                 avx512::topk_log_softmax, avx512::eagle2_expand,
                                 avx512::build_tree, avx512::eagle2_rerank,
                                 avx512::greedy_accept, avx512::compact_kv,
                                 avx512::record_tokens, avx512::greedy_step};
  return table;
}
}  // namespace cpu
}  // namespace eagle_kernels
#endif
