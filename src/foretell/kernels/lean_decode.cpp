// A pass of a few tokens (a one-token decode step, a verification pass) of a Llama-shaped model in a single native
// call: every layer's norms, projections, rotary embedding, cache writes, attention, MLP and the output layer, in
// fp32 activations.
//
// Why: in eager PyTorch a one-token step of a small model issues ~20 operations a layer, each with a few
// microseconds of dispatch and a temporary tensor; on a 2-core CPU that overhead cost as much as streaming the
// 4-bit weights themselves. Here the only per-layer costs are reading the weights and a handful of OpenMP
// regions. The arithmetic is the PyTorch path's (models/transformer.py) in fp32, so a lean step and a PyTorch
// pass over the same weights agree up to summation order, as passes of different widths already do.
//
// Projection weights come in these kinds (runtime/lean_step.py packs them):
//   Q4: GGUF Q4_1 blocks of 32 inputs: codes uint8 [N, K / 2] (byte j of a block holds input j in its low nibble
//       and input j + 16 in its high nibble), dm float [N, K / 32, 2] = (d, m), w = d * code + m
//   Q8: GGUF Q8_0 blocks of 32 inputs: codes int8 [N, K], d float [N, K / 32], w = d * code
//   F32: a dense float weight [N, K]
//   BF16: a dense bfloat16 weight [N, K] (a bf16 is the top half of an fp32: widened exactly in registers), half
//         F32's bytes for the same values where a float32 model's weights are bf16 numbers
//   BF16X: the same with 16 output columns interleaved, [N / 16, K, 16] (lean_step.bf16_interleaved; group_x16)
//   I8X: int8 weights with a scale per output column (a drafter's int8 layers, quant.Int8Linear), 16 output columns
//        interleaved: codes int8 [N / 16, K, 16], scales float [N] (Int8Linear.columns16; group_x16)
//   BF16A: a bf16 model's weight (bf16 products: activations rounded to bf16, fp32 sums) in AMX's tile layout,
//          [N / 16, K / 2, 32]: per 16 output columns and pair of inputs, the columns' two weights side by side
//          (lean_step.amx_tiles; tiles_amx)
// and, with 8-bit activations only, the same blocks with 8 output columns interleaved (lean_step.interleaved;
// lean/interleaved.h says how):
//   Q4X: codes uint8 [N / 8, K / 32, 128], scales float [N / 8, K / 32, 2, 8] (the 8 columns' d, then their m)
//   Q8X: codes int8 [N / 8, K / 32, 256], scales float [N / 8, K / 32, 8]
//   KQ4X: a GGUF projection all in Q4_K blocks, 8 output columns interleaved (8-bit activations only;
//         lean/kq4x.h: interleave_q4k)
//   KQ6X: the same for a projection all in Q6_K blocks (interleave_q6k)
//   GGUF: a GGUF file's blocks as it ships them, bytes uint8 [total] and a layout int64 [1 + 2 P]: K, then each
//         part's (ggml type, rows); the parts' rows follow one another (a fused q, k, v may mix Q4_K and Q6_K, as
//         llama.cpp's Q4_K_M files do). Types Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K (lean/gguf_blocks.h)
//
// The source is one translation unit: this file includes lean/*.h in order and binds the Python functions. A kind
// of weight is a header (its layout, products and packer) and a row of kinds.h's table (its tensors' unpacking and
// its product); an instruction set's separate path is a header, switched on where the CPU has it.
//   common.h          the kinds, Proj, vector helpers, splitting a pass's rows into compile-time sizes
//   act_q8.h          8-bit activations (RowsQ8, RowsQ8K)
//   rows.h            Q4, Q8, F32, BF16: an output column a row of weights
//   columns_avx512.h  BF16X, I8X on AVX-512 (lean_avx512)
//   columns.h         BF16X, I8X (AVX2, or AVX-512 where it is on)
//   amx.h             BF16A on AMX tiles (lean_amx)
//   vnni.h            AVX-512 VNNI's switch (lean_vnni; the VNNI sums sit beside each kind's AVX2 ones)
//   interleaved.h     Q4X, Q8X, and the interleaved kinds' prefetch
//   gguf_blocks.h     GGUF block types and their rows
//   kquants.h         K-quant rows with Q8_K activations, and what the interleaved K-quants share (packer, product)
//   kq4x.h, kq6x.h    KQ4X, KQ6X
//   gguf.h            the GGUF kind
//   kinds.h           the table of kinds: a projection's tensors as a Proj, and its product
//   attention.h       attention over a cache
//   pass.h            the pass itself (run_pass)

