/**
 * @file simd.h
 * @brief One fp32 vector type per instruction set, with the few operations the CPU kernels use.
 *
 * Included by the kernel headers INSIDE an instruction-set namespace (see isa_avx512.cpp,
 * isa_avx2.cpp, isa_generic.cpp): each translation unit defines exactly one of EK_ISA_AVX512,
 * EK_ISA_AVX2 or EK_ISA_GENERIC and enables that instruction set with `#pragma GCC target`
 * before including <immintrin.h>. Nothing here may call an inline function of the standard
 * library: such a function would be compiled once per instruction set under one linker name,
 * and the linker could hand the AVX-512 copy to an AVX2 machine. Only intrinsics, builtins and
 * functions of this namespace are used.
 *
 * Every reduction the kernels do has ONE fixed order per instruction set (documented at each
 * function): this is what makes a token's result independent of how many tokens are computed
 * with it (row invariance), and so greedy speculative decoding bit-exact.
 */

#define EK_INLINE inline __attribute__((always_inline))

#if defined(EK_ISA_AVX512)

constexpr int kW = 16;  ///< fp32 lanes per vector
using vf = __m512;

EK_INLINE __mmask16 lane_mask(int n) { return static_cast<__mmask16>((1u << n) - 1u); }
EK_INLINE vf vzero() { return _mm512_setzero_ps(); }
EK_INLINE vf vset1(float x) { return _mm512_set1_ps(x); }
EK_INLINE vf vload(const float* p) { return _mm512_loadu_ps(p); }
/// First `n` lanes from `p` (0 <= n <= kW), the others zero; never touches p[n..).
EK_INLINE vf vload_n(const float* p, int n) { return _mm512_maskz_loadu_ps(lane_mask(n), p); }
/// kW bf16 values from `p`, widened exactly to fp32 (a bf16 is the top half of an fp32).
EK_INLINE vf vload_bf16(const uint16_t* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
/// A Q4 block's per-column scales (decoder.h kQ4BlockBytes: a = kQ4LowScale d for columns 0-7,
/// kQ4HighScale d for 8-15, c = m - a, both exact) in the form this instruction set rebuilds
/// weights from (see vq4_weights).
struct Q4Scales {
  vf scale, offset;
};
EK_INLINE Q4Scales vq4_scales(const float* a, const float* c, int v) {
  (void)v;  // one vector holds all 16 columns
  return {vload(a), vload(c)};
}
/// Vector `v` of the weights of one row of a Q4 block: its 8 bytes at `p` hold column j's q in
/// byte j's low nibble and column j + 8's in its high nibble. One in-lane byte shuffle puts byte
/// j into bits 16..23 of lane j < 8 (its low nibble at mantissa bits 16..19) and byte j - 8 into
/// bits 8..15 of lane j >= 8 (its high nibble at bits 12..15); one ternary-logic op keeps that
/// nibble and sets 1.0f's exponent: f = 1 + q / 2^7 or 1 + q / 2^11 exactly, no conversion.
/// fma(a, f, c) = fl(a + d q + m - a) rounds the exact d * q + m once, as the GGUF conversion
/// did: the fp32 pack's weight bit for bit. (A byte shuffle cannot put a high nibble at bits
/// 16..19; the cross-lane widen and variable shift this replaces cost one more vector op per 16
/// weights: Zen 5, one row, Q4 from DRAM, 0.35 -> 0.29 ms over 30 MLP weights.)
EK_INLINE vf vq4_weights(Q4Scales k, const uint8_t* p, int v) {
  (void)v;
  int64_t row;
  __builtin_memcpy(&row, p, 8);
  const __m512i placement = _mm512_setr_epi32(  // per byte: source byte, or 0x80 (zero)
      0x80008080, 0x80018080, 0x80028080, 0x80038080, 0x80048080, 0x80058080, 0x80068080,
      0x80078080, 0x80800080, 0x80800180, 0x80800280, 0x80800380, 0x80800480, 0x80800580,
      0x80800680, 0x80800780);
  const __m512i nibble = _mm512_setr_epi32(0xF0000, 0xF0000, 0xF0000, 0xF0000, 0xF0000, 0xF0000,
                                           0xF0000, 0xF0000, 0xF000, 0xF000, 0xF000, 0xF000,
                                           0xF000, 0xF000, 0xF000, 0xF000);
  const __m512i placed = _mm512_shuffle_epi8(_mm512_set1_epi64(row), placement);
  const __m512i unit = _mm512_ternarylogic_epi32(  // (placed & nibble) | 0x3F800000
      placed, nibble, _mm512_set1_epi32(0x3F800000), 0xEA);
  return _mm512_fmadd_ps(k.scale, _mm512_castsi512_ps(unit), k.offset);
}
/// kW int8 values from `p`, as exact fp32.
EK_INLINE vf vload_q8(const int8_t* p) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes));
}
EK_INLINE void vstore(float* p, vf v) { _mm512_storeu_ps(p, v); }
EK_INLINE void vstore_n(float* p, vf v, int n) { _mm512_mask_storeu_ps(p, lane_mask(n), v); }
EK_INLINE vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
EK_INLINE vf vsub(vf a, vf b) { return _mm512_sub_ps(a, b); }
EK_INLINE vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
EK_INLINE vf vdiv(vf a, vf b) { return _mm512_div_ps(a, b); }
EK_INLINE vf vmax(vf a, vf b) { return _mm512_max_ps(a, b); }
EK_INLINE vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
/// Lanes where a < b take `if_less`, the others `otherwise`.
EK_INLINE vf vselect_less(vf a, vf b, vf if_less, vf otherwise) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), otherwise, if_less);
}
/// 2^n for integral-valued n in [-126, 127].
EK_INLINE vf vexp2_int(vf n) {
  __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_castsi512_ps(bits);
}
EK_INLINE vf vround(vf x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
/// Sum of the lanes, always in this order: lanes i and i+8 first, then the AVX2 tree below.
EK_INLINE float vhsum(vf v) {
  __m256 lo = _mm512_castps512_ps256(v);
  __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  __m256 s8 = _mm256_add_ps(lo, hi);
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}
EK_INLINE float vhmax(vf v) { return _mm512_reduce_max_ps(v); }
/// Bit i set where !(a[i] <= b[i]): a above b, or either of them NaN.
EK_INLINE unsigned vmask_not_le(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_NLE_UQ); }

