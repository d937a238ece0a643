// The lean kernels' shared parts: the projection kinds, a projection as the products read it (Proj), small
// vector helpers, and how a product splits a pass's rows into passes of a compile-time size.
#pragma once

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

// The projection kinds, numbered as kernels/__init__.py numbers them; kinds.h has a row for each
enum Kind : int64_t { Q4 = 0, Q8 = 1, F32 = 2, Q4X = 3, Q8X = 4, BF16 = 5, BF16X = 6, I8X = 7, BF16A = 8, GGUF = 9,
                      KQ4X = 10, KQ6X = 11 };

// One part of a GGUF projection: its rows first .. first + rows - 1, each row_bytes of the file's blocks from base
struct GgufPart {
  int64_t type, first, rows, row_bytes;
  const uint8_t* base;
};
constexpr int64_t GGUF_MAX_PARTS = 8;

struct Proj {
  int64_t kind, N, K;
  const uint8_t* codes = nullptr;  // Q4, Q8, I8X
  const float* scales = nullptr;   // Q4: dm pairs; Q8: d; I8X: a scale per output column
  const float* dense = nullptr;    // F32
  const uint16_t* half = nullptr;  // BF16, BF16X, BF16A
  const float* bias = nullptr;     // optional [N]
  GgufPart parts[GGUF_MAX_PARTS];  // GGUF
  int64_t n_parts = 0;

  const GgufPart& part_of(int64_t n) const {  // the GGUF part holding output row n
    int64_t i = 0;
    while (n >= parts[i].first + parts[i].rows) ++i;
    return parts[i];
  }
};

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(s);
}

// e^x for 8 floats: x = n ln2 + r with |r| <= ln2 / 2, e^r by its Taylor series to r^7 (relative error ~1e-8,
// below float rounding), times 2^n built in the exponent bits. Inputs are clamped to [-80, 88], and below -80 the
// result is 0: e^-80 ~ 2e-35 is lost in any sum with softmax's largest term (1) or in SiLU's 1 + e^-g, while the
// values near e^-87 this once returned were denormal floats, each product with them ~100x slower (a one-token
// step over a context full of such keys took 180 ms instead of 8; docs/speed.md).
// The scalar std::exp cost ~2 ms a token in softmax and SiLU at 256 tokens of context.
inline __m256 exp8(__m256 x) {
  const __m256 kept = _mm256_cmp_ps(x, _mm256_set1_ps(-80.0f), _CMP_GE_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-80.0f)), _mm256_set1_ps(88.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);  // ln 2 in two parts: r stays exact
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
  __m256 p = _mm256_set1_ps(1.f / 5040);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 720));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  const __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(scale)), kept);
}

// v[i] = e^(v[i] - shift) for i < n
inline void exp_shifted(float* v, int64_t n, float shift) {
  const int64_t n8 = n & ~int64_t(7);
  const __m256 sh = _mm256_set1_ps(shift);
  for (int64_t i = 0; i < n8; i += 8) _mm256_storeu_ps(v + i, exp8(_mm256_sub_ps(_mm256_loadu_ps(v + i), sh)));
  if (n > n8) {
    float tail[8] = {0};
    std::copy(v + n8, v + n, tail);
    _mm256_storeu_ps(tail, exp8(_mm256_sub_ps(_mm256_loadu_ps(tail), sh)));
    std::copy(tail, tail + (n - n8), v + n8);
  }
}

inline __m256 bytes_u8(__m128i b) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)); }
inline __m256 bytes_i8(__m128i b) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)); }

inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// 16 bytes of nibbles: inputs 0..15 in the low nibbles, 16..31 in the high ones (the 32-input blocks' order)
inline __m256i nibbles16(const uint8_t* qs) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)), low4 = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), low4), _mm_and_si128(raw, low4));
}

// Output column n of R rows against a row of `blocks` blocks (y: column n's first row): block(b, acc, offsets) adds
// block b's products to each row's vector sums acc[r] and, with OFFSETS, its scalar sums offsets[r]; then y[r] =
// hsum(acc[r]) (+ offsets[r]). The rows' products of a weight of rows (rows.h, gguf_blocks.h), one order for every R.
template <int R, bool OFFSETS, class Block>
__attribute__((always_inline)) inline void over_blocks(int64_t blocks, float* y, int64_t y_stride, Block block) {
  __m256 acc[R];
  float offsets[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps(), offsets[r] = 0.f;
  for (int64_t b = 0; b < blocks; ++b) block(b, acc, offsets);
  for (int r = 0; r < R; ++r) {
    if constexpr (OFFSETS) y[r * y_stride] = hsum(acc[r]) + offsets[r];
    else y[r * y_stride] = hsum(acc[r]);
  }
}

// run(R, m) for the pass size R (a compile-time count, 1..N)
template <int N, class Run>
void with_rows(int64_t R, Run& run, int64_t m) {
  if constexpr (N > 1)
    if (R < N) return with_rows<N - 1>(R, run, m);
  run(std::integral_constant<int, N>(), m);
}

// run(R, m) over M rows in as few passes of at most MAX rows as may be, of balanced sizes (R a compile-time
// count). AVX2 (MAX 6): 12 accumulators, two weights, a broadcast and zero fill its 16 registers; each pass past
// the first adds its products without hiding them under the weights' arrival (docs/speed.md, on a 2-core
// EPYC: a pass of 4 tokens cost 1.1x a one-token step, 6 tokens 1.3x, 7 tokens 1.7x). AVX-512: MAX 16.
template <int MAX, class Run>
void in_passes(int64_t M, Run run) {
  const int64_t passes = (M + MAX - 1) / MAX;
  for (int64_t i = 0, m = 0; i < passes; ++i) {
    const int64_t R = (M - m) / (passes - i);  // the remaining rows shared out, larger passes last
    with_rows<MAX>(R, run, m);
    m += R;
  }
}

// run(C) for C = count (1..7) as a compile-time constant; nothing for 0
template <class Run>
void below_eight(int64_t count, Run run) {
  switch (count) {
    case 1: run(std::integral_constant<int, 1>()); break;
    case 2: run(std::integral_constant<int, 2>()); break;
    case 3: run(std::integral_constant<int, 3>()); break;
    case 4: run(std::integral_constant<int, 4>()); break;
    case 5: run(std::integral_constant<int, 5>()); break;
    case 6: run(std::integral_constant<int, 6>()); break;
    case 7: run(std::integral_constant<int, 7>()); break;
    default: break;
  }
}

// run(R, m) over M rows in groups: R = 4 while four are left, then the remaining 3, 2 or 1 (R a compile-time count)
template <class Run>
void in_fours(int64_t M, Run run) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) run(std::integral_constant<int, 4>(), m);
  switch (M - m) {
    case 3: run(std::integral_constant<int, 3>(), m); break;
    case 2: run(std::integral_constant<int, 2>(), m); break;
    case 1: run(std::integral_constant<int, 1>(), m); break;
    default: break;
  }
}

// run(R, m) over M rows in groups: R = 8 while eight are left, then the remaining 1..7 in one (R a compile-time
// count). The K-quant kernel's integer sums leave the registers for 8 rows (a verification pass reads its weights
// once).
template <class Run>
void in_eights(int64_t M, Run run) {
  int64_t m = 0;
  for (; m + 8 <= M; m += 8) run(std::integral_constant<int, 8>(), m);
  below_eight(M - m, [&](auto R) { run(R, m); });
}

}  // namespace
