// bench_train_step: one full training step (forward with the fused chunked loss, backward, AdamW)
// of Qwen2.5-0.5B and Qwen2.5-1.5B shapes on one GPU, and the same model and batch in PyTorch +
// transformers (bench/torch_baseline.py: sdpa attention, fp32 master weights with bf16 autocast,
// fused AdamW), measured in the same run. Prints one JSON object on stdout:
// {"figures": {...}, "errors": {...}}. For <m> in qwen25_05b (bench/configs/qwen2.5-0.5b.json)
// and qwen25_15b (bench/configs/qwen2.5-1.5b.json):
//   train_<m>_tokens_per_s            tokens per second over the timed steps
//   train_<m>_mfu                     (6 N tokens + attention FLOPs) / time / gemm_bf16_tflops,
//                                     N = parameters (tied head counted once), attention FLOPs =
//                                     3.5 x the causal forward matmuls (4 L^2 D Hq / 2 per
//                                     sequence and layer); recomputation is not counted
//   train_<m>_peak_gib                peak allocated device memory over the run (parameters,
//                                     master weights, optimizer state, activations, workspace)
//   train_<m>_gradient_checkpointing  1 when the step only fit with per-layer recomputation
//   train_<m>_torch_tokens_per_s, train_<m>_torch_peak_gib (torch.cuda.max_memory_allocated),
//   train_<m>_torch_gradient_checkpointing
//   train_<m>_speedup_vs_torch        ours tokens/s / torch tokens/s
//   train_<m>_memory_ratio_vs_torch   ours peak / torch peak (< 1: we use less)
//   gemm_bf16_tflops_train            the 8192^3 bf16 GEMM rate the MFU divides by (best of
//                                     cuBLASLt's heuristic algorithms, measured here)
// Setup: random weights (DecoderModel::init_random), bf16 parameters with f32 master copies in
// AdamW (lr 1e-5), a packed batch of 4 x 4096 tokens (cu_seqlens {0, 4096, ...}, random ids and
// labels), 2 warm-up steps and --steps timed steps (wall clock, synchronised). Gradient
// checkpointing is off unless the step runs out of memory without it; the torch side first tries
// the same setting and falls back the same way (its output says so). The torch run starts after
// this process has freed its device memory (empty_cache), and is skipped, with the reason under
// "errors", when python3 cannot import torch and transformers.
// Options: --steps N, --models a,b (ids above), --no-torch, --root DIR (repository root; found
// from the executable's path or LEANTUNE_ROOT otherwise), --profile: after the timed steps, N
// more steps under the per-op step profile (engine/profile.h: CUDA events around each op), whose
// table (time per op kind and share of the step, as trainer_bin --profile_steps prints it) goes
// to stderr; the timed figures above are taken without it.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_util.cuh"
#include "engine/allocator.h"
#include "engine/autograd.h"
#include "engine/check.h"
#include "engine/cuda_blas.cuh"
#include "engine/optim.h"
#include "engine/profile.h"
#include "engine/rng.h"
#include "engine/stream.h"
#include "engine/tensor.h"
#include "loaders/batch.h"
#include "loaders/model_config.h"
#include "models/decoder.h"

namespace lt = leantune;
namespace fs = std::filesystem;

namespace {

const lt::Device kGpu = lt::Device::cuda(0);
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr int64_t kSeqs = 4, kSeqLen = 4096;

cudaStream_t stream() { return static_cast<cudaStream_t>(lt::current_stream(kGpu).handle); }

// The repository root: --root, LEANTUNE_ROOT, or two levels above the executable's directory
// (build-*/bench/bench_train_step), or the working directory and its parent.
fs::path repo_root(const std::string& flag) {
  std::vector<fs::path> cands;
  if (!flag.empty()) cands.emplace_back(flag);
  if (const char* env = std::getenv("LEANTUNE_ROOT")) cands.emplace_back(env);
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) cands.push_back(exe.parent_path().parent_path().parent_path());
  cands.push_back(fs::current_path());
  cands.push_back(fs::current_path().parent_path());
  for (const fs::path& c : cands)
    if (fs::exists(c / "bench" / "configs")) return c;
  throw lt::Error(lt::ErrorKind::kInput,
                  "bench_train_step: cannot find bench/configs (pass --root or set LEANTUNE_ROOT)");
}

