// Kind KQ6X: Q6_K blocks with 8 output columns interleaved, 8-bit activations (AVX2 and AVX-512 VNNI).
#pragma once

#include "kquants.h"

namespace {

// Q6_K blocks with 8 output columns interleaved (KQ6X), for 8-bit activations: per group of 8 columns and block of
// 256 inputs one record of KQ6X_BYTES, exactly the 8 blocks' bytes: for each chunk j of 32 inputs, KQ6X_CHUNK bytes
// in the order the kernel reads them (a record streams front to back: with the parts apart, a 191 MB output layer
// read at half the speed)
//   low    [4][32]: the codes' low 4 bits, as KQ4X's codes (inputs 32j + 4v + i low, + 16 high nibble)
//   high   [2][32]: their top 2 bits; lane c, byte i of the first vector holds inputs 32j + 4v + i of column c in
//          bits 2v, 2v + 1 (v = 0..3), of the second inputs 32j + 16 + 4v + i
//   scales [2 groups][8 columns] int8, one per 16 inputs
// then d [8 columns] fp16.
// The codes go in unsigned (u = q + 32, 0..63; vpdpbusd multiplies unsigned by signed bytes) and each 16's offset
// comes back through the activations' code sums: sum s (u - 32) a = sum s u a - 32 sum s (sum of the 16 a).
constexpr int64_t KQ6X_CHUNK = 208, KQ6X_HIGH = 128, KQ6X_SCALES = 192, KQ6X_D = 1664, KQ6X_BYTES = 1680;

// input l of chunk j of a Q6_K block, 0..63 (Gguf<GQ6_K>::codes' layout, one code, its offset kept)
inline int q6k_code(const uint8_t* blk, int j, int l) {
  const int half = j / 4, k = j % 4;
  const uint8_t low = blk[64 * half + 32 * (k & 1) + l];
  return ((k >= 2 ? low >> 4 : low & 0x0F) | (((blk[128 + 32 * half + l] >> (2 * k)) & 3) << 4));
}

// The KQ6X records of N rows of Q6_K blocks (N a multiple of 8): uint8 [N / 8, K / 256, KQ6X_BYTES]
torch::Tensor interleave_q6k(torch::Tensor bytes, int64_t N, int64_t K) {
  return interleaved_records(bytes, N, K, 210, KQ6X_BYTES, "Q6_K", [](uint8_t* rec, int c, const uint8_t* blk) {
    put_nibbles(rec, KQ6X_CHUNK, c, [&](int j, int l) { return q6k_code(blk, j, l); });  // the low 4 bits
    for (int j = 0; j < 8; ++j) {
      uint8_t* chunk = rec + KQ6X_CHUNK * j;
      for (int v = 0; v < 4; ++v)
        for (int i = 0; i < 4; ++i) {  // the top 2 bits
          chunk[KQ6X_HIGH + 4 * c + i] |= uint8_t((q6k_code(blk, j, 4 * v + i) >> 4) << (2 * v));
          chunk[KQ6X_HIGH + 32 + 4 * c + i] |= uint8_t((q6k_code(blk, j, 16 + 4 * v + i) >> 4) << (2 * v));
        }
      rec[KQ6X_CHUNK * j + KQ6X_SCALES + c] = blk[192 + 2 * j];
      rec[KQ6X_CHUNK * j + KQ6X_SCALES + 8 + c] = blk[192 + 2 * j + 1];
    }
    std::memcpy(rec + KQ6X_D + 2 * c, blk + 208, 2);
  });
}

// chunk j's codes for vector v: the unsigned 6-bit codes of inputs 4v + i (lo) and 16 + 4v + i (hi), 8 columns.
// A byte's 2 top bits for vector v sit at bits 2v, 2v + 1 of `top`: shifted to bits 4, 5 (a 16-bit shift moves
// the neighbour byte's bits too, into bits the mask drops).
template <int V>
inline void kq6x_codes(__m256i raw, __m256i top_lo, __m256i top_hi, __m256i& lo, __m256i& hi) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), bits45 = _mm256_set1_epi8(0x30);
  auto at45 = [&](__m256i top) {
    if constexpr (V < 2) return _mm256_and_si256(_mm256_slli_epi16(top, 4 - 2 * V), bits45);
    else if constexpr (V == 2) return _mm256_and_si256(top, bits45);
    else return _mm256_and_si256(_mm256_srli_epi16(top, 2), bits45);
  };
  lo = _mm256_or_si256(_mm256_and_si256(raw, low4), at45(top_lo));
  hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), low4), at45(top_hi));
}

// fn(lo, hi, v) for chunk j's 4 vectors of codes
template <class Fn>
__attribute__((always_inline)) inline void kq6x_vectors(const uint8_t* rec, int j, Fn fn) {
  const uint8_t* chunk = rec + KQ6X_CHUNK * j;
  const __m256i top_lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + KQ6X_HIGH));
  const __m256i top_hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + KQ6X_HIGH + 32));
  const __m256i* raw = reinterpret_cast<const __m256i*>(chunk);
  __m256i lo, hi;
  kq6x_codes<0>(_mm256_loadu_si256(raw), top_lo, top_hi, lo, hi), fn(lo, hi, 0);
  kq6x_codes<1>(_mm256_loadu_si256(raw + 1), top_lo, top_hi, lo, hi), fn(lo, hi, 1);
  kq6x_codes<2>(_mm256_loadu_si256(raw + 2), top_lo, top_hi, lo, hi), fn(lo, hi, 2);
  kq6x_codes<3>(_mm256_loadu_si256(raw + 3), top_lo, top_hi, lo, hi), fn(lo, hi, 3);
}

