// Kind GGUF: a GGUF file's blocks as it ships them, parts of rows in their own types.
#pragma once

#include "common.h"
#include "act_q8.h"
#include "gguf_blocks.h"
#include "kquants.h"

namespace {

// y [M, N] = x [M, K] W^T (+ bias) for GGUF blocks: output rows over torch's threads, each in its part's type, x's
// rows 4 at a time (K-quants: 8); q8: 8-bit activations, x's codes in blocks of 32 (xq, for the parts that are not
// K-quants) or as Q8_K (xk, for the K-quants)
bool is_kquant(int64_t type) { return type == GQ4_K || type == GQ5_K || type == GQ6_K; }

bool all_kquant(const Proj& p) {
  return std::all_of(p.parts, p.parts + p.n_parts, [](const GgufPart& part) { return is_kquant(part.type); });
}

void gemm_gguf(const Proj& p, const float* x, int64_t M, float* y, float*, bool q8) {
  RowsQ8 xq;
  if (q8 && !all_kquant(p)) quantize_rows(x, M, p.K, xq);
  RowsQ8K xk;  // K-quant parts' activations (Q8_K)
  if (q8 && std::any_of(p.parts, p.parts + p.n_parts, [](const GgufPart& part) { return is_kquant(part.type); }))
    quantize_rows(x, M, p.K, xk);
  at::parallel_for(0, p.N, 32, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const GgufPart& part = p.part_of(n);
      const uint8_t* row = part.base + (n - part.first) * part.row_bytes;
      with_gguf_type(part.type, [&](auto T) {
        constexpr int64_t type = decltype(T)::value;
        if (q8) {
          if constexpr (type == GQ4_K || type == GQ5_K || type == GQ6_K)
            in_eights(M, [&](auto R, int64_t m) {
              rows_kquant_q8<type, decltype(R)::value>(row, p.K, xk, m, y + m * p.N, p.N, n);
            });
          else
            in_fours(M, [&](auto R, int64_t m) {
              rows_gguf_q8<type, decltype(R)::value>(row, p.K, xq, m, y + m * p.N, p.N, n);
            });
        } else
          in_fours(M, [&](auto R, int64_t m) {
            rows_gguf<type, decltype(R)::value>(row, p.K, x + m * p.K, y + m * p.N, p.N, n);
          });
      });
      if (p.bias)
        for (int64_t r = 0; r < M; ++r) y[r * p.N + n] += p.bias[n];
    }
  });
}

// A GGUF projection's parts from its bytes (uint8 [total]) and layout (int64 [K, type, rows, type, rows, ...])
void gguf_parts(Proj& p, const torch::Tensor& bytes, const torch::Tensor& layout) {
  TORCH_CHECK(bytes.scalar_type() == at::kByte && bytes.dim() == 1 && bytes.is_contiguous(),
              "GGUF blocks: contiguous uint8 bytes [total] expected");
  TORCH_CHECK(layout.scalar_type() == at::kLong && layout.dim() == 1 && layout.numel() % 2 == 1 &&
                  layout.numel() >= 3 && layout.numel() <= 1 + 2 * GGUF_MAX_PARTS && layout.is_contiguous(),
              "GGUF layout: int64 [K, then (type, rows) for each of 1..", GGUF_MAX_PARTS, " parts] expected");
  const int64_t* l = layout.data_ptr<int64_t>();
  p.K = l[0];
  TORCH_CHECK(p.K > 0 && p.K % 32 == 0, "GGUF rows hold whole blocks of 32 inputs");
  p.codes = bytes.data_ptr<uint8_t>();
  p.N = 0;
  p.n_parts = (layout.numel() - 1) / 2;
  int64_t offset = 0;
  for (int64_t i = 0; i < p.n_parts; ++i) {
    const int64_t type = l[1 + 2 * i], rows = l[2 + 2 * i], row_bytes = gguf_row_bytes(type, p.K);
    TORCH_CHECK(rows > 0, "a GGUF part needs rows");
    p.parts[i] = GgufPart{type, p.N, rows, row_bytes, p.codes + offset};
    offset += rows * row_bytes;
    p.N += rows;
  }
  TORCH_CHECK(offset == bytes.numel(), "GGUF blocks: ", bytes.numel(), " bytes where the layout says ", offset);
}

}  // namespace