// Best-of-heuristics 8192^3 bf16 GEMM rate, TFLOP/s.
double gemm_peak_tflops() {
  const int64_t n = 8192;
  lt::Tensor a = lt::Tensor::empty({n, n}, lt::DType::kBF16, kGpu);
  lt::Tensor b = lt::Tensor::empty({n, n}, lt::DType::kBF16, kGpu);
  lt::Tensor c = lt::Tensor::empty({n, n}, lt::DType::kBF16, kGpu);
  lt::Generator g(7, lt::RngPurpose::kTest);
  lt::normal_(a, g, 0.0, 1.0);
  lt::normal_(b, g, 0.0, 1.0);
  lt::cu::LtGemm d;
  d.a = a.data_ptr();
  d.a_type = CUDA_R_16BF;
  d.lda = n;
  d.b = b.data_ptr();
  d.b_type = CUDA_R_16BF;
  d.ldb = n;
  d.d = c.data_ptr();
  d.d_type = CUDA_R_16BF;
  d.ldd = n;
  d.m = d.n = d.k = n;
  const int algos = lt::cu::lt_gemm_algo_count(d, kGpu, 8);
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  double best = 1e30;
  for (int rank = 0; rank < algos; ++rank) {
    try {
      for (int i = 0; i < 2; ++i) lt::cu::lt_gemm(d, kGpu, stream(), rank);
      std::vector<float> ms;
      for (int i = 0; i < 5; ++i) {
        CUDA_CHECK(cudaEventRecord(e0, stream()));
        lt::cu::lt_gemm(d, kGpu, stream(), rank);
        CUDA_CHECK(cudaEventRecord(e1, stream()));
        CUDA_CHECK(cudaEventSynchronize(e1));
        float t = 0;
        CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
        ms.push_back(t);
      }
      std::sort(ms.begin(), ms.end());
      best = std::min(best, static_cast<double>(ms[ms.size() / 2]));
    } catch (const lt::Error&) {
      cudaGetLastError();  // an offered algorithm may still refuse the problem
    }
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  LT_CHECK(best < 1e29, "bench_train_step: no GEMM algorithm ran");
  return 2.0 * n * n * n / (best * 1e-3) / 1e12;
}

lt::Batch make_batch(int64_t vocab, uint64_t seed) {
  const int64_t t = kSeqs * kSeqLen;
  std::vector<int64_t> ids(t), pos(t), labels(t);
  std::mt19937_64 rng(seed);
  for (int64_t i = 0; i < t; ++i) {
    ids[i] = static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab));
    labels[i] = static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab));
    pos[i] = i % kSeqLen;
  }
  std::vector<int32_t> cu;
  for (int64_t b = 0; b <= kSeqs; ++b) cu.push_back(static_cast<int32_t>(b * kSeqLen));
  lt::Batch batch;
  batch.input_ids = lt::Tensor::from_vector(ids, {t});
  batch.position_ids = lt::Tensor::from_vector(pos, {t});
  batch.labels = lt::Tensor::from_vector(labels, {t});
  batch.cu_seqlens = lt::Tensor::from_vector(cu, {kSeqs + 1});
  batch.max_seqlen = kSeqLen;
  batch.stats.real_tokens = t;
  batch.stats.sequences = kSeqs;
  return batch;
}

struct StepResult {
  double tokens_per_s = 0;
  double peak_gib = 0;
  double step_s = 0;
  double loss = 0;
  int64_t params = 0;
};