#include "lean/common.h"
#include "lean/act_q8.h"
#include "lean/rows.h"
#include "lean/columns_avx512.h"
#include "lean/columns.h"
#include "lean/amx.h"
#include "lean/vnni.h"
#include "lean/interleaved.h"
#include "lean/gguf_blocks.h"
#include "lean/kquants.h"
#include "lean/kq4x.h"
#include "lean/kq6x.h"
#include "lean/gguf.h"
#include "lean/kinds.h"
#include "lean/attention.h"
#include "lean/pass.h"

// A pass of T new tokens (a one-token step, or a verification pass of a few rows) after the cache's first `slot`
// slots. x: [T, H] their embeddings; cos, sin: [T, D] their rotary rows; k_cache, v_cache: [L, 1, Hkv, S, D] float,
// the new keys and values go to slots slot..slot+T-1; visible: bool [T, slot + T], which slots each new token
// attends to (empty: all committed ones and the new ones up to itself). layers: per layer 2 norms, 4 projections
// (qkv, o, gate_up, down) as (codes or dense, scales, bias), then the RMSNorm weights [D] of each query and key head
// before rotary (Qwen3; empty: none), LAYER_TENSORS in all; head: the final norm, then the output
// projection (or the final norm alone: no logits); kinds: the projections' kinds, 4 a layer then the head's.
// side, side_norm (empty: none): EAGLE-3's head, whose one layer reads q, k and v from [norm(side), norm(x)] (the
// token embeddings beside the hidden states) and keeps x as its residual.
// Returns (logits [T, V], states [L + 1, T, H]: the embeddings, each layer's output but the last, the final normed
// states; and the last layer's output before the final norm [T, H]). Every row gets the arithmetic it would get
// alone: a token verified in a pass and the same token decoded in a one-token step compute the same numbers.
std::vector<torch::Tensor> lean_decode(torch::Tensor x, torch::Tensor cos, torch::Tensor sin, torch::Tensor k_cache,
                                       torch::Tensor v_cache, int64_t slot, torch::Tensor visible,
                                       std::vector<torch::Tensor> layers, std::vector<torch::Tensor> head,
                                       std::vector<int64_t> kinds, int64_t heads, int64_t kv_heads, double eps,
                                       bool act_q8, torch::Tensor side, torch::Tensor side_norm) {
  TORCH_CHECK(x.dim() == 2, "float32 activations x [T, H] expected");
  const int64_t L = k_cache.size(0), D = k_cache.size(4);
  const std::vector<Segment> segments = {segment_of_cache(k_cache, v_cache, slot, 0, x.size(0), visible, L, kv_heads)};
  return run_pass(x, cos, sin, segments, L, D, layers, head, kinds, heads, kv_heads, eps, act_q8, side, side_norm,
                  nullptr);
}

