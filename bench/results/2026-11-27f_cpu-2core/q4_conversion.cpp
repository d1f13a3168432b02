// Throughput of ways to turn Q4 levels into fp32 for a one-row GEMV (one core, data in L1; 4
// panels of 16 columns, 4 FMA chains as decoder_linear.h's one-row tile). Build and run:
//   g++ -O2 -march=native -o /tmp/q4 bench/results/2026-11-27f_cpu-2core/q4_conversion.cpp && /tmp/q4
// A: today's pack (16 bytes = 16 columns x 2 rows; vpmovzxbd, vpsrld, 2 vpermps, 2 FMA per 32 weights)
// B: 8 rows per dword lane (64 bytes = 16 columns x 8 rows; per row vpsrld + vpermps + FMA)
// C: the FMA chains alone; D / E: A / B with the magic-number conversion instead of vpermps
#include <immintrin.h>
#include <cstdio>
#include <cstdint>
#include <chrono>
alignas(64) uint8_t data[4 * 4096];
alignas(64) float xs[4096];
__attribute__((noinline)) __m512 run_a(int reps) {
  const __m512 levels = _mm512_setr_ps(-8,-7,-6,-5,-4,-3,-2,-1,0,1,2,3,4,5,6,7);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  for (int rep = 0; rep < reps; ++rep)
    for (int r = 0; r < 256; r += 2) {  // 256 rows, 4 panels of 16 columns
      const uint8_t* p = data + r / 2 * 16;
      __m512 xe = _mm512_set1_ps(xs[r]), xo = _mm512_set1_ps(xs[r + 1]);
#define PANEL(j, acc) { __m512i l = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(p + j * 4096))); \
      acc = _mm512_fmadd_ps(xe, _mm512_permutexvar_ps(l, levels), acc); \
      acc = _mm512_fmadd_ps(xo, _mm512_permutexvar_ps(_mm512_srli_epi32(l, 4), levels), acc); }
      PANEL(0, acc0) PANEL(1, acc1) PANEL(2, acc2) PANEL(3, acc3)
    }
  return _mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3));
}
__attribute__((noinline)) __m512 run_b(int reps) {
  const __m512 levels = _mm512_setr_ps(-8,-7,-6,-5,-4,-3,-2,-1,0,1,2,3,4,5,6,7);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  for (int rep = 0; rep < reps; ++rep)
    for (int r = 0; r < 256; r += 8) {
      const uint8_t* p = data + r / 8 * 64;
#define PANELB(j, acc) { __m512i w = _mm512_loadu_si512((const void*)(p + j * 4096)); \
      for (int i = 0; i < 8; ++i) { \
        acc = _mm512_fmadd_ps(_mm512_set1_ps(xs[r + i]), _mm512_permutexvar_ps(w, levels), acc); \
        w = _mm512_srli_epi32(w, 4); } }
      PANELB(0, acc0) PANELB(1, acc1) PANELB(2, acc2) PANELB(3, acc3)
    }
  return _mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3));
}
__attribute__((noinline)) __m512 run_c(int reps) {  // pure FMA chain bound: 4 accs, 1 FMA per 16 weights
  __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  const __m512 w = _mm512_set1_ps(1.0f);
  for (int rep = 0; rep < reps; ++rep)
    for (int r = 0; r < 256; ++r) {
      __m512 x = _mm512_set1_ps(xs[r]);
      acc0 = _mm512_fmadd_ps(x, w, acc0); acc1 = _mm512_fmadd_ps(x, w, acc1);
      acc2 = _mm512_fmadd_ps(x, w, acc2); acc3 = _mm512_fmadd_ps(x, w, acc3);
    }
  return _mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3));
}

__attribute__((noinline)) __m512 run_d(int reps) {  // today's pack, magic-number conversion (no vpermps)
  const __m512i mask = _mm512_set1_epi32(0xF), magic = _mm512_set1_epi32(0x4B000000);
  const __m512 bias = _mm512_set1_ps(8388608.0f + 8.0f);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  for (int rep = 0; rep < reps; ++rep)
    for (int r = 0; r < 256; r += 2) {
      const uint8_t* p = data + r / 2 * 16;
      __m512 xe = _mm512_set1_ps(xs[r]), xo = _mm512_set1_ps(xs[r + 1]);
#define PANELD(j, acc) { __m512i l = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(p + j * 4096))); \
      __m512 even = _mm512_sub_ps(_mm512_castsi512_ps(_mm512_ternarylogic_epi32(l, mask, magic, 0xEA)), bias); \
      __m512 odd = _mm512_sub_ps(_mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_srli_epi32(l, 4), mask, magic, 0xEA)), bias); \
      acc = _mm512_fmadd_ps(xe, even, acc); acc = _mm512_fmadd_ps(xo, odd, acc); }
      PANELD(0, acc0) PANELD(1, acc1) PANELD(2, acc2) PANELD(3, acc3)
    }
  return _mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3));
}
__attribute__((noinline)) __m512 run_e(int reps) {  // 8 rows a dword, magic-number conversion
  const __m512i mask = _mm512_set1_epi32(0xF), magic = _mm512_set1_epi32(0x4B000000);
  const __m512 bias = _mm512_set1_ps(8388608.0f + 8.0f);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  for (int rep = 0; rep < reps; ++rep)
    for (int r = 0; r < 256; r += 8) {
      const uint8_t* p = data + r / 8 * 64;
#define PANELE(j, acc) { __m512i w = _mm512_loadu_si512((const void*)(p + j * 4096)); \
      for (int i = 0; i < 8; ++i) { \
        __m512 lv = _mm512_sub_ps(_mm512_castsi512_ps(_mm512_ternarylogic_epi32(w, mask, magic, 0xEA)), bias); \
        acc = _mm512_fmadd_ps(_mm512_set1_ps(xs[r + i]), lv, acc); \
        w = _mm512_srli_epi32(w, 4); } }
      PANELE(0, acc0) PANELE(1, acc1) PANELE(2, acc2) PANELE(3, acc3)
    }
  return _mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3));
}
int main() {
  for (int i = 0; i < 4 * 4096; ++i) data[i] = (uint8_t)(i * 37);
  for (int i = 0; i < 4096; ++i) xs[i] = 0.001f * (i % 7);
  const int reps = 200000;
  float sink = 0;
  for (int round = 0; round < 3; ++round) {
    for (int which = 0; which < 5; ++which) {
      auto t0 = std::chrono::steady_clock::now();
      uint64_t c0 = __rdtsc();
      __m512 v = which == 0 ? run_a(reps) : which == 1 ? run_b(reps) : which == 2 ? run_c(reps) : which == 3 ? run_d(reps) : run_e(reps);
      uint64_t c1 = __rdtsc();
      auto t1 = std::chrono::steady_clock::now();
      sink += _mm512_reduce_add_ps(v);
      double ns = std::chrono::duration<double, std::nano>(t1 - t0).count();
      double weights = double(reps) * 256 * 64;  // 256 rows x 64 columns
      printf("%s: %.2f G weights/s, %.3f ns per 16 weights, %.2f TSC cycles per 16 weights\n",
             which == 0 ? "A today (vpmovzxbd + 2 vpermps per 32)" : which == 1 ? "B 8 rows a dword (1 vpermps per 16)" : which == 2 ? "C FMA only (4 chains)" : which == 3 ? "D today's pack, magic number" : "E 8 rows a dword, magic number",
             weights / ns, ns / (weights / 16), double(c1 - c0) / (weights / 16));
    }
  }
  return sink == 12345.0f;
}
