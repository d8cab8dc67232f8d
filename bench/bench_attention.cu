// bench_attention: throughput of the CUDA attention (kernels/attention.cu), bf16, causal, varlen
// over device cu_seqlens with max_seqlen and total_seqlen hints (as the model calls it). Prints
// one JSON object on stdout: {"figures": {...}, "errors": {...}}.
//   attention_fwd_tflops / attention_bwd_tflops
//       head_dim 128, 16 query heads, 8 KV heads, 4 sequences of 8192 tokens (32768 in all)
//   attention_fwd_tflops_hd64 / attention_bwd_tflops_hd64
//       head_dim 64 with 32 query heads and 16 KV heads (the same 2048-wide model dimension, as
//       flash-attention's benchmarks keep it), 4 x 8192 tokens
//   attention_fwd_tflops_varlen / attention_bwd_tflops_varlen
//       head_dim 128, 16/8 heads, a packed mix of 130 sequences from 4096 down to 64 tokens
//       (32768 in all): many short sequences and a few long ones
//   attention_fwd_tflops_mha / attention_bwd_tflops_mha
//       head_dim 128, 16 query and 16 KV heads (no grouping), 4 x 8192 tokens
// Each setup runs once per implementation: the figures above are the path the model takes (auto:
// cuDNN's fused attention where it loads, kernels/attention_cudnn.h), and the same names with
// _own and _cudnn appended are leantune's kernels and cuDNN forced (cuDNN absent: an error entry
// says why). cuDNN's graph forms (kernels/attention_cudnn.cu) side by side: _cudnn is the form the
// model gets (dense for the 4 x 8192 setups, whose sequences have one length; ragged for varlen),
// _cudnn_ragged the ragged form with a top-left causal mask, _cudnn_ragged_br the ragged form
// with a bottom-right one (LEANTUNE_CUDNN_GRAPH). bench/torch_attention.py measures torch's SDPA
// (cuDNN and flash backends) on the 4 x 8192 setups, the yardstick of the targets. FLOPs as
// flash-attention counts them: forward = 4 Lq Lk D Hq per sequence, halved when causal (the matmuls
// only: 2 for Q K^T and 2 for P V per query-key pair and head dim); backward = 2.5 x forward (5
// matmuls against 2). The targets on an H100 SXM are fwd >= 350 and bwd >= 250 at head_dim 128 (FA2
// class). Timing: CUDA events, 2 warm-ups, median of --reps calls.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_util.cuh"
#include "engine/allocator.h"
#include "engine/check.h"
#include "engine/rng.h"
#include "engine/stream.h"
#include "engine/tensor.h"
#include "kernels/attention.h"

namespace lt = leantune;

