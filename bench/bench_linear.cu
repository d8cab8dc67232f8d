// bench_linear: GEMM throughput of the CUDA linear (kernels/linear.cu, cuBLASLt with the
// autotuned algorithm of engine/gemm_tuning.h) against the fastest of cuBLASLt's heuristic
// algorithms for the same problem, at Qwen2.5-1.5B shapes with 16384 tokens, plus the bf16
// compute ceiling. Prints one JSON object on stdout: {"figures": {...}, "errors": {...}}.
//   gemm_bf16_tflops          8192^3 bf16 GEMM (f32 accumulate), best heuristic algorithm
//   linear_<proj>_<pass>_tflops        our call (forward y = x W^T, dx = dy W, dW = dy^T x)
//   linear_<proj>_<pass>_vs_best       our time / the best of up to 16 heuristic algorithms'
//                                      (target >= 0.97)
//   linear_<proj>_<pass>_rank0_vs_best the heuristic's first choice's, as without autotune
//   linear_<proj>_<pass>_tuned_rank    the rank the autotune chose
// The autotune keeps its choices in memory here (a fresh choice each run) unless
// LEANTUNE_GEMM_AUTOTUNE is set.
// Projections: q (1536 -> 1536, also o_proj), kv (1536 -> 256), gate_up (1536 -> 8960),
// down (8960 -> 1536). Timing: CUDA events, 3 warm-ups, median of N calls (GEMMs are compute
// bound; no L2 flush). Inputs are random (never zeros: zeros run faster on tensor cores).
// Options: --reps N, --tokens T.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/bench_util.cuh"
#include "engine/check.h"
#include "engine/cuda_blas.cuh"
#include "engine/gemm_tuning.h"
#include "engine/rng.h"
#include "engine/stream.h"
#include "engine/tensor.h"
#include "kernels/linear.h"

namespace lt = leantune;

