// bench_linear_divergence: the chunked distillation loss (kernels/linear_divergence.h on CUDA:
// cuBLASLt blocks of logits and the row passes of kernels/divergence_blocks.cu), forward and
// backward through autograd, at the shapes of trainer_bin distill with a Qwen2.5-1.5B student
// (H 1536) and a Qwen2.5-7B teacher (H 3584) over Qwen's vocabulary (V 151936), bf16 hidden
// states and heads, every row counted. Prints one JSON object on stdout:
// {"figures": {...}, "errors": {...}}.
//   linear_divergence_<rkl|jsd>_ms_<4k|16k>          forward + backward, one call each
//   linear_divergence_<rkl|jsd>_tflops_<4k|16k>      the op's GEMM FLOPs / time: forward
//                                                    2TV(Hs+Ht) per pass (one pass for a KL, two
//                                                    for the JSD), backward 2TV(Hs+Ht) to
//                                                    recompute and 4TVHs for dX and dW
//   linear_divergence_<rkl|jsd>_peak_extra_gib_<4k|16k>  peak device memory above the inputs
//   linear_divergence_logits_gib_avoided_<4k|16k>    what whole logits would hold: both models'
//                                                    [T, V] in f32 and the student's gradient
// Targets (issue 31's rule for fused losses): TFLOP/s near the plain GEMM rate of bench_linear,
// peak extra far below the logits avoided. Timing: CUDA events around whole calls, 1 warm-up,
// median of --reps calls.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/bench_util.cuh"
#include "engine/allocator.h"
#include "engine/autograd.h"
#include "engine/check.h"
#include "engine/rng.h"
#include "engine/stream.h"
#include "engine/tensor.h"
#include "kernels/linear_divergence.h"

namespace lt = leantune;

namespace {

const lt::Device kGpu = lt::Device::cuda(0);
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

void run(int64_t t, const std::string& suffix, int reps, nlohmann::json& figures) {
  const int64_t hs = 1536, ht = 3584, v = 151936;
  const lt::Tensor xs = lt::bench::bf16_randn({t, hs}, 21, 1.0),
                   ws = lt::bench::bf16_randn({v, hs}, 22, 0.02);
  const lt::Tensor xt = lt::bench::bf16_randn({t, ht}, 23, 1.0),
                   wt = lt::bench::bf16_randn({v, ht}, 24, 0.02);
  const lt::Tensor mask = lt::Tensor::full({t}, 1.0, lt::DType::kI64, kGpu);
  const lt::Tensor upstream =
      lt::Tensor::full({t}, 1.0 / static_cast<double>(t), lt::DType::kF32, kGpu);
  figures["linear_divergence_logits_gib_avoided" + suffix] =
      3.0 * static_cast<double>(t) * static_cast<double>(v) * 4.0 / kGiB;
  for (const auto& [name, beta] : {std::pair<std::string, double>{"rkl", 1.0}, {"jsd", 0.5}}) {
    lt::kernels::LinearDivergenceOptions opt;
    opt.beta = beta;
    auto call = [&] {
      lt::Tensor x = xs.detach().set_requires_grad(true);
      lt::Tensor w = ws.detach().set_requires_grad(true);
      const lt::kernels::LinearDivergence d =
          lt::kernels::linear_divergence(x, w, xt, wt, mask, opt);
      d.divergence.backward(upstream);
    };
    const int64_t extra = lt::bench::peak_extra_bytes(call);
    const double ms = lt::bench::median_ms(call, reps, 1);
    const double passes = beta == 0.0 || beta == 1.0 ? 1.0 : 2.0;
    const double tv = static_cast<double>(t) * static_cast<double>(v);
    const double flops = 2.0 * tv * (hs + ht) * (passes + 1.0) + 4.0 * tv * hs;
    const std::string key = "linear_divergence_" + name;
    figures[key + "_ms" + suffix] = ms;
    figures[key + "_tflops" + suffix] = flops / (ms * 1e-3) / 1e12;
    figures[key + "_peak_extra_gib" + suffix] = extra / kGiB;
    std::fprintf(stderr, "%s%s: %.2f ms (%.1f TFLOP/s), peak extra %.3f GiB\n", key.c_str(),
                 suffix.c_str(), ms, flops / (ms * 1e-3) / 1e12, extra / kGiB);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = lt::bench::reps_option(argc, argv, 3);
  nlohmann::json figures = nlohmann::json::object(), errors = nlohmann::json::object();
  try {
    if (!lt::cuda_available()) throw lt::Error(lt::ErrorKind::kInput, "no CUDA device");
    for (const auto& [t, suffix] : {std::pair<int64_t, std::string>{4096, "_4k"},
                                    std::pair<int64_t, std::string>{16384, "_16k"}}) {
      try {
        run(t, suffix, reps, figures);
      } catch (const std::exception& e) {
        lt::bench::record_failure(errors, "linear_divergence" + suffix, e);
      }
      lt::allocator(kGpu).empty_cache();
    }
  } catch (const std::exception& e) {
    errors["setup"] = e.what();
  }
  return lt::bench::print_report(figures, errors);
}