namespace {

const lt::Device kGpu = lt::Device::cuda(0);

double median_ms(const std::function<void()>& fn, int reps) {
  return lt::bench::median_ms(fn, reps, 2);
}

lt::Tensor randn(const lt::Shape& s, uint64_t seed) {
  lt::Tensor t = lt::Tensor::empty(s, lt::DType::kBF16, kGpu);
  lt::Generator g(seed, lt::RngPurpose::kTest);
  lt::normal_(t, g, 0.0, 1.0);
  return t;
}

struct Setup {
  std::string suffix;
  int64_t hq, hk, d;
  std::vector<int64_t> lengths;
};

// 4096, 2 x 2048, 4 x 1024, ..., 64 x 64 (28672 tokens) plus 3000, 1000 and 96: 32768 tokens.
std::vector<int64_t> varlen_mix() {
  std::vector<int64_t> l;
  for (int64_t len = 4096, count = 1; len >= 64; len /= 2, count *= 2)
    for (int64_t i = 0; i < count; ++i) l.push_back(len);
  for (int64_t x : {3000, 1000, 96}) l.push_back(x);
  // Interleave long and short so that neighbouring sequences differ (as packing produces).
  std::vector<int64_t> mixed;
  for (size_t i = 0, j = l.size(); i < j; ++i) {
    mixed.push_back(l[i]);
    if (i + 1 < j) mixed.push_back(l[--j]);
  }
  return mixed;
}

void run(const Setup& s, lt::kernels::AttentionBackend backend, const std::string& tag, int reps,
         nlohmann::json& figures) {
  int64_t total = 0, max_len = 0;
  double fwd_flops = 0;
  std::vector<int32_t> cu = {0};
  for (int64_t len : s.lengths) {
    total += len;
    max_len = std::max(max_len, len);
    cu.push_back(static_cast<int32_t>(total));
    fwd_flops += 4.0 * static_cast<double>(len) * static_cast<double>(len) * s.d * s.hq / 2.0;
  }
  const lt::Tensor q = randn({total, s.hq, s.d}, 1), k = randn({total, s.hk, s.d}, 2),
                   v = randn({total, s.hk, s.d}, 3), dout = randn({total, s.hq, s.d}, 4);
  const lt::Tensor cu_d = lt::Tensor::from_vector(cu, {static_cast<int64_t>(cu.size())}).to(kGpu);
  lt::Tensor out = lt::Tensor::empty(q.shape(), lt::DType::kBF16, kGpu);
  lt::Tensor lse = lt::Tensor::empty({s.hq, total}, lt::DType::kF32, kGpu);
  lt::Tensor dq = lt::Tensor::empty(q.shape(), lt::DType::kBF16, kGpu);
  lt::Tensor dk = lt::Tensor::empty(k.shape(), lt::DType::kBF16, kGpu);
  lt::Tensor dv = lt::Tensor::empty(v.shape(), lt::DType::kBF16, kGpu);
  lt::kernels::AttentionOptions opt;
  opt.causal = true;
  opt.backend = backend;
  opt.max_seqlen_q = opt.max_seqlen_k = max_len;
  opt.total_seqlen = total;
  const double fwd_ms =
      median_ms([&] { lt::kernels::attention_fwd_cuda(q, k, v, cu_d, cu_d, opt, out, lse); }, reps);
  const double bwd_ms = median_ms(
      [&] {
        lt::kernels::attention_bwd_cuda(dout, q, k, v, out, lse, cu_d, cu_d, opt, dq, dk, dv);
      },
      reps);
  const double fwd = fwd_flops / (fwd_ms * 1e-3) / 1e12;
  const double bwd = 2.5 * fwd_flops / (bwd_ms * 1e-3) / 1e12;
  figures["attention_fwd_tflops" + s.suffix + tag] = fwd;
  figures["attention_bwd_tflops" + s.suffix + tag] = bwd;
  figures["attention_fwd_ms" + s.suffix + tag] = fwd_ms;
  figures["attention_bwd_ms" + s.suffix + tag] = bwd_ms;
  std::fprintf(stderr,
               "attention%-14s hd%-3lld %2lld/%-2lld heads %3zu seqs %6lld tokens: fwd %.3f ms "
               "(%.1f TFLOP/s), bwd %.3f ms (%.1f TFLOP/s)\n",
               (s.suffix + tag).c_str(), static_cast<long long>(s.d), static_cast<long long>(s.hq),
               static_cast<long long>(s.hk), s.lengths.size(), static_cast<long long>(total),
               fwd_ms, fwd, bwd_ms, bwd);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 10;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
  }
  nlohmann::json figures = nlohmann::json::object(), errors = nlohmann::json::object();
  try {
    if (!lt::cuda_available()) throw lt::Error(lt::ErrorKind::kInput, "no CUDA device");
    const std::vector<int64_t> four_8k(4, 8192);
    for (const Setup& s :
         {Setup{"", 16, 8, 128, four_8k}, Setup{"_hd64", 32, 16, 64, four_8k},
          Setup{"_varlen", 16, 8, 128, varlen_mix()}, Setup{"_mha", 16, 16, 128, four_8k}}) {
      using lt::kernels::AttentionBackend;
      struct Variant {
        AttentionBackend backend;
        std::string tag, graph;  // graph: LEANTUNE_CUDNN_GRAPH
      };
      const Variant variants[] = {
          {AttentionBackend::kAuto, "", "auto"},
          {AttentionBackend::kOwn, "_own", "auto"},
          {AttentionBackend::kCudnn, "_cudnn", "auto"},
          {AttentionBackend::kCudnn, "_cudnn_ragged", "ragged"},
          {AttentionBackend::kCudnn, "_cudnn_ragged_br", "ragged_bottom_right"}};
      for (const Variant& v : variants) {
        setenv("LEANTUNE_CUDNN_GRAPH", v.graph.c_str(), 1);
        try {
          run(s, v.backend, v.tag, reps, figures);
        } catch (const std::exception& e) {
          lt::bench::record_failure(errors, "attention" + s.suffix + v.tag, e);
        }
        lt::allocator(kGpu).empty_cache();
      }
      unsetenv("LEANTUNE_CUDNN_GRAPH");
    }
  } catch (const std::exception& e) {
    errors["setup"] = e.what();
  }
  const lt::kernels::CudnnAttentionStatus st = lt::kernels::cudnn_attention_status(0);
  figures["attention_cudnn_available"] = st.available ? 1 : 0;
  if (!st.available) errors["attention_cudnn"] = st.why;
  return lt::bench::print_report(figures, errors);
}
