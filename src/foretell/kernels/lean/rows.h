// Kinds Q4, Q8, F32 and BF16: a weight's rows as they are, an output column a row of weights, with float or
// (Q4, Q8) 8-bit activations.
#pragma once

#include "common.h"
#include "act_q8.h"

namespace {

// Sum over x's 32-value blocks, for Q4_1's "+ m" term: x_sums[b] = sum of x[32 b .. 32 b + 31].
void block_sums(const float* x, int64_t K, float* out) {
  for (int64_t b = 0; b < K / 32; ++b) {
    __m256 s = _mm256_loadu_ps(x + 32 * b);
    for (int j = 8; j < 32; j += 8) s = _mm256_add_ps(s, _mm256_loadu_ps(x + 32 * b + j));
    out[b] = hsum(s);
  }
}

// sum over a block's 32 inputs xb[i] * q_i, q_i in four vectors of 8
inline __m256 block_dot(const float* xb, __m256 q0, __m256 q1, __m256 q2, __m256 q3) {
  __m256 s = _mm256_mul_ps(_mm256_loadu_ps(xb), q0);
  s = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 8), q1, s);
  s = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 16), q2, s);
  return _mm256_fmadd_ps(_mm256_loadu_ps(xb + 24), q3, s);
}

// Output row n of a Q4 projection for R rows of x at once (the block's codes unpacked once for all R): every row
// gets exactly the arithmetic of R = 1, so a one-token step and a wider pass compute the same sums.
template <int R>
void rows_q4(const Proj& p, int64_t n, const float* x, const float* x_sums, float* y, int64_t y_stride) {
  const int64_t blocks = p.K / 32;
  const uint8_t* codes = p.codes + n * (p.K / 2);
  const float* dm = p.scales + n * blocks * 2;
  const __m128i low4 = _mm_set1_epi8(0x0F);
  over_blocks<R, true>(blocks, y + n, y_stride, [&](int64_t b, __m256* acc, float* offsets) {
    __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 16 * b));
    __m128i lo = _mm_and_si128(raw, low4), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low4);
    const __m256 q0 = bytes_u8(lo), q1 = bytes_u8(_mm_srli_si128(lo, 8));
    const __m256 q2 = bytes_u8(hi), q3 = bytes_u8(_mm_srli_si128(hi, 8));
    const __m256 d = _mm256_set1_ps(dm[2 * b]);
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm256_fmadd_ps(d, block_dot(x + r * p.K + 32 * b, q0, q1, q2, q3), acc[r]);
      offsets[r] += dm[2 * b + 1] * x_sums[r * blocks + b];
    }
  });
}

template <int R>
void rows_q8(const Proj& p, int64_t n, const float* x, float* y, int64_t y_stride) {
  const int64_t blocks = p.K / 32;
  const int8_t* codes = reinterpret_cast<const int8_t*>(p.codes) + n * p.K;
  const float* d = p.scales + n * blocks;
  over_blocks<R, false>(blocks, y + n, y_stride, [&](int64_t b, __m256* acc, float*) {
    __m128i c0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 32 * b));
    __m128i c1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 32 * b + 16));
    const __m256 q0 = bytes_i8(c0), q1 = bytes_i8(_mm_srli_si128(c0, 8));
    const __m256 q2 = bytes_i8(c1), q3 = bytes_i8(_mm_srli_si128(c1, 8));
    const __m256 db = _mm256_set1_ps(d[b]);
    for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(db, block_dot(x + r * p.K + 32 * b, q0, q1, q2, q3), acc[r]);
  });
}

float row_f32(const Proj& p, int64_t n, const float* x) {
  const float* w = p.dense + n * p.K;
  const int64_t K8 = p.K & ~int64_t(7);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t k = 0; k < K8; k += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), _mm256_loadu_ps(w + k), acc);
  float s = hsum(acc);
  for (int64_t k = K8; k < p.K; ++k) s += x[k] * w[k];
  return s;
}

inline __m256 widen_bf16(const uint16_t* w) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

inline float bf16_value(uint16_t w) {
  const uint32_t bits = uint32_t(w) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Output column n of a BF16 projection for R rows: each row sums in two chains (even and odd groups of 8 inputs,
// so that one row alone is not bound by the FMA latency), the same for every R.
template <int R>
void rows_bf16(const Proj& p, int64_t n, const float* x, float* y, int64_t y_stride) {
  const uint16_t* w = p.half + n * p.K;
  const int64_t K16 = p.K & ~int64_t(15), K8 = p.K & ~int64_t(7);
  __m256 even[R], odd[R];
  for (int r = 0; r < R; ++r) even[r] = _mm256_setzero_ps(), odd[r] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K16; k += 16) {
    const __m256 w0 = widen_bf16(w + k), w1 = widen_bf16(w + k + 8);
    for (int r = 0; r < R; ++r) {
      even[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * p.K + k), w0, even[r]);
      odd[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * p.K + k + 8), w1, odd[r]);
    }
  }
  if (K8 > K16) {
    const __m256 w0 = widen_bf16(w + K16);
    for (int r = 0; r < R; ++r) even[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * p.K + K16), w0, even[r]);
  }
  for (int r = 0; r < R; ++r) {
    float s = hsum(_mm256_add_ps(even[r], odd[r]));
    for (int64_t k = K8; k < p.K; ++k) s += x[r * p.K + k] * bf16_value(w[k]);
    y[r * y_stride + n] = s;
  }
}