/// Vectors whose sums vhsum_block forms at once (attention.h's key blocks).
constexpr int kSumBlock = 16;
/// The slot of vhsum_block's input whose sum lands at output j: the levels below leave vector
/// s's sum in lane 4 (s % 4) + s / 4, a 4 x 4 transpose (its own inverse).
constexpr int sum_slot(int j) { return j % 4 * 4 + j / 4; }
/// out[j] = vhsum(v[sum_slot(j)]) * scale for j < kSumBlock, bit for bit: the very additions of
/// vhsum (lane i + lane i + 8, then + 4, + 2, + 1, the lower operand first), for 16 vectors in
/// 15 vector adds and 30 in-register shuffles instead of 16 extract-and-add ladders (~140
/// instructions). Each level halves the partial sums of two vectors at once and packs the two
/// halves into one vector.
EK_INLINE void vhsum_block(const vf* v, float scale, float* out) {
  vf half[8], quarter[4], eighth[2];
  for (int i = 0; i < 8; ++i)  // lanes i + (i + 8) of v[2i] | of v[2i + 1]
    half[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                            _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)  // + 4: 128-bit blocks 0 + 1 and 2 + 3 of each
    quarter[i] = _mm512_add_ps(_mm512_shuffle_f32x4(half[2 * i], half[2 * i + 1], 0x88),
                               _mm512_shuffle_f32x4(half[2 * i], half[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i)  // + 2 within each 128-bit block
    eighth[i] = _mm512_add_ps(_mm512_shuffle_ps(quarter[2 * i], quarter[2 * i + 1], 0x44),
                              _mm512_shuffle_ps(quarter[2 * i], quarter[2 * i + 1], 0xEE));
  const vf sums = _mm512_add_ps(_mm512_shuffle_ps(eighth[0], eighth[1], 0x88),  // + 1
                                _mm512_shuffle_ps(eighth[0], eighth[1], 0xDD));
  _mm512_storeu_ps(out, _mm512_mul_ps(sums, _mm512_set1_ps(scale)));
}

#elif defined(EK_ISA_AVX2)

constexpr int kW = 8;
using vf = __m256;

EK_INLINE __m256i lane_mask(int n) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lanes);
}
EK_INLINE vf vzero() { return _mm256_setzero_ps(); }
EK_INLINE vf vset1(float x) { return _mm256_set1_ps(x); }
EK_INLINE vf vload(const float* p) { return _mm256_loadu_ps(p); }
EK_INLINE vf vload_n(const float* p, int n) { return _mm256_maskload_ps(p, lane_mask(n)); }
EK_INLINE vf vload_bf16(const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
/// Vector `v` of the 16 4-bit values packed in the 8 bytes at `p` (byte j: value j in its low
/// nibble, value j + 8 in its high nibble), as exact fp32 (0..15).
EK_INLINE vf vload_q4(const uint8_t* p, int v) {
  const __m128i packed = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  const __m256i bytes = _mm256_cvtepu8_epi32(packed);
  const __m256i values = v == 0 ? _mm256_and_si256(bytes, _mm256_set1_epi32(15))
                                : _mm256_srli_epi32(bytes, 4);
  return _mm256_cvtepi32_ps(values);
}
EK_INLINE vf vload_q8(const int8_t* p) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
}
EK_INLINE void vstore(float* p, vf v) { _mm256_storeu_ps(p, v); }
EK_INLINE void vstore_n(float* p, vf v, int n) { _mm256_maskstore_ps(p, lane_mask(n), v); }
EK_INLINE vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
EK_INLINE vf vsub(vf a, vf b) { return _mm256_sub_ps(a, b); }
EK_INLINE vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
EK_INLINE vf vdiv(vf a, vf b) { return _mm256_div_ps(a, b); }
EK_INLINE vf vmax(vf a, vf b) { return _mm256_max_ps(a, b); }
EK_INLINE vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
EK_INLINE vf vselect_less(vf a, vf b, vf if_less, vf otherwise) {
  return _mm256_blendv_ps(otherwise, if_less, _mm256_cmp_ps(a, b, _CMP_LT_OQ));
}
EK_INLINE vf vexp2_int(vf n) {
  __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_castsi256_ps(bits);
}
EK_INLINE vf vround(vf x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
/// Sum of the lanes, always in this order: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)).
EK_INLINE float vhsum(vf v) {
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}
EK_INLINE float vhmax(vf v) {
  __m128 s4 = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  __m128 s2 = _mm_max_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_max_ss(s2, _mm_movehdup_ps(s2)));
}
EK_INLINE unsigned vmask_not_le(vf a, vf b) {
  return static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_NLE_UQ)));
}