// One pass over several sequences' rows (continuous batching): x [T, H] holds segment 0's rows, then segment 1's,
// ...; segment i writes its own caches k_caches[i], v_caches[i] ([L, 1, Hkv, S_i, D]) after its first slots[i]
// slots, with visibles[i] as lean_decode's `visible` (empty: causal). The weights are read once for all rows.
// logit_rows: the rows projected to the vocabulary, in order (empty: none). side, side_norm: as lean_decode's, side
// [T, H] holding every segment's rows in x's order (EAGLE-3 heads' steps for several requests). Returns (logits [len(logit_rows), V],
// states [L + 1, T, H], the last layer's output before the final norm [T, H]); each row's numbers are those of
// lean_decode over its sequence alone.
std::vector<torch::Tensor> lean_decode_packed(torch::Tensor x, torch::Tensor cos, torch::Tensor sin,
                                              std::vector<torch::Tensor> k_caches, std::vector<torch::Tensor> v_caches,
                                              std::vector<int64_t> slots, std::vector<int64_t> rows,
                                              std::vector<torch::Tensor> visibles, std::vector<torch::Tensor> layers,
                                              std::vector<torch::Tensor> head, std::vector<int64_t> kinds,
                                              int64_t heads, int64_t kv_heads, double eps, bool act_q8,
                                              std::vector<int64_t> logit_rows, torch::Tensor side,
                                              torch::Tensor side_norm) {
  const size_t n = k_caches.size();
  TORCH_CHECK(n > 0 && v_caches.size() == n && slots.size() == n && rows.size() == n && visibles.size() == n,
              "one cache pair, slot, row count and mask a segment expected");
  TORCH_CHECK(x.dim() == 2, "float32 activations x [T, H] expected");
  const int64_t L = k_caches[0].size(0), D = k_caches[0].size(4);
  std::vector<Segment> segments;
  int64_t row0 = 0;
  for (size_t i = 0; i < n; ++i) {
    TORCH_CHECK(rows[i] > 0, "every segment needs a row");
    TORCH_CHECK(k_caches[i].dim() == 5 && k_caches[i].size(4) == D, "all caches of one model expected");
    segments.push_back(segment_of_cache(k_caches[i], v_caches[i], slots[i], row0, rows[i], visibles[i], L, kv_heads));
    row0 += rows[i];
  }
  TORCH_CHECK(row0 == x.size(0), "the segments' rows must add up to x's");
  for (const Segment& sg : segments) TORCH_CHECK(sg.half == segments[0].half, "all caches of one type expected");
  return run_pass(x, cos, sin, segments, L, D, layers, head, kinds, heads, kv_heads, eps, act_q8, side, side_norm,
                  &logit_rows);
}

// y [M, N] = x [M, K] W^T for W as Q4 or Q8 blocks, GGUF blocks (codes: the bytes, scales: the layout), a BF16 weight
// or I8X columns (kind, codes, scales as above; a BF16 weight's scales empty): the products of a pass over the same weights as the lean step, with the same
// per-row arithmetic.
torch::Tensor block_gemm(torch::Tensor x, int64_t kind, torch::Tensor codes, torch::Tensor scales, bool act_q8) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "x float32 [M, K] expected");
  TORCH_CHECK(is_kind(kind) && KINDS[kind].block_gemm,
              "Q4 or Q8 blocks, GGUF blocks, a bf16 weight or interleaved int8 columns expected");
  x = x.contiguous();
  const std::vector<torch::Tensor> parts = {codes.contiguous(), scales.contiguous(), torch::empty({0})};
  Proj p = proj_of(kind, parts, 0);
  TORCH_CHECK(x.size(1) == p.K && p.K % KINDS[kind].inputs == 0,
              "x's width does not match the weight");
  const int64_t M = x.size(0);
  auto y = torch::empty({M, p.N}, x.options());
  std::vector<float> sums(M * (p.K / 32) + 1);
  gemm(p, x.data_ptr<float>(), M, y.data_ptr<float>(), sums.data(), act_q8);
  return y;
}

