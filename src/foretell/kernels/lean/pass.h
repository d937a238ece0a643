// The pass over a few rows: norms, rotary embeddings, cache writes, attention and the projections, layer by
// layer, for one sequence or several (segments).
#pragma once

#include "common.h"
#include "kinds.h"
#include "attention.h"

namespace {

void rms_norm(const float* x, const float* w, int64_t H, double eps, float* out) {
  double ss = 0;
  for (int64_t i = 0; i < H; ++i) ss += double(x[i]) * x[i];
  const float r = 1.f / std::sqrt(float(ss / H) + float(eps));
  for (int64_t i = 0; i < H; ++i) out[i] = (x[i] * r) * w[i];
}

// x * cos + rotate_half(x) * sin per head, rotate_half(x) = [-x[D/2:], x[:D/2]].
void rope(float* x, int64_t heads, int64_t D, const float* cos, const float* sin) {
  const int64_t half = D / 2;
  std::vector<float> t(D);
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * D;
    for (int64_t i = 0; i < half; ++i) {
      t[i] = v[i] * cos[i] - v[i + half] * sin[i];
      t[i + half] = v[i + half] * cos[i + half] + v[i] * sin[i + half];
    }
    std::copy(t.begin(), t.end(), v);
  }
}

// run(t) for each row t < T: on torch's threads where the rows are enough to pay for waking them (a row's
// arithmetic is its own either way)
template <class Run>
void rows_over_threads(int64_t T, Run run) {
  if (T < 4) {
    for (int64_t t = 0; t < T; ++t) run(t);
    return;
  }
  at::parallel_for(0, T, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) run(t);
  });
}

constexpr int64_t LAYER_TENSORS = 16;  // a layer's tensors in lean_decode's `layers` (its comment says which)

// One sequence's share of a pass: rows row0 .. row0 + rows - 1 of x, whose keys and values go to its own cache
// ([L, 1, kv_heads, S, D], float32, or float16: half the bytes every pass reads) at slots slot .. slot + rows - 1;
// seen: bool [rows, slot + rows], which slots each row attends to (nullptr: all committed ones and the new ones up
// to itself).
struct Segment {
  void* K;
  void* V;
  bool half;  // float16 caches (K, V hold uint16_t), else float32
  int64_t S, slot, row0, rows;
  const bool* seen;
};

// run(job) for jobs 0..n-1 on torch's threads, each thread taking the next job when it is free: a batch's sequences
// differ in context length, and a fixed split left one core waiting on the other's long contexts. A job's
// arithmetic is its own whichever thread runs it.
template <class Run>
void dynamic_jobs(int64_t n, Run run) {
  std::atomic<int64_t> next{0};
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n));
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t job = next.fetch_add(1); job < n; job = next.fetch_add(1)) run(job);
  });
}