// Warm-up and timed steps; throws on any error (an out-of-memory one included).
// profile_as: the model's id, to take and print the per-op profile of `steps` more steps.
StepResult train(const lt::ModelConfig& cfg, bool checkpointing, int steps,
                 const char* profile_as) {
  lt::Allocator& alloc = lt::allocator(kGpu);
  alloc.empty_cache();
  alloc.reset_peak_stats();
  StepResult r;
  {
    lt::DecoderModel model(cfg, kGpu, lt::DType::kBF16);
    model.init_random(1234);
    model.set_requires_grad(true);
    r.params = model.num_parameters();
    std::vector<lt::AdamW::Param> params;
    for (const auto& [name, t] : model.named_parameters())
      params.push_back(
          {name, t,
           name.find("norm") == std::string::npos && name.find("bias") == std::string::npos});
    lt::AdamW opt(params, lt::AdamWConfig{1e-5, 0.9, 0.999, 1e-8, 0.0});
    const lt::Batch batch = make_batch(cfg.vocab_size, 99);
    lt::ForwardOptions fo;
    fo.need_loss = true;
    fo.fused_loss = true;
    fo.gradient_checkpointing = checkpointing;
    fo.loss_chunk_tokens = int64_t{1} << 30;  // the kernel's own memory-budget chunk
    auto step = [&] {
      lt::ForwardResult fr = model.forward(batch, fo);
      fr.loss.backward();
      opt.step(1e-5);
      for (auto& p : params) p.tensor.zero_grad();
      return fr.loss;
    };
    for (int i = 0; i < 2; ++i) step();
    lt::device_synchronize(kGpu);
    const auto t0 = std::chrono::steady_clock::now();
    lt::Tensor last;
    for (int i = 0; i < steps; ++i) last = step();
    lt::device_synchronize(kGpu);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps;
    r.step_s = s;
    r.tokens_per_s = static_cast<double>(kSeqs * kSeqLen) / s;
    r.loss = last.item();
    if (profile_as != nullptr) {
      lt::StepProfiler prof;
      for (int i = 0; i < steps; ++i) {
        prof.begin_step(kGpu);
        step();
        prof.end_step();
      }
      std::fprintf(stderr, "%s %s", profile_as, prof.profile().table().c_str());
    }
  }
  r.peak_gib = static_cast<double>(alloc.stats().allocated.peak) / kGiB;
  alloc.empty_cache();
  return r;
}

// FLOPs of one step: 6 N per token plus the causal attention matmuls (forward + backward).
double step_flops(const lt::ModelConfig& cfg, int64_t params) {
  const double tokens = static_cast<double>(kSeqs * kSeqLen);
  const double head_dim = static_cast<double>(
      cfg.head_dim > 0 ? cfg.head_dim : cfg.hidden_size / cfg.num_attention_heads);
  const double attn_fwd = kSeqs * 4.0 * static_cast<double>(kSeqLen) * kSeqLen * head_dim *
                          static_cast<double>(cfg.num_attention_heads) / 2.0;
  return 6.0 * static_cast<double>(params) * tokens +
         3.5 * attn_fwd * static_cast<double>(cfg.num_hidden_layers);
}

