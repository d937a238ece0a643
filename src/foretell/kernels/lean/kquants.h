// K-quant rows (Q4_K, Q5_K, Q6_K) with Q8_K activations, and what the K-quants' interleaved records (KQ4X, KQ6X)
// share: their packer's frame, their product's loop over groups and blocks.
#pragma once

#include "common.h"
#include "act_q8.h"
#include "interleaved.h"
#include "gguf_blocks.h"

namespace {

// K-quants (Q4_K, Q5_K, Q6_K) with Q8_K activations (RowsQ8K), a block of 256 inputs at a time, as llama.cpp's dot
// products do. The block's d (and dmin) and its chunks' integer scales are decoded once for all rows; each chunk's
// integer products are multiplied by its integer scale in the madd that sums them (both 16-input halves' scales at
// once, as Q6_K needs) and added up as integers over the block; one float step a block then scales them by d times
// the activations' d, and the mins' term (the block's 8 mins against the activations' 8 code sums, as integers) by
// dmin. Every row's sums run in this one order whatever the pass's width.
struct KScales {
  float d, dmin;                  // dmin: 0 for Q6_K
  int16_t lo[8], hi[8];           // chunk j: the scales of inputs 0..15 and 16..31 (equal but in Q6_K)
  __m128i min;                    // the 8 chunks' mins as int16 (Q4_K, Q5_K)
};

template <int64_t T>
inline KScales k_scales(const uint8_t* b) {
  KScales k;
  if constexpr (T == GQ6_K) {
    const int8_t* s = reinterpret_cast<const int8_t*>(b + 192);
    k.d = half_float(b + 208), k.dmin = 0.f, k.min = _mm_setzero_si128();
    for (int j = 0; j < 8; ++j) k.lo[j] = s[2 * j], k.hi[j] = s[2 * j + 1];
  } else {
    // scale_min_k's unpacking on 32-bit words, 4 chunks a word: the mins go to a vector without a round trip
    // through memory (8 int16 stores read back as one vector stall the load, once a block)
    k.d = half_float(b), k.dmin = half_float(b + 2);
    uint32_t w[3];
    std::memcpy(w, b + 4, 12);
    const uint32_t six = 0x3f3f3f3f, four = 0x0f0f0f0f, two = 0x03030303;
    const uint32_t scales[2] = {w[0] & six, (w[2] & four) | (((w[0] >> 6) & two) << 4)};
    const uint32_t mins[2] = {w[1] & six, ((w[2] >> 4) & four) | (((w[1] >> 6) & two) << 4)};
    for (int j = 0; j < 8; ++j) k.lo[j] = k.hi[j] = int16_t((scales[j / 4] >> (8 * (j % 4))) & 0xff);
    k.min = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, int(mins[1]), int(mins[0])));
  }
  return k;
}

inline float hsum128(__m128 v) {
  v = _mm_add_ps(v, _mm_movehl_ps(v, v));
  return _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)));
}

template <int64_t T, int R>
void rows_kquant_q8(const uint8_t* row, int64_t K, const RowsQ8K& x, int64_t m, float* y, int64_t y_stride, int64_t n) {
  using G = Gguf<T>;
  constexpr bool SIGNED = G::is_signed;
  const int64_t blocks = K / 256;
  __m256 acc[R];
  __m128 mins[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps(), mins[r] = _mm_setzero_ps();
  for (int64_t block = 0; block < blocks; ++block) {
    const uint8_t* b = row + block * G::bytes;
    const KScales k = k_scales<T>(b);
    __m256i part[R];
    for (int r = 0; r < R; ++r) part[r] = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
      const __m256i q = G::codes(b, j);
      const __m256i magnitude = SIGNED ? _mm256_sign_epi8(q, q) : q;
      const __m256i scale = _mm256_set_m128i(_mm_set1_epi16(k.hi[j]), _mm_set1_epi16(k.lo[j]));
      for (int r = 0; r < R; ++r) {
        __m256i qa = load32(reinterpret_cast<const uint8_t*>(x.codes.data() + (m + r) * K + 256 * block + 32 * j));
        if constexpr (SIGNED) qa = _mm256_sign_epi8(qa, q);
        part[r] = _mm256_add_epi32(part[r], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, qa), scale));
      }
    }
    for (int r = 0; r < R; ++r) {
      const float d = x.d[(m + r) * blocks + block];
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(part[r]), _mm256_set1_ps(k.d * d), acc[r]);
      if constexpr (!SIGNED) {
        const __m128i sums = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.sums.data() + (m + r) * (K / 32) + 8 * block));
        mins[r] = _mm_fmadd_ps(_mm_cvtepi32_ps(_mm_madd_epi16(sums, k.min)), _mm_set1_ps(-k.dmin * d), mins[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) y[r * y_stride + n] = hsum(acc[r]) + hsum128(mins[r]);
}

// Records of 8 output columns per block of 256 inputs from N rows of K-quant blocks of `block_bytes` (N a multiple
// of 8): uint8 [N / 8, K / 256, record_bytes], fill(record, c, block) writing column c's block into its record
template <class Fill>
torch::Tensor interleaved_records(const torch::Tensor& bytes, int64_t N, int64_t K, int64_t block_bytes,
                                  int64_t record_bytes, const char* what, Fill fill) {
  TORCH_CHECK(bytes.scalar_type() == at::kByte && bytes.is_contiguous() && N % 8 == 0 && K % 256 == 0 &&
                  bytes.numel() == N * (K / 256) * block_bytes,
              what, " rows: contiguous uint8 [N * K / 256 * ", block_bytes, "], N % 8 == 0");
  const int64_t blocks = K / 256;
  auto out = torch::zeros({N / 8, blocks, record_bytes}, torch::kByte);
  const uint8_t* in = bytes.data_ptr<uint8_t>();
  uint8_t* o = out.data_ptr<uint8_t>();
  at::parallel_for(0, N / 8, 16, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g)
      for (int64_t b = 0; b < blocks; ++b)
        for (int c = 0; c < 8; ++c) fill(o + (g * blocks + b) * record_bytes, c, in + ((8 * g + c) * blocks + b) * block_bytes);
  });
  return out;
}

