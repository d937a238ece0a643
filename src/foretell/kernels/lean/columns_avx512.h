// BF16X and I8X on AVX-512 (the instruction set's switch: lean_avx512).
#pragma once

#include "common.h"

namespace {

// The same products on AVX-512 (where the CPU has it): one 16-lane FMA per row and input where AVX2 needs two, and
// 32 registers, so up to 16 rows share one pass over the weights. Every column's sum is the same chain of FMAs over
// k as group_x16's, so both give the same bits (lean_avx512 switches, for that test). BF16X's packing order
// (columns 0-3, 8-11, 4-7, 12-15, for AVX2's in-lane unpacks) is undone once, at the store.
bool avx512_on = __builtin_cpu_supports("avx512f");

template <int R, bool INT8>
__attribute__((target("avx512f"))) void group_x16_avx512(const Proj& p, int64_t g, const float* x, float* y,
                                                          int64_t y_stride, const void* next) {
  static_assert(R >= 1 && R <= 16, "16 sums, the weights and a broadcast");
  constexpr int64_t bytes = INT8 ? 16 : 32;
  const uint8_t* w = (INT8 ? p.codes : reinterpret_cast<const uint8_t*>(p.half)) + g * p.K * bytes;
  const int64_t K = p.K;
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0, a9 = a0,
         a10 = a0, a11 = a0, a12 = a0, a13 = a0, a14 = a0, a15 = a0;
  const int64_t line_every = 64 / bytes;
  for (int64_t k = 0; k < K; ++k) {
    if (next && k % line_every == 0)
      _mm_prefetch(static_cast<const char*>(next) + bytes * k, _MM_HINT_T1);
    __m512 wk;
    if constexpr (INT8)
      wk = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + bytes * k))));
    else
      wk = _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + bytes * k))), 16));
#define FORETELL_X16_ROW512(r) \
  if constexpr (R > r) a##r = _mm512_fmadd_ps(_mm512_set1_ps(x[r * K + k]), wk, a##r);
    FORETELL_X16_ROW512(0) FORETELL_X16_ROW512(1) FORETELL_X16_ROW512(2) FORETELL_X16_ROW512(3)
    FORETELL_X16_ROW512(4) FORETELL_X16_ROW512(5) FORETELL_X16_ROW512(6) FORETELL_X16_ROW512(7)
    FORETELL_X16_ROW512(8) FORETELL_X16_ROW512(9) FORETELL_X16_ROW512(10) FORETELL_X16_ROW512(11)
    FORETELL_X16_ROW512(12) FORETELL_X16_ROW512(13) FORETELL_X16_ROW512(14) FORETELL_X16_ROW512(15)
#undef FORETELL_X16_ROW512
  }
  const __m512 acc[16] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15};
  const __m512i order = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15);
  const __m512 scales = INT8 ? _mm512_loadu_ps(p.scales + 16 * g) : _mm512_setzero_ps();
  for (int r = 0; r < R; ++r) {
    const __m512 v = INT8 ? _mm512_mul_ps(acc[r], scales) : _mm512_permutexvar_ps(order, acc[r]);
    _mm512_storeu_ps(y + r * y_stride + 16 * g, v);
  }
}

bool lean_avx512(bool on) {
  avx512_on = on && __builtin_cpu_supports("avx512f");
  return avx512_on;
}

}  // namespace