// chunk j's two 16-input groups' sums for R rows (a: each row's codes of this block), unsigned codes
template <int R>
__attribute__((target("avx512f,avx512vl,avx512bw,avx512vnni"))) inline void kq6x_chunk_vnni(
    const uint8_t* rec, int j, const int8_t* const* a, __m256i* first, __m256i* second) {
  for (int r = 0; r < R; ++r) first[r] = second[r] = _mm256_setzero_si256();
  kq6x_vectors(rec, j, [&](__m256i lo, __m256i hi, int v) {
    for (int r = 0; r < R; ++r) {
      first[r] = _mm256_dpbusd_epi32(first[r], lo, spread4(a[r] + 32 * j + 4 * v));
      second[r] = _mm256_dpbusd_epi32(second[r], hi, spread4(a[r] + 32 * j + 16 + 4 * v));
    }
  });
}

template <int R>
__attribute__((always_inline)) inline void kq6x_chunk_avx2(const uint8_t* rec, int j, const int8_t* const* a,
                                                           __m256i* first, __m256i* second) {
  // a maddubs of codes <= 63 by |activations| <= 127: 2 * 63 * 127 < 2^15; widened to 32 bits at once
  const __m256i ones = _mm256_set1_epi16(1);
  for (int r = 0; r < R; ++r) first[r] = second[r] = _mm256_setzero_si256();
  kq6x_vectors(rec, j, [&](__m256i lo, __m256i hi, int v) {
    for (int r = 0; r < R; ++r) {
      first[r] = _mm256_add_epi32(first[r], _mm256_madd_epi16(_mm256_maddubs_epi16(lo, spread4(a[r] + 32 * j + 4 * v)), ones));
      second[r] = _mm256_add_epi32(second[r],
                                   _mm256_madd_epi16(_mm256_maddubs_epi16(hi, spread4(a[r] + 32 * j + 16 + 4 * v)), ones));
    }
  });
}

// KQ6X's steps in the interleaved K-quants' product (kquants.h: group_records)
struct Kq6x {
  static constexpr int64_t BYTES = KQ6X_BYTES;

  static std::vector<int16_t> row_sums(const RowsQ8K& xk, int64_t M, int64_t K) {  // the code sums per 16 inputs
    std::vector<int16_t> sums16(M * (K / 16));
    for (int64_t i = 0; i < M * (K / 16); ++i) {
      int total = 0;
      for (int l = 0; l < 16; ++l) total += xk.codes[16 * i + l];
      sums16[i] = int16_t(total);
    }
    return sums16;
  }

  template <int R, bool VNNI>
  __attribute__((always_inline)) static void chunk(const uint8_t* rec, int j, const int8_t* const* a, __m256i* total) {
    __m256i first[R], second[R];
    if constexpr (VNNI) kq6x_chunk_vnni<R>(rec, j, a, first, second);
    else kq6x_chunk_avx2<R>(rec, j, a, first, second);
    const uint8_t* scales = rec + KQ6X_CHUNK * j + KQ6X_SCALES;
    const __m256i s1 = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(scales)));
    const __m256i s2 = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(scales + 8)));
    for (int r = 0; r < R; ++r)
      total[r] = _mm256_add_epi32(total[r], _mm256_add_epi32(_mm256_mullo_epi32(first[r], s1),
                                                             _mm256_mullo_epi32(second[r], s2)));
  }

  // the offsets (32 * sum over the 16 groups of scale * the group's activation code sum, 2 groups a madd) off the
  // sums, then times d (sums16: the rows' activation code sums per 16 inputs)
  template <int R>
  __attribute__((always_inline)) static void finish(const uint8_t* rec, const RowsQ8K& x, const int16_t* sums16,
                                                    int64_t m, int64_t b, int64_t K, __m256i* total, __m256* acc) {
    const int64_t blocks = K / 256;
    __m256i pairs[8];
    for (int k = 0; k < 8; ++k) {
      const __m128i both = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + KQ6X_CHUNK * k + KQ6X_SCALES));
      pairs[k] = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(both, _mm_srli_si128(both, 8)));  // (s_2k, s_2k+1) a column
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + KQ6X_D)));
    for (int r = 0; r < R; ++r) {
      const int16_t* s = sums16 + (m + r) * (K / 16) + 16 * b;
      __m256i offset = _mm256_setzero_si256();
      for (int k = 0; k < 8; ++k) {
        int32_t pair;
        std::memcpy(&pair, s + 2 * k, 4);
        offset = _mm256_add_epi32(offset, _mm256_madd_epi16(pairs[k], _mm256_set1_epi32(pair)));
      }
      total[r] = _mm256_sub_epi32(total[r], _mm256_slli_epi32(offset, 5));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total[r]), _mm256_mul_ps(d, _mm256_set1_ps(x.d[(m + r) * blocks + b])),
                               acc[r]);
    }
  }
};

}  // namespace
