// bench_quant: quantized-weight kernels (kernels/quant.h) on the GPU at Llama-3-8B projection
// shapes. Prints one JSON object on stdout: {"figures": {name: value, ...}, "errors": {...}}.
//   nf4_dequant / nf4dq_dequant / int8_dequant: one weight [14336, 4096] dequantized to bf16;
//     figures _ms and _tbps (bytes = packed + scales read, bf16 written).
//   <fmt>_linear_fwd_T<T>: nf4_linear_fwd / int8_linear_fwd (dequantize into the scratch, then
//     cuBLASLt) against dense_linear_fwd_T<T> (linear_fwd over a bf16 weight) for T tokens;
//     figures _ms and <fmt>_linear_fwd_T<T>_overhead (quantized / dense time).
// Timing: CUDA events, 3 warm-up calls, median of --reps N (default 20) calls, L2 flushed before
// each call.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/check.h"
#include "engine/rng.h"
#include "engine/stream.h"
#include "engine/tensor.h"
#include "kernels/linear.h"
#include "kernels/quant.h"

namespace lt = leantune;

namespace {

const lt::Device kGpu = lt::Device::cuda(0);

cudaStream_t stream() { return static_cast<cudaStream_t>(lt::current_stream(kGpu).handle); }

double median_ms(int reps, const lt::Tensor& flush, const std::function<void()>& fn) {
  cudaEvent_t start, end;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&end));
  for (int i = 0; i < 3; ++i) fn();
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    CUDA_CHECK(cudaMemsetAsync(flush.data_ptr(), i & 0xff, flush.nbytes(), stream()));
    CUDA_CHECK(cudaEventRecord(start, stream()));
    fn();
    CUDA_CHECK(cudaEventRecord(end, stream()));
    CUDA_CHECK(cudaEventSynchronize(end));
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, start, end));
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(end);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
  nlohmann::json figures = nlohmann::json::object(), errors = nlohmann::json::object();
  try {
    if (!lt::cuda_available()) throw lt::Error(lt::ErrorKind::kInput, "no CUDA device");
    int l2 = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
    const lt::Tensor flush = lt::Tensor::empty({2 * static_cast<int64_t>(std::max(l2, 1 << 20))},
                                               lt::DType::kU8, kGpu, lt::MemTag::kWorkspace);
    const int64_t out = 14336, in = 4096, n = out * in;
    lt::Tensor w = lt::Tensor::empty({out, in}, lt::DType::kBF16);
    lt::Generator g(1, lt::RngPurpose::kTest);
    lt::normal_(w, g, 0.0, 0.02);
    const lt::kernels::Nf4Weight nf4 = lt::kernels::nf4_quantize(w, false).to(kGpu);
    const lt::kernels::Nf4Weight nf4dq = lt::kernels::nf4_quantize(w, true).to(kGpu);
    const lt::kernels::Int8Weight i8 = lt::kernels::int8_quantize(w).to(kGpu);
    const lt::Tensor wg = w.to(kGpu);
    lt::Tensor dense = lt::Tensor::empty({out, in}, lt::DType::kBF16, kGpu);
    auto report = [&](const std::string& name, double ms, double bytes) {
      figures[name + "_ms"] = ms;
      figures[name + "_tbps"] = bytes / (ms * 1e-3) / 1e12;
      std::fprintf(stderr, "%-24s %8.3f ms  %6.3f TB/s\n", name.c_str(), ms,
                   bytes / (ms * 1e-3) / 1e12);
    };
    report("nf4_dequant", median_ms(reps, flush, [&] { lt::kernels::nf4_dequantize(nf4, dense); }),
           double(nf4.storage_bytes() + 2 * n));
    report("nf4dq_dequant",
           median_ms(reps, flush, [&] { lt::kernels::nf4_dequantize(nf4dq, dense); }),
           double(nf4dq.storage_bytes() + 2 * n));
    report("int8_dequant", median_ms(reps, flush, [&] { lt::kernels::int8_dequantize(i8, dense); }),
           double(i8.storage_bytes() + 2 * n));
    for (int64_t t : {1, 16, 4096}) {
      lt::Generator gx(2, lt::RngPurpose::kTest);
      lt::Tensor x = lt::Tensor::empty({t, in}, lt::DType::kBF16, kGpu);
      lt::normal_(x, gx, 0.0, 1.0);
      lt::Tensor y = lt::Tensor::empty({t, out}, lt::DType::kBF16, kGpu);
      const std::string sfx = "_T" + std::to_string(t);
      const double base =
          median_ms(reps, flush, [&] { lt::kernels::linear_fwd(x, wg, lt::Tensor(), y); });
      figures["dense_linear_fwd" + sfx + "_ms"] = base;
      auto quant = [&](const std::string& fmt, const std::function<void()>& fn) {
        const double ms = median_ms(reps, flush, fn);
        figures[fmt + "_linear_fwd" + sfx + "_ms"] = ms;
        figures[fmt + "_linear_fwd" + sfx + "_overhead"] = ms / base;
        std::fprintf(stderr, "%-24s %8.3f ms  x%.2f of dense %.3f ms\n",
                     (fmt + "_linear_fwd" + sfx).c_str(), ms, ms / base, base);
      };
      quant("nf4dq", [&] { lt::kernels::nf4_linear_fwd(x, nf4dq, lt::Tensor(), y); });
      quant("int8", [&] { lt::kernels::int8_linear_fwd(x, i8, lt::Tensor(), y); });
    }
  } catch (const std::exception& e) {
    errors["bench_quant"] = e.what();
    std::fprintf(stderr, "bench_quant failed: %s\n", e.what());
  }
  nlohmann::json j;
  j["figures"] = figures;
  j["errors"] = errors;
  std::printf("%s\n", j.dump(1).c_str());
  return errors.empty() ? 0 : 1;
}