#elif defined(EK_ISA_GENERIC)

// Portable fallback: a 4-lane struct the compiler may vectorise however it likes, because every
// lane is computed independently and every cross-lane sum has the fixed order below.
constexpr int kW = 4;
struct vf {
  float l[4];
};

EK_INLINE vf vzero() { return vf{{0.f, 0.f, 0.f, 0.f}}; }
EK_INLINE vf vset1(float x) { return vf{{x, x, x, x}}; }
EK_INLINE vf vload(const float* p) { return vf{{p[0], p[1], p[2], p[3]}}; }
EK_INLINE vf vload_n(const float* p, int n) {
  vf r = vzero();
  for (int i = 0; i < n; ++i) r.l[i] = p[i];
  return r;
}
EK_INLINE vf vload_bf16(const uint16_t* p) {
  vf r;
  for (int i = 0; i < 4; ++i) {
    const uint32_t bits = static_cast<uint32_t>(p[i]) << 16;
    __builtin_memcpy(&r.l[i], &bits, 4);
  }
  return r;
}
EK_INLINE vf vload_q4(const uint8_t* p, int v) {
  vf r;
  for (int i = 0; i < 4; ++i) {
    const int byte = (v % 2) * 4 + i;
    r.l[i] = static_cast<float>(v < 2 ? p[byte] & 15 : p[byte] >> 4);
  }
  return r;
}
EK_INLINE vf vload_q8(const int8_t* p) {
  return vf{{static_cast<float>(p[0]), static_cast<float>(p[1]), static_cast<float>(p[2]),
             static_cast<float>(p[3])}};
}
EK_INLINE void vstore(float* p, vf v) { for (int i = 0; i < 4; ++i) p[i] = v.l[i]; }
EK_INLINE void vstore_n(float* p, vf v, int n) { for (int i = 0; i < n; ++i) p[i] = v.l[i]; }
#define EK_GENERIC_BINARY(name, expr)                              \
  EK_INLINE vf name(vf a, vf b) {                                  \
    vf r;                                                          \
    for (int i = 0; i < 4; ++i) { float x = a.l[i], y = b.l[i]; r.l[i] = (expr); } \
    return r;                                                      \
  }