// The float32 weight [N, K] of Q4 blocks (w = d * code + m): a prompt's many-row product runs dense on it, and
// PyTorch's unpacking of the codes cost ~1.3 ms a projection per prompt (runtime/lean_step.dequantize_q4).
torch::Tensor dequantize_q4(torch::Tensor codes, torch::Tensor dm) {
  TORCH_CHECK(codes.scalar_type() == at::kByte && dm.scalar_type() == at::kFloat && codes.dim() == 2,
              "Q4 blocks expected: codes uint8 [N, K / 2], dm float [N, K / 32, 2]");
  codes = codes.contiguous();
  dm = dm.contiguous();
  const int64_t N = codes.size(0), K = codes.size(1) * 2, blocks = K / 32;
  TORCH_CHECK(dm.numel() == N * blocks * 2, "dm does not match the codes");
  auto out = torch::empty({N, K}, dm.options());
  const uint8_t* c = codes.data_ptr<uint8_t>();
  const float* s = dm.data_ptr<float>();
  float* w = out.data_ptr<float>();
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    const __m128i low4 = _mm_set1_epi8(0x0F);
    for (int64_t n = begin; n < end; ++n) {
      for (int64_t b = 0; b < blocks; ++b) {
        const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(c + n * (K / 2) + 16 * b));
        const __m128i lo = _mm_and_si128(raw, low4), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low4);
        const __m256 q[4] = {bytes_u8(lo), bytes_u8(_mm_srli_si128(lo, 8)), bytes_u8(hi),
                             bytes_u8(_mm_srli_si128(hi, 8))};
        const __m256 d = _mm256_set1_ps(s[(n * blocks + b) * 2]), m = _mm256_set1_ps(s[(n * blocks + b) * 2 + 1]);
        for (int j = 0; j < 4; ++j) _mm256_storeu_ps(w + n * K + 32 * b + 8 * j, _mm256_fmadd_ps(q[j], d, m));
      }
    }
  });
  return out;
}

// The float32 weight [N, K] of GGUF blocks (bytes, layout as the GGUF kind reads them): chunk_weights' values, the
// reference dequantization's up to one rounding (a prompt's many-row product runs dense on it)
torch::Tensor dequantize_gguf(torch::Tensor bytes, torch::Tensor layout) {
  Proj p;
  p.kind = GGUF;
  bytes = bytes.contiguous();
  layout = layout.contiguous();
  gguf_parts(p, bytes, layout);
  auto out = torch::empty({p.N, p.K}, torch::kFloat);
  float* w = out.data_ptr<float>();
  at::parallel_for(0, p.N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const GgufPart& part = p.part_of(n);
      const uint8_t* row = part.base + (n - part.first) * part.row_bytes;
      with_gguf_type(part.type, [&](auto T) { dequantize_gguf_row<decltype(T)::value>(row, p.K, w + n * p.K); });
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("block_gemm", &block_gemm, "x fp32 [M, K] times a block or packed weight -> fp32 [M, N]", py::arg("x"),
        py::arg("kind"), py::arg("codes"), py::arg("scales"), py::arg("act_q8") = false,
        py::call_guard<py::gil_scoped_release>());
  m.def("dequantize_q4", &dequantize_q4, "Q4_1 blocks -> the float32 weight [N, K]",
        py::call_guard<py::gil_scoped_release>());
  m.def("interleave_q4k", &interleave_q4k, "Q4_K rows (bytes, N, K) -> KQ4X records [N / 8, K / 256, 1184]",
        py::call_guard<py::gil_scoped_release>());
  m.def("interleave_q6k", &interleave_q6k, "Q6_K rows (bytes, N, K) -> KQ6X records [N / 8, K / 256, 1680]",
        py::call_guard<py::gil_scoped_release>());
  m.def("dequantize_gguf", &dequantize_gguf, "GGUF blocks (bytes, layout) -> the float32 weight [N, K]",
        py::call_guard<py::gil_scoped_release>());
  m.def("lean_avx512", &lean_avx512, "BF16X / I8X products on AVX-512 (the default where the CPU has it): "
        "whether they now are");
  m.def("lean_prefetch", &lean_prefetch, "how many groups of 8 columns ahead the interleaved products fetch their "
        "weights (0: off, for A/B runs); returns it", py::arg("groups"));
  m.def("lean_vnni", &lean_vnni, "Q4X / Q8X products on AVX-512 VNNI (the default where the CPU has it): whether "
        "they now are");
  m.def("lean_amx", &lean_amx, "BF16A products on AMX (the default where the CPU has it and Linux grants its "
        "tile state): whether they now are");
  m.def("amx_enabled", [] { return amx_on; }, "whether BF16A products now run on AMX");
  m.def("lean_decode", &lean_decode, "a pass of a few tokens through a Llama-shaped model, fp32 activations",
        py::call_guard<py::gil_scoped_release>());  // other Python threads (a server's) run meanwhile
  m.def("lean_decode_packed", &lean_decode_packed, "one pass over several sequences' rows, each with its own cache",
        py::call_guard<py::gil_scoped_release>());
}
