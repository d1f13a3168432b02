/**
 * @file isa_impl.h
 * @brief The body of every isa_<name>.cpp: the kernels of one instruction set and their table.
 *
 * The including file defines EK_ISA_<NAME>, EK_ISA_NAMESPACE and EK_ISA_LABEL, enables the
 * instruction set (`#pragma GCC target`) and includes <immintrin.h> first. All kernel code then
 * lives in that namespace (see simd.h for why nothing from the standard library is called).
 */
#include <omp.h>

#include <cstdint>

#include "kernels.h"

namespace eagle_kernels {
namespace cpu {
namespace EK_ISA_NAMESPACE {
#include "simd.h"
#include "decoder_linear.h"
#include "linear_int8.h"
#include "decoder.h"
#include "attention.h"
#include "decoder_layer.h"
#include "loss.h"
#include "topk.h"
#include "tree.h"
#include "acceptance.h"
#include "kv.h"
}  // namespace EK_ISA_NAMESPACE
}  // namespace cpu
}  // namespace eagle_kernels
