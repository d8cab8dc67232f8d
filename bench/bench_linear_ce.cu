// bench_linear_ce: the fused chunked linear cross-entropy (kernels/linear_cross_entropy.cu) against
// the unfused path (our linear + cross_entropy ops with the full [T, V] logits), loss and both
// gradients, at Qwen2.5 shapes: V = 151936, H = 1536, bf16 hidden and LM head, f32 weight
// gradient (as the autograd node allocates it), every target valid. Prints one JSON object on
// stdout: {"figures": {...}, "errors": {...}}.
//   linear_ce_peak_extra_gib_<16k|64k>           fused: peak device memory above the caller's
//                                                tensors (hidden, W, targets, dhidden, dW)
//   linear_ce_fwd_bwd_ms_<16k|64k>               fused: one call, loss + dhidden + dW
//   linear_ce_fwd_bwd_tflops_<16k|64k>           6 T V H / time
//   linear_ce_unfused_peak_extra_gib_<16k|64k>   unfused: logits [T,V] bf16 (dlogits in place),
//                                                per-row loss and lse
//   linear_ce_unfused_fwd_bwd_ms_<16k|64k>       linear fwd, cross_entropy fwd + bwd, linear bwd
//   linear_ce_speed_vs_unfused_<16k|64k>         unfused ms / fused ms (>= 1: fused not slower)
// Targets: fused peak extra <= 1 GiB at 64k tokens, speed no worse than unfused. The unfused case
// is skipped (and the reason recorded under "errors") when the device lacks the memory for it.
// The fused call runs with chunk_tokens = 2^30, i.e. the kernel's own memory-budget chunk.
// Timing: CUDA events around whole calls (each includes its one host synchronisation), 1 warm-up,
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
#include "engine/check.h"
#include "engine/rng.h"
#include "engine/stream.h"
#include "engine/tensor.h"
#include "kernels/cross_entropy.h"
#include "kernels/linear.h"
#include "kernels/linear_cross_entropy.h"

namespace lt = leantune;

namespace {

const lt::Device kGpu = lt::Device::cuda(0);
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

void run(int64_t t, const std::string& suffix, int reps, nlohmann::json& figures,
         nlohmann::json& errors) {
  const int64_t h = 1536, v = 151936;
  const lt::Tensor x = lt::bench::bf16_randn({t, h}, 11, 1.0),
                   w = lt::bench::bf16_randn({v, h}, 12, 0.02);
  std::vector<int64_t> y(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) y[i] = (i * 7919 + 17) % v;
  const lt::Tensor yh = lt::Tensor::from_vector(y, {t});
  const lt::Tensor yd = yh.to(kGpu);
  lt::Tensor dx = lt::Tensor::empty({t, h}, lt::DType::kBF16, kGpu);
  lt::Tensor dw = lt::Tensor::zeros({v, h}, lt::DType::kF32, kGpu);
  const double scale = 1.0 / static_cast<double>(t);
  const double flops = 6.0 * static_cast<double>(t) * v * h;

  lt::kernels::LinearCrossEntropyOptions opt;
  opt.chunk_tokens = int64_t{1} << 30;
  auto fused = [&] {
    lt::kernels::linear_cross_entropy_fwd_bwd_cuda(x, w, yd, scale, dx, dw, opt);
  };
  const int64_t fused_extra = lt::bench::peak_extra_bytes(fused);
  const double fused_ms = lt::bench::median_ms(fused, reps, 1);
  figures["linear_ce_peak_extra_gib" + suffix] = fused_extra / kGiB;
  figures["linear_ce_fwd_bwd_ms" + suffix] = fused_ms;
  figures["linear_ce_fwd_bwd_tflops" + suffix] = flops / (fused_ms * 1e-3) / 1e12;
  std::fprintf(stderr, "linear_ce%s fused:   %.2f ms (%.1f TFLOP/s), peak extra %.3f GiB\n",
               suffix.c_str(), fused_ms, flops / (fused_ms * 1e-3) / 1e12, fused_extra / kGiB);

  // Unfused: logits [T, V] bf16 with the gradient written in place, then the linear backward.
  const double logits_bytes = static_cast<double>(t) * v * 2.0;
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  lt::allocator(kGpu).empty_cache();
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const double need = logits_bytes + 16.0 * t + (256 << 20);
  if (need > 0.95 * static_cast<double>(free_b)) {
    errors["linear_ce_unfused" + suffix] = "skipped: needs about " + std::to_string(need / kGiB) +
                                           " GiB of free device memory, " +
                                           std::to_string(free_b / kGiB) + " GiB free";
    return;
  }
  lt::Tensor logits, loss_rows, lse;
  auto unfused = [&] {
    logits = lt::Tensor::empty({t, v}, lt::DType::kBF16, kGpu, lt::MemTag::kActivation);
    loss_rows = lt::Tensor::empty({t}, lt::DType::kF32, kGpu);
    lse = lt::Tensor::empty({t}, lt::DType::kF32, kGpu);
    lt::kernels::linear_fwd_cuda(x, w, lt::Tensor(), logits);
    lt::kernels::cross_entropy_fwd_cuda(logits, yh, loss_rows, lse);
    lt::kernels::cross_entropy_bwd_cuda(logits, yh, lse, scale, logits);
    lt::kernels::linear_bwd_cuda(logits, x, w, dx, dw, lt::Tensor());
    logits = lt::Tensor();
    loss_rows = lt::Tensor();
    lse = lt::Tensor();
  };
  const int64_t unfused_extra = lt::bench::peak_extra_bytes(unfused);
  const double unfused_ms = lt::bench::median_ms(unfused, reps, 1);
  figures["linear_ce_unfused_peak_extra_gib" + suffix] = unfused_extra / kGiB;
  figures["linear_ce_unfused_fwd_bwd_ms" + suffix] = unfused_ms;
  figures["linear_ce_speed_vs_unfused" + suffix] = unfused_ms / fused_ms;
  std::fprintf(stderr, "linear_ce%s unfused: %.2f ms (%.1f TFLOP/s), peak extra %.3f GiB\n",
               suffix.c_str(), unfused_ms, flops / (unfused_ms * 1e-3) / 1e12,
               unfused_extra / kGiB);
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = lt::bench::reps_option(argc, argv, 3);
  nlohmann::json figures = nlohmann::json::object(), errors = nlohmann::json::object();
  try {
    if (!lt::cuda_available()) throw lt::Error(lt::ErrorKind::kInput, "no CUDA device");
    for (const auto& [t, suffix] : {std::pair<int64_t, std::string>{16384, "_16k"},
                                    std::pair<int64_t, std::string>{65536, "_64k"}}) {
      try {
        run(t, suffix, reps, figures, errors);
      } catch (const std::exception& e) {
        lt::bench::record_failure(errors, "linear_ce" + suffix, e);
      }
      lt::allocator(kGpu).empty_cache();
    }
  } catch (const std::exception& e) {
    errors["setup"] = e.what();
  }
  nlohmann::json out;
  out["figures"] = figures;
  out["errors"] = errors;
  std::printf("%s\n", out.dump(1).c_str());
  // A skipped unfused case is a recorded fact, not a failure.
  bool failed = false;
  for (auto it = errors.begin(); it != errors.end(); ++it)
    if (it.value().get<std::string>().rfind("skipped", 0) != 0) failed = true;
  return failed ? 1 : 0;
}