EK_GENERIC_BINARY(vadd, x + y)
EK_GENERIC_BINARY(vsub, x - y)
EK_GENERIC_BINARY(vmul, x * y)
EK_GENERIC_BINARY(vdiv, x / y)
EK_GENERIC_BINARY(vmax, x > y ? x : y)
#undef EK_GENERIC_BINARY
EK_INLINE vf vfma(vf a, vf b, vf c) {
  vf r;
  for (int i = 0; i < 4; ++i) r.l[i] = __builtin_fmaf(a.l[i], b.l[i], c.l[i]);
  return r;
}
EK_INLINE vf vselect_less(vf a, vf b, vf if_less, vf otherwise) {
  vf r;
  for (int i = 0; i < 4; ++i) r.l[i] = a.l[i] < b.l[i] ? if_less.l[i] : otherwise.l[i];
  return r;
}
EK_INLINE vf vexp2_int(vf n) {
  vf r;
  for (int i = 0; i < 4; ++i) {
    // A NaN lane (vexp of NaN: its polynomial is NaN too, so the product stays NaN, as on the
    // vector ISAs) must not reach the int conversion: converting NaN is undefined in C++.
    const int power = n.l[i] == n.l[i] ? static_cast<int>(n.l[i]) : 0;
    const int bits = (power + 127) << 23;
    __builtin_memcpy(&r.l[i], &bits, sizeof(float));
  }
  return r;
}
EK_INLINE vf vround(vf x) {
  vf r;
  for (int i = 0; i < 4; ++i) r.l[i] = __builtin_nearbyintf(x.l[i]);
  return r;
}
/// Sum of the lanes, always in this order: (l0+l2) + (l1+l3).
EK_INLINE float vhsum(vf v) { return (v.l[0] + v.l[2]) + (v.l[1] + v.l[3]); }
EK_INLINE float vhmax(vf v) {
  float a = v.l[0] > v.l[2] ? v.l[0] : v.l[2];
  float b = v.l[1] > v.l[3] ? v.l[1] : v.l[3];
  return a > b ? a : b;
}
EK_INLINE unsigned vmask_not_le(vf a, vf b) {
  unsigned bits = 0;
  for (int i = 0; i < 4; ++i) bits |= (a.l[i] <= b.l[i] ? 0u : 1u) << i;
  return bits;
}

#else
#error "define one of EK_ISA_AVX512, EK_ISA_AVX2, EK_ISA_GENERIC before including simd.h"
#endif

#if !defined(EK_ISA_AVX512)
/// vhsum_block's contract without a batched form: one vhsum per vector, in blocks of 8 (the
/// key blocks of attention.h: 8 chains in flight; 16 ymm registers hold no more).
constexpr int kSumBlock = 8;
constexpr int sum_slot(int j) { return j; }
EK_INLINE void vhsum_block(const vf* v, float scale, float* out) {
  for (int j = 0; j < kSumBlock; ++j) out[j] = vhsum(v[j]) * scale;
}

/// A Q4 block's per-column scales (decoder.h kQ4BlockBytes: a = kQ4LowScale d for columns 0-7,
/// kQ4HighScale d for 8-15, c = m - a, both exact) as d = a / scale and m = a + c (both exact
/// again: a power-of-two division, and c was exact), so that vq4_weights is the GGUF
/// conversion's fma(d, q, m), one rounding: the fp32 pack's weight bit for bit. (AVX-512
/// rebuilds from a and c directly, see its vq4_weights: the same values.) Vector v holds
/// columns [v kW, (v + 1) kW): low-nibble columns while v kW < 8.
struct Q4Scales {
  vf scale, offset;
};
EK_INLINE Q4Scales vq4_scales(const float* a, const float* c, int v) {
  const vf scaled_d = vload(a);
  const float inverse = v * kW < 8 ? 1.0f / kQ4LowScale : 1.0f / kQ4HighScale;
  return {vmul(scaled_d, vset1(inverse)), vadd(scaled_d, vload(c))};
}
EK_INLINE vf vq4_weights(Q4Scales k, const uint8_t* p, int v) {
  return vfma(k.scale, vload_q4(p, v), k.offset);
}
#endif

/**
 * @brief e^x per lane (Cephes-style: x = n ln2 + r, |r| <= ln2 / 2, degree-6 polynomial;
 *        about 2 ulp). Lanes below -87.3 give exactly 0 (also -inf), lanes above 88 give
 *        e^88: the kernels only exponentiate values <= 0 (softmax) and -x of SiLU.
 */
EK_INLINE vf vexp(vf x) {
  const vf hi = vset1(88.0f), lo = vset1(-87.3f);
  const vf xc = vselect_less(hi, x, hi, vselect_less(x, lo, lo, x));
  const vf n = vround(vmul(xc, vset1(1.44269504088896341f)));
  vf r = vsub(xc, vmul(n, vset1(0.693359375f)));
  r = vsub(r, vmul(n, vset1(-2.12194440e-4f)));
  vf p = vset1(1.9875691500e-4f);
  p = vfma(p, r, vset1(1.3981999507e-3f));
  p = vfma(p, r, vset1(8.3334519073e-3f));
  p = vfma(p, r, vset1(4.1665795894e-2f));
  p = vfma(p, r, vset1(1.6666665459e-1f));
  p = vfma(p, r, vset1(5.0000001201e-1f));
  p = vfma(p, vmul(r, r), vadd(r, vset1(1.0f)));
  return vselect_less(x, lo, vzero(), vmul(p, vexp2_int(n)));
}

/// Lanes [0, n) of p, the others -inf (so their exponentials are exactly 0); never reads p[n..).
EK_INLINE vf load_or_minus_inf(const float* p, int n) {
  float lanes[kW];
  for (int i = 0; i < kW; ++i) lanes[i] = i < n ? p[i] : -__builtin_inff();
  return vload(lanes);
}
