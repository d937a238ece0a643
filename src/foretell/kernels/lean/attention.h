// Attention over a sequence's cache (float32 or float16), one query or several sharing the keys' loads.
#pragma once

#include "common.h"
#include "columns_avx512.h"

namespace {

// 8 cached keys' or values' numbers as floats: a float32 cache's as they are, a float16 cache's widened (exactly)
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// n floats into a cache row: as they are, or rounded to float16 (to nearest even; n a multiple of 8)
inline void store_row(const float* x, int64_t n, float* out) { std::copy(x, x + n, out); }
inline void store_row(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
}

// The sums of 8 accumulators, lane k holding accumulator k's: the same tree for every lane, so a key's score does
// not depend on the keys computed beside it.
inline __m256 sums8(const __m256 a[8]) {
  const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// Scores of keys j0..j0+KEYS-1 for one query (KEYS a compile-time count, so the loops unroll): each key's dot in
// its own accumulator, the 8 summed by one tree; p[k] = score * scale for k < 8 (0 beyond KEYS).
template <int KEYS, class KV>
inline void score_block(const float* q, const KV* K, int64_t D, float scale, float* p) {
  __m256 acc[8];
  for (int k = 0; k < 8; ++k) acc[k] = _mm256_setzero_ps();
  for (int64_t i = 0; i < D; i += 8) {
    const __m256 qi = _mm256_loadu_ps(q + i);
    for (int k = 0; k < KEYS; ++k) acc[k] = _mm256_fmadd_ps(qi, load8(K + k * D + i), acc[k]);
  }
  _mm256_storeu_ps(p, _mm256_mul_ps(sums8(acc), _mm256_set1_ps(scale)));
}

// out[0 .. 8 W) (+)= sum over the visible keys from <= j < to of w[j] * V_j[0 .. 8 W), key after key, in
// registers; resume: out holds the sum over the keys before `from` (a block of keys after another).
template <int W, class KV>
inline void weigh_values(const float* w, const KV* V, int64_t D, const bool* visible, int64_t from, int64_t to,
                         bool resume, float* out) {
  __m256 o[W];
  for (int c = 0; c < W; ++c) o[c] = resume ? _mm256_loadu_ps(out + 8 * c) : _mm256_setzero_ps();
  for (int64_t j = from; j < to; ++j) {
    if (visible && !visible[j]) continue;
    const __m256 wj = _mm256_set1_ps(w[j]);
    for (int c = 0; c < W; ++c) o[c] = _mm256_fmadd_ps(wj, load8(V + j * D + 8 * c), o[c]);
  }
  for (int c = 0; c < W; ++c) _mm256_storeu_ps(out + 8 * c, o[c]);
}

// One query head's attention over keys 0..last of its kv head (K, V: [S, D], D a multiple of 8), `visible` hiding
// some (nullptr: none): out [D] = softmax(q . K_j * scale) . V. p: its scratch of last + 9 floats.
struct Query {
  const float* q;
  const bool* visible;
  int64_t last;
  float* p;
  float* out;
};

// Scores of keys from..to-1 (from a multiple of 8; to = last + 1, or a multiple of 8 before it), 8 keys at a time,
// then the last few: the same per-key arithmetic
template <class KV>
inline void score_keys(const Query& a, const KV* K, int64_t D, float scale, int64_t from, int64_t to) {
  const int64_t full = from + ((to - from) & ~int64_t(7));
  for (int64_t j0 = from; j0 < full; j0 += 8) score_block<8>(a.q, K + j0 * D, D, scale, a.p + j0);
  below_eight(to - full, [&](auto C) { score_block<decltype(C)::value>(a.q, K + full * D, D, scale, a.p + full); });
}

// softmax over the visible scores p[0..last] in place, the hidden ones 0
inline void normalize(const Query& a) {
  float* p = a.p;
  const int64_t n = a.last + 1;
  float top = -INFINITY;
  for (int64_t j = 0; j < n; ++j)
    if (!a.visible || a.visible[j]) top = std::max(top, p[j]);
  exp_shifted(p, n, top);
  // The total in 8 partial sums (a chain of scalar adds waits on each one): the k-th visible weight goes to sum
  // k % 8, so a tree pass, whose hidden slots sit between the visible ones, adds what a one-token step adds.
  __m256 lanes = _mm256_setzero_ps();
  if (a.visible) {
    float partial[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int64_t j = 0, rank = 0; j < n; ++j) {
      if (!a.visible[j]) {
        p[j] = 0.f;
        continue;
      }
      partial[rank++ % 8] += p[j];
    }
    lanes = _mm256_loadu_ps(partial);
  } else {
    for (int64_t j = n; j < ((n + 7) & ~int64_t(7)); ++j) p[j] = 0.f;
    for (int64_t j = 0; j < n; j += 8) lanes = _mm256_add_ps(lanes, _mm256_loadu_ps(p + j));
  }
  const __m256 total = _mm256_set1_ps(hsum(lanes));
  for (int64_t j = 0; j < n; j += 8) _mm256_storeu_ps(p + j, _mm256_div_ps(_mm256_loadu_ps(p + j), total));
}

// out (+)= the weighed values of keys from..to-1 (to <= last + 1), 64 of out's values at a time: 8 chains
template <class KV>
inline void weigh_keys(const Query& a, const KV* V, int64_t D, int64_t from, int64_t to) {
  int64_t i0 = 0;
  const bool resume = from > 0;
  for (; i0 + 64 <= D; i0 += 64) weigh_values<8>(a.p, V + i0, D, a.visible, from, to, resume, a.out + i0);
  below_eight((D - i0) / 8, [&](auto W) {
    weigh_values<decltype(W)::value>(a.p, V + i0, D, a.visible, from, to, resume, a.out + i0);
  });
}

template <class KV>
void attend(const Query& a, const KV* K, const KV* V, int64_t D, float scale) {
  score_keys(a, K, D, scale, 0, a.last + 1);
  normalize(a);
  weigh_keys(a, V, D, 0, a.last + 1);
}

// Three queries at once, for passes of several rows where the CPU has AVX-512 (whose EVEX encoding gives 32 ymm
// registers): the keys' and values' loads are shared, and each query's every number is the one its own
// score_block / weigh_values computes (the same lanes, the same chains), so a row's bits do not depend on the
// queries beside it. Keys past a query's last, or hidden from it, get weight 0 in its sums (the values are those of
// this pass's or committed slots, so finite): fma(0, v, o) is o.
template <int KEYS, class KV>
__attribute__((target("avx512f,avx512vl"))) void score_block3(const Query* a, const KV* K, int64_t D, float scale,
                                                              int64_t j0) {
  __m256 s0[8], s1[8], s2[8];
  for (int k = 0; k < 8; ++k) s0[k] = s1[k] = s2[k] = _mm256_setzero_ps();
  for (int64_t i = 0; i < D; i += 8) {
    const __m256 q0 = _mm256_loadu_ps(a[0].q + i), q1 = _mm256_loadu_ps(a[1].q + i), q2 = _mm256_loadu_ps(a[2].q + i);
    for (int k = 0; k < KEYS; ++k) {
      const __m256 kv = load8(K + (j0 + k) * D + i);
      s0[k] = _mm256_fmadd_ps(q0, kv, s0[k]);
      s1[k] = _mm256_fmadd_ps(q1, kv, s1[k]);
      s2[k] = _mm256_fmadd_ps(q2, kv, s2[k]);
    }
  }
  const __m256 sc = _mm256_set1_ps(scale);
  _mm256_storeu_ps(a[0].p + j0, _mm256_mul_ps(sums8(s0), sc));
  _mm256_storeu_ps(a[1].p + j0, _mm256_mul_ps(sums8(s1), sc));
  _mm256_storeu_ps(a[2].p + j0, _mm256_mul_ps(sums8(s2), sc));
}

template <int W, class KV>
__attribute__((target("avx512f,avx512vl"))) void weigh_values3(const Query* a, const KV* V, int64_t D, int64_t i0,
                                                               int64_t from, int64_t to, bool resume) {
  __m256 o0[W], o1[W], o2[W];
  for (int c = 0; c < W; ++c) {
    o0[c] = resume ? _mm256_loadu_ps(a[0].out + i0 + 8 * c) : _mm256_setzero_ps();
    o1[c] = resume ? _mm256_loadu_ps(a[1].out + i0 + 8 * c) : _mm256_setzero_ps();
    o2[c] = resume ? _mm256_loadu_ps(a[2].out + i0 + 8 * c) : _mm256_setzero_ps();
  }
  for (int64_t j = from; j < to; ++j) {
    const __m256 w0 = _mm256_set1_ps(j <= a[0].last ? a[0].p[j] : 0.f);
    const __m256 w1 = _mm256_set1_ps(j <= a[1].last ? a[1].p[j] : 0.f);
    const __m256 w2 = _mm256_set1_ps(j <= a[2].last ? a[2].p[j] : 0.f);
    for (int c = 0; c < W; ++c) {
      const __m256 v = load8(V + j * D + i0 + 8 * c);
      o0[c] = _mm256_fmadd_ps(w0, v, o0[c]);
      o1[c] = _mm256_fmadd_ps(w1, v, o1[c]);
      o2[c] = _mm256_fmadd_ps(w2, v, o2[c]);
    }
  }
  for (int c = 0; c < W; ++c) {
    _mm256_storeu_ps(a[0].out + i0 + 8 * c, o0[c]);
    _mm256_storeu_ps(a[1].out + i0 + 8 * c, o1[c]);
    _mm256_storeu_ps(a[2].out + i0 + 8 * c, o2[c]);
  }
}

// Several queries over one kv head (a pass's rows with their query heads): each gets attend's arithmetic, key by
// key in the same order, in blocks of KEY_BLOCK keys that stay in cache for all of them; three at a time where
// the CPU has AVX-512 (score_block3, weigh_values3).
constexpr int64_t KEY_BLOCK = 64;

// each(i, j0, end) for every three queries i, i+1, i+2 taken together (the first `threes`) and one(a, j0, end) for
// each other query, over the blocks of KEY_BLOCK keys that reach them (end: the block's end for them)
template <class Three, class One>
void over_key_blocks(const std::vector<Query>& queries, int64_t threes, Three each, One one) {
  int64_t keys = 0;
  for (const Query& a : queries) keys = std::max(keys, a.last + 1);
  for (int64_t j0 = 0; j0 < keys; j0 += KEY_BLOCK) {
    for (int64_t i = 0; i < threes; i += 3) {
      const int64_t most = std::max({queries[i].last, queries[i + 1].last, queries[i + 2].last}) + 1;
      if (j0 < most) each(i, j0, std::min(j0 + KEY_BLOCK, most));
    }
    for (size_t i = threes; i < queries.size(); ++i)
      if (j0 <= queries[i].last) one(queries[i], j0, std::min(j0 + KEY_BLOCK, queries[i].last + 1));
  }
}

template <class KV>
void attend_many(const std::vector<Query>& queries, const KV* K, const KV* V, int64_t D, float scale) {
  const int64_t threes = avx512_on ? int64_t(queries.size()) / 3 * 3 : 0;  // queries taken three at a time
  over_key_blocks(
      queries, threes,
      [&](int64_t i, int64_t j0, int64_t end) {
        const int64_t full = j0 + ((end - j0) & ~int64_t(7));
        for (int64_t b = j0; b < full; b += 8) score_block3<8, KV>(&queries[i], K, D, scale, b);
        below_eight(end - full, [&](auto C) { score_block3<decltype(C)::value, KV>(&queries[i], K, D, scale, full); });
      },
      [&](const Query& a, int64_t j0, int64_t end) { score_keys(a, K, D, scale, j0, end); });
  for (const Query& a : queries) normalize(a);
  over_key_blocks(
      queries, threes,
      [&](int64_t i, int64_t j0, int64_t end) {
        int64_t i0 = 0;
        for (; i0 + 64 <= D; i0 += 64) weigh_values3<8, KV>(&queries[i], V, D, i0, j0, end, j0 > 0);
        for (; i0 < D; i0 += 8) weigh_values3<1, KV>(&queries[i], V, D, i0, j0, end, j0 > 0);
      },
      [&](const Query& a, int64_t j0, int64_t end) { weigh_keys(a, V, D, j0, end); });
}

}  // namespace