namespace {

const lt::Device kGpu = lt::Device::cuda(0);

cudaStream_t stream() { return static_cast<cudaStream_t>(lt::current_stream(kGpu).handle); }

double median_ms(const std::function<void()>& fn, int reps) {
  return lt::bench::median_ms(fn, reps, 3);
}

lt::Tensor randn(const lt::Shape& s, uint64_t seed, double std = 1.0) {
  lt::Tensor t = lt::Tensor::empty(s, lt::DType::kBF16, kGpu);
  lt::Generator g(seed, lt::RngPurpose::kTest);
  lt::normal_(t, g, 0.0, std);
  return t;
}

// The fastest heuristic algorithm for g, in ms.
double best_ms(const lt::cu::LtGemm& g, int reps, int* algos) {
  *algos = lt::cu::lt_gemm_algo_count(g, kGpu, 16);
  double best = 1e30;
  for (int rank = 0; rank < *algos; ++rank) {
    try {
      best = std::min(best, median_ms([&] { lt::cu::lt_gemm(g, kGpu, stream(), rank); }, reps));
    } catch (const lt::Error&) {
      cudaGetLastError();  // an algorithm the heuristic offered may still refuse this problem
    }
  }
  return best;
}

// Column-major descriptor of a row-major bf16 product, as kernels/linear.cu builds it.
lt::cu::LtGemm desc(const lt::Tensor& a, int64_t lda, bool ta, const lt::Tensor& b, int64_t ldb,
                    bool tb, lt::Tensor& d, int64_t m, int64_t n, int64_t k) {
  lt::cu::LtGemm g;
  g.a = a.data_ptr();
  g.a_type = CUDA_R_16BF;
  g.lda = lda;
  g.trans_a = ta;
  g.b = b.data_ptr();
  g.b_type = CUDA_R_16BF;
  g.ldb = ldb;
  g.trans_b = tb;
  g.d = d.data_ptr();
  g.d_type = CUDA_R_16BF;
  g.ldd = m;
  g.m = m;
  g.n = n;
  g.k = k;
  return g;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  int64_t tokens = 16384;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc)
      reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--tokens" && i + 1 < argc)
      tokens = std::max(1L, std::atol(argv[++i]));
  }
  nlohmann::json figures = nlohmann::json::object(), errors = nlohmann::json::object();
  try {
    if (!std::getenv("LEANTUNE_GEMM_AUTOTUNE"))
      lt::gemm_tuning::set_mode(lt::gemm_tuning::Mode::kMemory);
    if (!lt::cuda_available()) throw lt::Error(lt::ErrorKind::kInput, "no CUDA device");
    {
      const int64_t n = 8192;
      lt::Tensor a = randn({n, n}, 1), b = randn({n, n}, 2),
                 c = lt::Tensor::empty({n, n}, lt::DType::kBF16, kGpu);
      int algos = 0;
      const double ms = best_ms(desc(a, n, false, b, n, false, c, n, n, n), reps, &algos);
      figures["gemm_bf16_tflops"] = 2.0 * n * n * n / (ms * 1e-3) / 1e12;
      std::fprintf(stderr, "gemm 8192^3 bf16: %.3f ms, %.1f TFLOP/s (%d algorithms)\n", ms,
                   figures["gemm_bf16_tflops"].get<double>(), algos);
    }
    lt::allocator(kGpu).empty_cache();
    struct Proj {
      const char* name;
      int64_t in, out;
    };
    for (const Proj& p : {Proj{"q", 1536, 1536}, Proj{"kv", 1536, 256}, Proj{"gate_up", 1536, 8960},
                          Proj{"down", 8960, 1536}}) {
      try {
        const int64_t t = tokens;
        lt::Tensor x = randn({t, p.in}, 3), w = randn({p.out, p.in}, 4, 0.02),
                   dy = randn({t, p.out}, 5);
        lt::Tensor y = lt::Tensor::empty({t, p.out}, lt::DType::kBF16, kGpu);
        lt::Tensor dx = lt::Tensor::empty({t, p.in}, lt::DType::kBF16, kGpu);
        lt::Tensor dw = lt::Tensor::empty({p.out, p.in}, lt::DType::kBF16, kGpu);
        const double flops = 2.0 * t * p.in * p.out;
        struct Pass {
          const char* name;
          std::function<void()> ours;
          lt::cu::LtGemm g;
        };
        std::vector<Pass> passes = {
            {"fwd", [&] { lt::kernels::linear_fwd_cuda(x, w, lt::Tensor(), y); },
             desc(w, p.in, true, x, p.in, false, y, p.out, t, p.in)},
            {"dx",
             [&] {
               lt::kernels::linear_bwd_cuda(dy, lt::Tensor(), w, dx, lt::Tensor(), lt::Tensor());
             },
             desc(w, p.in, false, dy, p.out, false, dx, p.in, t, p.out)},
            {"dw",
             [&] {
               lt::kernels::linear_bwd_cuda(dy, x, lt::Tensor(), lt::Tensor(), dw, lt::Tensor());
             },
             desc(x, p.in, false, dy, p.out, true, dw, p.in, p.out, t)},
        };
        for (Pass& pass : passes) {
          const std::string key = std::string("linear_") + p.name + "_" + pass.name;
          const double ours = median_ms(pass.ours, reps);  // tunes in its warm-up calls
          const int tuned = lt::cu::lt_gemm_tuned_rank(pass.g, kGpu, stream());
          const double rank0 = median_ms([&] { lt::cu::lt_gemm(pass.g, kGpu, stream(), 0); }, reps);
          int algos = 0;
          const double best = std::min({best_ms(pass.g, reps, &algos), ours, rank0});
          figures[key + "_tflops"] = flops / (ours * 1e-3) / 1e12;
          figures[key + "_vs_best"] = best / ours;
          figures[key + "_rank0_vs_best"] = best / rank0;
          figures[key + "_tuned_rank"] = tuned;
          std::fprintf(stderr,
                       "%-24s ours (rank %d) %.3f ms (%.1f TFLOP/s), rank 0 %.3f ms, best of %d "
                       "%.3f ms: %.3f (rank 0: %.3f)\n",
                       key.c_str(), tuned, ours, flops / (ours * 1e-3) / 1e12, rank0, algos, best,
                       best / ours, best / rank0);
        }
      } catch (const std::exception& e) {
        lt::bench::record_failure(errors, std::string("linear_") + p.name, e);
      }
      lt::allocator(kGpu).empty_cache();
    }
  } catch (const std::exception& e) {
    errors["setup"] = e.what();
  }
  return lt::bench::print_report(figures, errors);
}