// The pass itself over the rows of every segment: projections, norms and MLPs once over all rows (each weight
// read once a pass), rotary rows and cache writes per row, attention per segment over its own cache. Every row
// gets the arithmetic it would get alone. logit_rows: the rows projected to the vocabulary, in order (nullptr: all).
std::vector<torch::Tensor> run_pass(torch::Tensor x, torch::Tensor cos, torch::Tensor sin,
                                    const std::vector<Segment>& segments, int64_t L, int64_t D,
                                    const std::vector<torch::Tensor>& layers, const std::vector<torch::Tensor>& head,
                                    const std::vector<int64_t>& kinds, int64_t heads, int64_t kv_heads, double eps,
                                    bool act_q8, torch::Tensor side, torch::Tensor side_norm,
                                    const std::vector<int64_t>* logit_rows) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "float32 activations x [T, H] expected");
  x = x.contiguous();
  cos = cos.contiguous();
  sin = sin.contiguous();
  const int64_t T = x.size(0), H = x.size(1);
  TORCH_CHECK(cos.size(0) == T && cos.size(1) == D && sin.sizes() == cos.sizes(), "rotary rows [T, head_dim] expected");
  TORCH_CHECK(D % 8 == 0, "the lean step's attention reads head sizes that are multiples of 8");
  // head = [final norm] alone (and no head kind): no output projection, empty logits (a hidden-state draft's chain
  // steps, whose logits come from one product over the whole chain afterwards)
  const bool has_head = head.size() > 1;
  TORCH_CHECK(static_cast<int64_t>(layers.size()) == L * LAYER_TENSORS &&
                  static_cast<int64_t>(kinds.size()) == L * 4 + (has_head ? 1 : 0) && !head.empty(),
              "16 tensors and 4 kinds a layer, then the final norm and the head's projection (with its kind) expected");
  const bool has_side = side.numel() > 0;
  TORCH_CHECK(!has_side || (side.scalar_type() == at::kFloat && side.dim() == 2 && side.size(0) == T &&
                            side.size(1) == H && side_norm.numel() == H),
              "side: float [T, H] with a norm weight [H] expected");
  if (has_side) {
    side = side.contiguous();
    side_norm = side_norm.contiguous();
  }
  std::vector<int64_t> segment_of(T, -1);
  for (size_t i = 0; i < segments.size(); ++i)
    for (int64_t t = segments[i].row0; t < segments[i].row0 + segments[i].rows; ++t) segment_of[t] = i;
  TORCH_CHECK(std::find(segment_of.begin(), segment_of.end(), -1) == segment_of.end(), "every row needs a segment");
  if (logit_rows)
    for (int64_t r : *logit_rows) TORCH_CHECK(r >= 0 && r < T, "logit rows must be rows of the pass");
  const int64_t q_dim = heads * D, kv_dim = kv_heads * D, group = heads / kv_heads;
  const float scale = 1.f / std::sqrt(float(D));
  const float* c = cos.data_ptr<float>();
  const float* s = sin.data_ptr<float>();
  int64_t widest_keys = 0;
  for (const Segment& sg : segments) widest_keys = std::max(widest_keys, sg.slot + sg.rows);

  auto states = torch::empty({L + 1, T, H}, x.options());
  float* st = states.data_ptr<float>();
  std::vector<float> h(x.data_ptr<float>(), x.data_ptr<float>() + T * H), normed(T * H), tmp(T * H);
  std::copy(h.begin(), h.end(), st);
  std::vector<float> sums, qkv, att(T * q_dim), mlp, act, joined_in;
  for (int64_t l = 0; l < L; ++l) {
    const size_t at = l * LAYER_TENSORS;
    const int64_t* kind = kinds.data() + l * 4;
    const float* in_norm = layers[at].data_ptr<float>();
    const float* post_norm = layers[at + 1].data_ptr<float>();
    const float* q_norm = layers[at + 14].numel() ? layers[at + 14].data_ptr<float>() : nullptr;
    const float* k_norm = layers[at + 15].numel() ? layers[at + 15].data_ptr<float>() : nullptr;
    TORCH_CHECK((!q_norm || layers[at + 14].numel() == D) && (!k_norm || layers[at + 15].numel() == D),
                "q / k norms of head_dim weights expected");
    Proj p_qkv = proj_of(kind[0], layers, at + 2), p_o = proj_of(kind[1], layers, at + 5);
    Proj p_gu = proj_of(kind[2], layers, at + 8), p_down = proj_of(kind[3], layers, at + 11);
    const bool joined = has_side && l == 0;  // EAGLE-3's layer: q, k, v read [norm(side), norm(h)]
    TORCH_CHECK(p_qkv.N == q_dim + 2 * kv_dim && p_gu.N == 2 * p_down.K && p_qkv.K == (joined ? 2 * H : H),
                "projection shapes");
    const int64_t widest = std::max({p_qkv.K, p_o.K, p_gu.K, p_down.K});
    sums.resize(T * (widest / 32 + 1));
    qkv.resize(T * p_qkv.N);
    mlp.resize(T * p_gu.N);
    act.resize(T * p_down.K);

    if (joined) {
      joined_in.resize(T * 2 * H);
      for (int64_t t = 0; t < T; ++t) {
        rms_norm(side.data_ptr<float>() + t * H, side_norm.data_ptr<float>(), H, eps, joined_in.data() + t * 2 * H);
        rms_norm(h.data() + t * H, in_norm, H, eps, joined_in.data() + t * 2 * H + H);
      }
      gemm(p_qkv, joined_in.data(), T, qkv.data(), sums.data(), act_q8);
    } else {
      rows_over_threads(T, [&](int64_t t) { rms_norm(h.data() + t * H, in_norm, H, eps, normed.data() + t * H); });
      gemm(p_qkv, normed.data(), T, qkv.data(), sums.data(), act_q8);
    }
    const int64_t layer_offset = l * kv_heads;  // in units of S * D, times each segment's S
    for (int64_t t = 0; t < T; ++t) {
      const Segment& sg = segments[segment_of[t]];
      float* q = qkv.data() + t * p_qkv.N;
      float* k = q + q_dim;
      float* v = k + kv_dim;
      for (int64_t g = 0; q_norm && g < heads; ++g) rms_norm(q + g * D, q_norm, D, eps, q + g * D);  // Qwen3
      for (int64_t g = 0; k_norm && g < kv_heads; ++g) rms_norm(k + g * D, k_norm, D, eps, k + g * D);
      rope(q, heads, D, c + t * D, s + t * D);
      rope(k, kv_heads, D, c + t * D, s + t * D);
      const int64_t slot = sg.slot + t - sg.row0;
      for (int64_t g = 0; g < kv_heads; ++g) {
        const int64_t at = ((layer_offset + g) * sg.S + slot) * D;
        if (sg.half) {
          store_row(k + g * D, D, static_cast<uint16_t*>(sg.K) + at);
          store_row(v + g * D, D, static_cast<uint16_t*>(sg.V) + at);
        } else {
          store_row(k + g * D, D, static_cast<float*>(sg.K) + at);
          store_row(v + g * D, D, static_cast<float*>(sg.V) + at);
        }
      }
    }
    auto query = [&](int64_t t, int64_t hq, float* p) {
      const Segment& sg = segments[segment_of[t]];
      const int64_t keys = sg.slot + sg.rows, local = t - sg.row0;
      return Query{qkv.data() + t * p_qkv.N + hq * D, sg.seen ? sg.seen + local * keys : nullptr,
                   sg.seen ? keys - 1 : sg.slot + local, p, att.data() + t * q_dim + hq * D};
    };
    // every segment's cache holds one type (lean_decode_packed checks): the attention's loads are compiled for it
    auto attention = [&](auto kv_type) {
      using KV = decltype(kv_type);
      auto keys_of = [&](const Segment& sg, int64_t g) {
        return static_cast<const KV*>(sg.K) + (layer_offset + g) * sg.S * D;
      };
      auto values_of = [&](const Segment& sg, int64_t g) {
        return static_cast<const KV*>(sg.V) + (layer_offset + g) * sg.S * D;
      };
      // Few queries (a one-token step): a job a query head, to keep the threads busy. More: a job a segment, kv head
      // and chunk of its rows, whose queries read each block of keys and values once (attend_many). Either way each
      // query gets the same arithmetic.
      const int64_t threads = at::get_num_threads();
      if (T * kv_heads < 4 * threads) {
        dynamic_jobs(T * heads, [&](int64_t job) {
          std::vector<float> p(widest_keys + 8);
          const int64_t t = job / heads, hq = job % heads, g = hq / group;
          const Segment& sg = segments[segment_of[t]];
          attend(query(t, hq, p.data()), keys_of(sg, g), values_of(sg, g), D, scale);
        });
      } else {
        struct Job { int64_t segment, g, t0, t1; };
        std::vector<Job> jobs;
        const int64_t wanted = (2 * threads + kv_heads * int64_t(segments.size()) - 1) / (kv_heads * segments.size());
        for (size_t i = 0; i < segments.size(); ++i) {
          const Segment& sg = segments[i];
          const int64_t chunks = std::min(sg.rows, std::max<int64_t>(1, wanted));
          for (int64_t g = 0; g < kv_heads; ++g)
            for (int64_t chunk = 0; chunk < chunks; ++chunk)
              jobs.push_back({int64_t(i), g, sg.row0 + sg.rows * chunk / chunks, sg.row0 + sg.rows * (chunk + 1) / chunks});
        }
        dynamic_jobs(jobs.size(), [&](int64_t index) {
          const Job& job = jobs[index];
          const Segment& sg = segments[job.segment];
          const int64_t stride = sg.slot + sg.rows + 8;
          std::vector<float> p((job.t1 - job.t0) * group * stride);
          std::vector<Query> queries;
          for (int64_t t = job.t0; t < job.t1; ++t)
            for (int64_t hq = job.g * group; hq < (job.g + 1) * group; ++hq)
              queries.push_back(query(t, hq, p.data() + queries.size() * stride));
          attend_many(queries, keys_of(sg, job.g), values_of(sg, job.g), D, scale);
        });
      }
    };
    if (segments[0].half)
      attention(uint16_t{});
    else
      attention(float{});
    gemm(p_o, att.data(), T, tmp.data(), sums.data(), act_q8);
    for (int64_t i = 0; i < T * H; ++i) h[i] += tmp[i];
    rows_over_threads(T, [&](int64_t t) { rms_norm(h.data() + t * H, post_norm, H, eps, normed.data() + t * H); });
    gemm(p_gu, normed.data(), T, mlp.data(), sums.data(), act_q8);
    const int64_t I = p_down.K;
    rows_over_threads(T, [&](int64_t t) {  // SiLU(gate) * up, gate = g: g / (1 + e^-g)
      const float* g = mlp.data() + t * 2 * I;
      float* a = act.data() + t * I;
      for (int64_t i = 0; i < I; ++i) a[i] = -g[i];
      exp_shifted(a, I, 0.f);
      for (int64_t i = 0; i < I; ++i) a[i] = g[i] / (1.f + a[i]) * g[I + i];
    });
    gemm(p_down, act.data(), T, tmp.data(), sums.data(), act_q8);
    for (int64_t i = 0; i < T * H; ++i) h[i] += tmp[i];
    if (l + 1 < L) std::copy(h.begin(), h.end(), st + (l + 1) * T * H);
  }
  auto last = torch::empty({T, H}, x.options());  // the last layer's output before the final norm
  std::copy(h.begin(), h.end(), last.data_ptr<float>());
  for (int64_t t = 0; t < T; ++t) rms_norm(h.data() + t * H, head[0].data_ptr<float>(), H, eps, normed.data() + t * H);
  std::copy(normed.begin(), normed.end(), st + L * T * H);
  if (!has_head) return {torch::empty({T, 0}, x.options()), states, last};
  Proj p_head = proj_of(kinds[L * 4], head, 1);
  const float* rows_in = normed.data();
  int64_t R = T;
  std::vector<float> picked;
  if (logit_rows) {  // only these rows' logits (a prompt chunk needs none)
    R = logit_rows->size();
    picked.resize(R * H);
    for (int64_t i = 0; i < R; ++i) {
      const int64_t row = (*logit_rows)[i];
      std::copy(normed.begin() + row * H, normed.begin() + (row + 1) * H, picked.begin() + i * H);
    }
    rows_in = picked.data();
  }
  sums.resize(R * (p_head.K / 32 + 1) + 1);
  auto logits = torch::empty({R, p_head.N}, x.options());
  if (R > 0) gemm(p_head, rows_in, R, logits.data_ptr<float>(), sums.data(), act_q8);
  return {logits, states, last};
}