// Column c's codes of the 8 chunks of a record (each chunk_bytes from the last), code(j, l): input l of chunk j,
// their low 4 bits as Q4X's codes: per chunk 4 vectors, vector v, lane c, byte i holding input 4v + i in its low
// nibble and input 16 + 4v + i in its high one
template <class Code>
inline void put_nibbles(uint8_t* rec, int64_t chunk_bytes, int c, Code code) {
  for (int j = 0; j < 8; ++j)
    for (int v = 0; v < 4; ++v)
      for (int i = 0; i < 4; ++i)
        rec[chunk_bytes * j + 32 * v + 4 * c + i] =
            uint8_t((code(j, 4 * v + i) & 0x0F) | ((code(j, 16 + 4 * v + i) & 0x0F) << 4));
}

// The interleaved K-quant kinds' products. A kind L (kq4x.h's Kq4x, kq6x.h's Kq6x) gives
//   L::BYTES                        a record's bytes (8 columns' blocks of 256 inputs)
//   L::row_sums(xk, M, K)           what its product needs of the activations besides RowsQ8K (KQ6X: code sums)
//   L::chunk<R, VNNI>(rec, j, a, total)   chunk j's integer products, times its integer scales, added to the R
//                                   rows' total[r] (a: each row's codes of the block)
//   L::finish<R>(rec, x, sums, m, b, K, total, acc)   the block's float step: total and its offsets into acc[r]
// Columns 8g .. 8g + 7 of R rows (m .. m + R - 1 of x), forced inline into the two entry points below, each
// compiled for its instruction set. A block's integer sums are exact and its float steps come in one order, so a
// row's result does not depend on the rows beside it, and VNNI and AVX2 give the same bits.
template <class L, int R, bool VNNI>
__attribute__((always_inline)) inline void group_records(const uint8_t* records, int64_t K, int64_t g, int64_t groups,
                                                         const RowsQ8K& x, const int16_t* sums, int64_t m, float* y,
                                                         int64_t y_stride) {
  const int64_t blocks = K / 256;
  const int8_t* a[R];
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const bool fetch = fetches(m, g, groups);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* rec = records + (g * blocks + b) * L::BYTES;
    if (fetch) fetch_ahead(rec + prefetch_groups * blocks * L::BYTES, L::BYTES);
    for (int r = 0; r < R; ++r) a[r] = x.codes.data() + (m + r) * K + 256 * b;
    __m256i total[R];
    for (int r = 0; r < R; ++r) total[r] = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) L::template chunk<R, VNNI>(rec, j, a, total);
    L::template finish<R>(rec, x, sums, m, b, K, total, acc);
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(y + r * y_stride + 8 * g, acc[r]);
}

template <class L, int R>
__attribute__((target("avx512f,avx512vl,avx512bw,avx512vnni"))) void group_records_vnni(
    const uint8_t* records, int64_t K, int64_t g, int64_t groups, const RowsQ8K& x, const int16_t* sums, int64_t m,
    float* y, int64_t y_stride) {
  group_records<L, R, true>(records, K, g, groups, x, sums, m, y, y_stride);
}

template <class L, int R>
void group_records_avx2(const uint8_t* records, int64_t K, int64_t g, int64_t groups, const RowsQ8K& x,
                        const int16_t* sums, int64_t m, float* y, int64_t y_stride) {
  group_records<L, R, false>(records, K, g, groups, x, sums, m, y, y_stride);
}

// y [M, N] = x [M, K] W^T (+ bias) for kind L's records: x quantized as Q8_K, 8 columns at a time over torch's
// threads, x's rows 8 at a time
template <class L>
void gemm_records(const Proj& p, const float* x, int64_t M, float* y, float*, bool act_q8) {
  TORCH_CHECK(act_q8, "KQ4X / KQ6X blocks run with 8-bit activations only");
  RowsQ8K xk;
  quantize_rows(x, M, p.K, xk);
  const std::vector<int16_t> sums = L::row_sums(xk, M, p.K);
  over_groups(p, M, y, [&](int64_t g) {
    in_eights(M, [&](auto R, int64_t m) {
      constexpr int rows = decltype(R)::value;
      if (vnni_on)
        group_records_vnni<L, rows>(p.codes, p.K, g, p.N / 8, xk, sums.data(), m, y + m * p.N, p.N);
      else
        group_records_avx2<L, rows>(p.codes, p.K, g, p.N / 8, xk, sums.data(), m, y + m * p.N, p.N);
    });
  });
}

// A projection's interleaved K-quant records [N / 8, K / 256, L::BYTES] (KQ4X, KQ6X)
template <class L>
void unpack_records(Proj& p, const torch::Tensor& main, const torch::Tensor&) {
  TORCH_CHECK(main.dim() == 3 && main.size(2) == L::BYTES && main.scalar_type() == at::kByte,
              "KQ4X / KQ6X records' shape");
  p.N = main.size(0) * 8;
  p.K = main.size(1) * 256;
  p.codes = main.data_ptr<uint8_t>();
}

}  // namespace
