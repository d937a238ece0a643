// Kind KQ4X: Q4_K blocks with 8 output columns interleaved, 8-bit activations (AVX2 and AVX-512 VNNI).
#pragma once

#include "kquants.h"

namespace {

// Q4_K blocks with 8 output columns interleaved (KQ4X), for 8-bit activations: per group of 8 columns and block of
// 256 inputs one record of KQ4X_BYTES, in the order the kernel reads it (a record streams front to back; with the
// codes and the scales apart, a large matrix streamed from memory at about half the speed, as KQ6X's output layer
// showed): for each chunk j of 32 inputs, KQ4X_CHUNK bytes
//   codes  [4][32]: as Q4X's, vector v, lane c, byte i holds column c's code of input 32j + 4v + i in its low nibble
//          and of input 32j + 16 + 4v + i in its high nibble
//   scales [8 columns] uint8, the chunk's 6-bit scales
// then mins [4 pairs of chunks][8 columns][2] uint8, the chunks' 6-bit mins side by side (2k, 2k + 1), widened to
// 16 bits in registers (stored as int16 they made the records 8% larger than the file's blocks, and a one-token
// step streams them from memory)
//   d, dmin [8 columns] fp16 each
// One instruction then advances 8 columns' sums of 4 inputs (no horizontal sums), a chunk's scale is one multiply
// for the 8 columns, and the mins' term is 4 madds a block; the activations are RowsQ8K (Q8_K) as the row kernel's.
// A block's integer sums are exact and its float steps come in one order, so a row's result does not depend on
// the rows beside it; AVX-512 VNNI (vpdpbusd) and AVX2 (maddubs, then madd) compute the same integers.
constexpr int64_t KQ4X_CHUNK = 136, KQ4X_SCALES = 128, KQ4X_MINS = 1088, KQ4X_D = 1152, KQ4X_BYTES = 1184;

// input l of chunk j of a Q4_K block (Gguf<GQ4_K>::codes, one code): chunks 2i and 2i + 1 are the low and high
// nibbles of code bytes 32i .. 32i + 31
inline int q4k_code(const uint8_t* blk, int j, int l) {
  const uint8_t v = blk[16 + 32 * (j / 2) + l];
  return (j & 1) ? v >> 4 : v & 0x0F;
}

// The KQ4X records of N rows of Q4_K blocks (N a multiple of 8): uint8 [N / 8, K / 256, KQ4X_BYTES]
torch::Tensor interleave_q4k(torch::Tensor bytes, int64_t N, int64_t K) {
  return interleaved_records(bytes, N, K, 144, KQ4X_BYTES, "Q4_K", [](uint8_t* rec, int c, const uint8_t* blk) {
    put_nibbles(rec, KQ4X_CHUNK, c, [&](int j, int l) { return q4k_code(blk, j, l); });
    for (int j = 0; j < 8; ++j) {
      int scale, min;
      scale_min_k(j, blk + 4, scale, min);
      rec[KQ4X_CHUNK * j + KQ4X_SCALES + c] = uint8_t(scale);
      rec[KQ4X_MINS + 16 * (j / 2) + 2 * c + (j & 1)] = uint8_t(min);
    }
    std::memcpy(rec + KQ4X_D + 2 * c, blk, 2);       // d
    std::memcpy(rec + KQ4X_D + 16 + 2 * c, blk + 2, 2);  // dmin
  });
}

// chunk j's 8 columns' sums for R rows: sums[r] = the int32 products of the chunk's codes with row r's codes (a:
// each row's codes of this block). Inlined where the caller has its instruction set (group_records_vnni).
template <int R>
__attribute__((target("avx512f,avx512vl,avx512bw,avx512vnni"))) inline void kq4x_chunk_vnni(
    const uint8_t* rec, int j, const int8_t* const* a, __m256i* sums) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256i high[R];  // a second chain per row: vpdpbusd's latency, not its throughput, bounds one chain
  for (int r = 0; r < R; ++r) sums[r] = high[r] = _mm256_setzero_si256();
  for (int v = 0; v < 4; ++v) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + KQ4X_CHUNK * j + 32 * v));
    const __m256i lo = _mm256_and_si256(raw, low4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
    for (int r = 0; r < R; ++r) {
      sums[r] = _mm256_dpbusd_epi32(sums[r], lo, spread4(a[r] + 32 * j + 4 * v));
      high[r] = _mm256_dpbusd_epi32(high[r], hi, spread4(a[r] + 32 * j + 16 + 4 * v));
    }
  }
  for (int r = 0; r < R; ++r) sums[r] = _mm256_add_epi32(sums[r], high[r]);
}

template <int R>
__attribute__((always_inline)) inline void kq4x_chunk_avx2(const uint8_t* rec, int j, const int8_t* const* a,
                                                           __m256i* sums) {
  // 16 products of codes <= 15 by |activations| <= 127 per 16-bit lane: 16 * 15 * 127 < 2^15, no overflow
  nibble_sums_avx2<R>(rec + KQ4X_CHUNK * j, a, 32 * j, sums);
}

// KQ4X's steps in the interleaved K-quants' product (kquants.h: group_records)
struct Kq4x {
  static constexpr int64_t BYTES = KQ4X_BYTES;

  static std::vector<int16_t> row_sums(const RowsQ8K&, int64_t, int64_t) { return {}; }  // RowsQ8K's sums suffice

  template <int R, bool VNNI>
  __attribute__((always_inline)) static void chunk(const uint8_t* rec, int j, const int8_t* const* a, __m256i* total) {
    __m256i sums[R];
    if constexpr (VNNI) kq4x_chunk_vnni<R>(rec, j, a, sums);
    else kq4x_chunk_avx2<R>(rec, j, a, sums);
    const __m256i scale = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(rec + KQ4X_CHUNK * j + KQ4X_SCALES)));
    for (int r = 0; r < R; ++r) total[r] = _mm256_add_epi32(total[r], _mm256_mullo_epi32(sums[r], scale));
  }

  // d times the sums, less dmin times the mins' term (the 8 chunks' mins against the rows' code sums per 32)
  template <int R>
  __attribute__((always_inline)) static void finish(const uint8_t* rec, const RowsQ8K& x, const int16_t*, int64_t m,
                                                    int64_t b, int64_t K, const __m256i* total, __m256* acc) {
    const int64_t blocks = K / 256;
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + KQ4X_D)));
    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + KQ4X_D + 16)));
    for (int r = 0; r < R; ++r) {
      const int16_t* bsums = x.sums.data() + (m + r) * (K / 32) + 8 * b;
      __m256i mins = _mm256_setzero_si256();
      for (int k = 0; k < 4; ++k) {
        int32_t pair;
        std::memcpy(&pair, bsums + 2 * k, 4);
        mins = _mm256_add_epi32(mins, _mm256_madd_epi16(
            _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + KQ4X_MINS + 16 * k))),
            _mm256_set1_epi32(pair)));
      }
      const __m256 xd = _mm256_set1_ps(x.d[(m + r) * blocks + b]);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total[r]), _mm256_mul_ps(d, xd), acc[r]);
      acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_mul_ps(dmin, xd), acc[r]);
    }
  }
};

}  // namespace