Segment segment_of_cache(torch::Tensor& k_cache, torch::Tensor& v_cache, int64_t slot, int64_t row0, int64_t rows,
                         torch::Tensor& visible, int64_t L, int64_t kv_heads) {
  const bool half = k_cache.scalar_type() == at::kHalf;
  TORCH_CHECK((half || k_cache.scalar_type() == at::kFloat) && v_cache.scalar_type() == k_cache.scalar_type(),
              "float32 or float16 caches (keys and values alike) expected");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.sizes() == v_cache.sizes(),
              "contiguous caches of one shape expected");
  TORCH_CHECK(k_cache.dim() == 5 && k_cache.size(0) == L && k_cache.size(1) == 1 && k_cache.size(2) == kv_heads,
              "cache shape [layers, 1, kv_heads, slots, head_dim] expected");
  const int64_t keys = slot + rows;
  TORCH_CHECK(slot >= 0 && keys <= k_cache.size(3), "the pass's slots run past the cache");
  TORCH_CHECK(visible.numel() == 0 || (visible.scalar_type() == at::kBool && visible.dim() == 2 &&
                                       visible.size(0) == rows && visible.size(1) == keys),
              "visible: bool [T, slot + T] expected");
  visible = visible.contiguous();
  return Segment{k_cache.data_ptr(), v_cache.data_ptr(), half, k_cache.size(3), slot, row0, rows,
                 visible.numel() ? visible.data_ptr<bool>() : nullptr};
}

}  // namespace