// Runs the torch baseline; returns its JSON object (with "error" when it could not run).
nlohmann::json torch_baseline(const fs::path& root, const fs::path& config, bool checkpointing,
                              int steps) {
  const std::string cmd = "timeout 300 python3 " + (root / "bench" / "torch_baseline.py").string() +
                          " --config " + config.string() + " --seqs " + std::to_string(kSeqs) +
                          " --seq-len " + std::to_string(kSeqLen) + " --steps " +
                          std::to_string(steps) + " --gradient-checkpointing " +
                          (checkpointing ? "on" : "auto") + " 2>&1";
  std::fprintf(stderr, "running: %s\n", cmd.c_str());
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {{"error", "could not start python3"}};
  std::string out, last_json;
  char buf[4096];
  while (fgets(buf, sizeof(buf), p)) {
    out += buf;
    std::string line(buf);
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    if (!line.empty() && line.front() == '{') last_json = line;
    std::fputs(buf, stderr);
  }
  const int rc = pclose(p);
  if (last_json.empty())
    return {{"error", "torch_baseline.py exited " + std::to_string(rc) + " without a result: " +
                          out.substr(out.size() > 600 ? out.size() - 600 : 0)}};
  try {
    return nlohmann::json::parse(last_json);
  } catch (const std::exception& e) {
    return {{"error", std::string("unreadable torch_baseline.py output: ") + e.what()}};
  }
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 5;
  bool run_torch = true, profile = false;
  std::string root_flag, models_flag = "qwen25_05b,qwen25_15b";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc)
      steps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--no-torch")
      run_torch = false;
    else if (a == "--profile")
      profile = true;
    else if (a == "--root" && i + 1 < argc)
      root_flag = argv[++i];
    else if (a == "--models" && i + 1 < argc)
      models_flag = argv[++i];
  }
  nlohmann::json figures = nlohmann::json::object(), errors = nlohmann::json::object();
  try {
    if (!lt::cuda_available()) throw lt::Error(lt::ErrorKind::kInput, "no CUDA device");
    const fs::path root = repo_root(root_flag);
    const double peak = gemm_peak_tflops();
    figures["gemm_bf16_tflops_train"] = peak;
    lt::allocator(kGpu).empty_cache();
    struct Model {
      const char* id;
      const char* config;
    };
    for (const Model& m :
         {Model{"qwen25_05b", "qwen2.5-0.5b.json"}, Model{"qwen25_15b", "qwen2.5-1.5b.json"}}) {
      if (models_flag.find(m.id) == std::string::npos) continue;
      const std::string key = std::string("train_") + m.id;
      const fs::path config = root / "bench" / "configs" / m.config;
      bool checkpointing = false;
      try {
        const lt::ModelConfig cfg = lt::ModelConfig::load(config.string());
        StepResult r;
        try {
          r = train(cfg, false, steps, profile ? m.id : nullptr);
        } catch (const lt::Error& e) {
          if (e.kind() != lt::ErrorKind::kOutOfMemory) throw;
          std::fprintf(stderr, "%s: out of memory without gradient checkpointing; retrying\n",
                       m.id);
          cudaGetLastError();
          lt::allocator(kGpu).empty_cache();
          checkpointing = true;
          r = train(cfg, true, steps, profile ? m.id : nullptr);
        }
        const double mfu = step_flops(cfg, r.params) / r.step_s / (peak * 1e12);
        figures[key + "_tokens_per_s"] = r.tokens_per_s;
        figures[key + "_mfu"] = mfu;
        figures[key + "_peak_gib"] = r.peak_gib;
        figures[key + "_gradient_checkpointing"] = checkpointing ? 1 : 0;
        std::fprintf(stderr,
                     "%s: %.0f tokens/s (%.3f s/step), MFU %.3f, peak %.2f GiB, loss %.4f%s\n",
                     m.id, r.tokens_per_s, r.step_s, mfu, r.peak_gib, r.loss,
                     checkpointing ? " (gradient checkpointing)" : "");
        if (!run_torch) continue;
        lt::allocator(kGpu).empty_cache();
        const nlohmann::json t = torch_baseline(root, config, checkpointing, steps);
        if (t.contains("error")) {
          errors[key + "_torch"] = t["error"];
          continue;
        }
        const double tt = t.value("tokens_per_s", 0.0), tp = t.value("peak_gib", 0.0);
        figures[key + "_torch_tokens_per_s"] = tt;
        figures[key + "_torch_peak_gib"] = tp;
        figures[key + "_torch_gradient_checkpointing"] =
            t.value("gradient_checkpointing", false) ? 1 : 0;
        if (tt > 0) figures[key + "_speedup_vs_torch"] = r.tokens_per_s / tt;
        if (tp > 0) figures[key + "_memory_ratio_vs_torch"] = r.peak_gib / tp;
      } catch (const std::exception& e) {
        lt::bench::record_failure(errors, key, e);
      }
      lt::allocator(kGpu).empty_cache();
    }
  } catch (const std::exception& e) {
    errors["setup"] = e.what();
  }
  return lt::bench::print_report(figures, errors);
}