template <int64_t KIND, int R>
void rows(const Proj& p, int64_t n, const float* x, const float* x_sums, float* y, int64_t y_stride) {
  if constexpr (KIND == Q4) return rows_q4<R>(p, n, x, x_sums, y, y_stride);
  else if constexpr (KIND == Q8) return rows_q8<R>(p, n, x, y, y_stride);
  else if constexpr (KIND == BF16) return rows_bf16<R>(p, n, x, y, y_stride);
  else for (int r = 0; r < R; ++r) y[r * y_stride + n] = row_f32(p, n, x + r * p.K);
}

// the 8 partial int32 sums of a block's 32 products (u: 0..255, s: -127..127), as floats
inline __m256 block_products(__m256i u, __m256i s) {
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}

template <int R>
void rows_q4_q8(const Proj& p, int64_t n, const RowsQ8& x, int64_t m, float* y, int64_t y_stride) {
  const int64_t blocks = p.K / 32;
  const uint8_t* codes = p.codes + n * (p.K / 2);
  const float* dm = p.scales + n * blocks * 2;
  over_blocks<R, true>(blocks, y + n, y_stride, [&](int64_t b, __m256* acc, float* offsets) {
    const __m256i w = nibbles16(codes + 16 * b);
    for (int r = 0; r < R; ++r) {
      const int64_t row = (m + r) * blocks + b;
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.codes.data() + row * 32));
      acc[r] = _mm256_fmadd_ps(block_products(w, q), _mm256_set1_ps(dm[2 * b] * x.d[row]), acc[r]);
      offsets[r] += dm[2 * b + 1] * x.d_sum[row];
    }
  });
}

template <int R>
void rows_q8_q8(const Proj& p, int64_t n, const RowsQ8& x, int64_t m, float* y, int64_t y_stride) {
  const int64_t blocks = p.K / 32;
  const int8_t* codes = reinterpret_cast<const int8_t*>(p.codes) + n * p.K;
  const float* d = p.scales + n * blocks;
  over_blocks<R, false>(blocks, y + n, y_stride, [&](int64_t b, __m256* acc, float*) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 32 * b));
    const __m256i magnitude = _mm256_sign_epi8(w, w);  // |w| as unsigned, its sign moved onto the activations
    for (int r = 0; r < R; ++r) {
      const int64_t row = (m + r) * blocks + b;
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.codes.data() + row * 32));
      acc[r] = _mm256_fmadd_ps(block_products(magnitude, _mm256_sign_epi8(q, w)), _mm256_set1_ps(d[b] * x.d[row]),
                               acc[r]);
    }
  });
}

template <int64_t KIND, int R>
void rows_q8act(const Proj& p, int64_t n, const RowsQ8& x, int64_t m, float* y, int64_t y_stride) {
  if constexpr (KIND == Q4) return rows_q4_q8<R>(p, n, x, m, y, y_stride);
  else return rows_q8_q8<R>(p, n, x, m, y, y_stride);
}

// y [M, N] = x [M, K] W^T (+ bias) for a weight of rows (KIND Q4, Q8, F32 or BF16), output rows spread over torch's
// threads, x's rows 4 at a time. x_sums: scratch of M * K / 32 floats. act_q8: 8-bit activations for the blocks
// (Q4, Q8; act_q8.h), F32 and BF16 multiply fp32 ones whatever it says.
template <int64_t KIND>
void gemm_rows(const Proj& p, const float* x, int64_t M, float* y, float* x_sums, bool act_q8) {
  constexpr bool BLOCKS = KIND == Q4 || KIND == Q8;
  const bool q8 = BLOCKS && act_q8;
  RowsQ8 xq;
  if (q8) quantize_rows(x, M, p.K, xq);
  else if (KIND == Q4)
    for (int64_t r = 0; r < M; ++r) block_sums(x + r * p.K, p.K, x_sums + r * (p.K / 32));
  at::parallel_for(0, p.N, 64, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      if (q8) {
        if constexpr (BLOCKS)
          in_fours(M, [&](auto R, int64_t m) { rows_q8act<KIND, decltype(R)::value>(p, n, xq, m, y + m * p.N, p.N); });
      } else
        in_fours(M, [&](auto R, int64_t m) {
          rows<KIND, decltype(R)::value>(p, n, x + m * p.K, x_sums + m * (p.K / 32), y + m * p.N, p.N);
        });
      if (p.bias)
        for (int64_t r = 0; r < M; ++r) y[r * p.N + n] += p.bias[n];
    }
  });
}

// The kinds' tensors (main: [N, ...], scales: as the layouts at lean_decode.cpp's top say)
void unpack_q4(Proj& p, const torch::Tensor& main, const torch::Tensor& scales) {
  p.K = main.size(1) * 2;
  p.codes = main.data_ptr<uint8_t>();
  p.scales = scales.data_ptr<float>();
}

void unpack_q8(Proj& p, const torch::Tensor& main, const torch::Tensor& scales) {
  p.K = main.size(1);
  p.codes = reinterpret_cast<const uint8_t*>(main.data_ptr<int8_t>());
  p.scales = scales.data_ptr<float>();
}

void unpack_f32(Proj& p, const torch::Tensor& main, const torch::Tensor&) {
  p.K = main.size(1);
  p.dense = main.data_ptr<float>();
}

void unpack_bf16(Proj& p, const torch::Tensor& main, const torch::Tensor&) {
  p.K = main.size(1);
  p.half = reinterpret_cast<const uint16_t*>(main.data_ptr<at::BFloat16>());
}

}  // namespace
