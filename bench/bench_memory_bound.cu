// bench_memory_bound: achieved HBM bandwidth of the memory-bound CUDA kernels at Qwen2.5-1.5B
// training shapes, as fractions of a measured ceiling. Prints one JSON object on stdout:
//   {"figures": {name: value, ...}, "errors": {section: message, ...}}
// Ceiling: `hbm_copy_tbps`, a 4 GiB device-to-device cudaMemcpyAsync, counting bytes read plus
// bytes written. Each kernel: CUDA events around one call, 3 warm-up calls, median of 20 timed
// calls, L2 flushed (a 2x L2-size memset) before every call; bytes = the minimum traffic (every
// input read once, every output written once). Figures per kernel: <op>_<pass>_ms, _tbps and
// _hbm_fraction. Shapes (16384 tokens, hidden 1536, intermediate 8960, 12 query / 2 KV heads of
// 128, vocab 151936):
//   rms_norm  x [16384, 1536] bf16; add_rms_norm the same with the residual add fused in front
//             (reads a and b, writes the sum and y) and its backward (dx plus the sum's gradient)
//   rope      q [16384, 12, 128] and k [16384, 2, 128] bf16 (one fwd = both rotations)
//   swiglu    gate/up [16384, 8960] bf16
//   cross_entropy  logits [16384, 151936] bf16 (5 GB; the backward writes 5 GB more). With
//             --ce-tokens N a smaller token count can be used; the figure names stay the same and
//             `cross_entropy_tokens` records the count.
//   adamw     the Qwen2.5-1.5B parameter set (tied embeddings, 1.54e9 parameters): bf16
//             parameters, f32 master, f32 m and v, bf16 gradients: 28 bytes per parameter per step
// Inputs are random (never zeros). Options: --reps N, --only <section>.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/check.h"
#include "engine/ops.h"
#include "engine/optim.h"
#include "engine/rng.h"
#include "engine/stream.h"
#include "engine/tensor.h"
#include "kernels/cross_entropy.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"

namespace lt = leantune;

namespace {

const lt::Device kGpu = lt::Device::cuda(0);

struct Options {
  int reps = 20;
  int64_t ce_tokens = 16384;
  std::string only;
};

cudaStream_t stream() { return static_cast<cudaStream_t>(lt::current_stream(kGpu).handle); }

// Times fn with CUDA events on the current stream: warm-up, then the median of `reps` calls,
// each after an L2 flush.
class Timer {
 public:
  explicit Timer(int reps) : reps_(reps) {
    int l2 = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
    flush_ = lt::Tensor::empty({2 * static_cast<int64_t>(std::max(l2, 1 << 20))}, lt::DType::kU8,
                               kGpu, lt::MemTag::kWorkspace);
    CUDA_CHECK(cudaEventCreate(&start_));
    CUDA_CHECK(cudaEventCreate(&end_));
  }
  ~Timer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(end_);
  }
  double median_ms(const std::function<void()>& fn, bool flush_l2 = true) {
    for (int i = 0; i < 3; ++i) fn();
    CUDA_CHECK(cudaStreamSynchronize(stream()));
    std::vector<float> ms;
    for (int i = 0; i < reps_; ++i) {
      if (flush_l2)
        CUDA_CHECK(cudaMemsetAsync(flush_.data_ptr(), i & 0xff, flush_.nbytes(), stream()));
      CUDA_CHECK(cudaEventRecord(start_, stream()));
      fn();
      CUDA_CHECK(cudaEventRecord(end_, stream()));
      CUDA_CHECK(cudaEventSynchronize(end_));
      float t = 0;
      CUDA_CHECK(cudaEventElapsedTime(&t, start_, end_));
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }

 private:
  int reps_;
  lt::Tensor flush_;
  cudaEvent_t start_ = nullptr, end_ = nullptr;
};

lt::Tensor randn(const lt::Shape& s, lt::DType dt, uint64_t seed, double std = 1.0) {
  lt::Tensor t = lt::Tensor::empty(s, dt, kGpu);
  lt::Generator g(seed, lt::RngPurpose::kTest);
  lt::normal_(t, g, 0.0, std);
  return t;
}

struct Report {
  nlohmann::json figures = nlohmann::json::object();
  nlohmann::json errors = nlohmann::json::object();
  double ceiling_tbps = 0;

  void kernel(const std::string& name, double ms, double bytes) {
    const double tbps = bytes / (ms * 1e-3) / 1e12;
    figures[name + "_ms"] = ms;
    figures[name + "_tbps"] = tbps;
    if (ceiling_tbps > 0) figures[name + "_hbm_fraction"] = tbps / ceiling_tbps;
    std::fprintf(stderr, "%-22s %9.3f ms  %6.3f TB/s  %5.1f%% of copy\n", name.c_str(), ms, tbps,
                 ceiling_tbps > 0 ? 100.0 * tbps / ceiling_tbps : 0.0);
  }
};

// A section that fails records its error and lets the others run.
void section(Report& r, const Options& o, const std::string& name,
             const std::function<void()>& fn) {
  if (!o.only.empty() && o.only != name) return;
  try {
    fn();
  } catch (const std::exception& e) {
    r.errors[name] = e.what();
    std::fprintf(stderr, "%s failed: %s\n", name.c_str(), e.what());
    cudaGetLastError();
  }
  lt::allocator(kGpu).empty_cache();
}

constexpr int64_t kTokens = 16384, kHidden = 1536, kInter = 8960, kHeads = 12, kKvHeads = 2,
                  kHeadDim = 128, kVocab = 151936, kLayers = 28;

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc)
      o.reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--ce-tokens" && i + 1 < argc)
      o.ce_tokens = std::max(1L, std::atol(argv[++i]));
    else if (a == "--only" && i + 1 < argc)
      o.only = argv[++i];
  }
  Report r;
  try {
    if (!lt::cuda_available()) throw lt::Error(lt::ErrorKind::kInput, "no CUDA device");
    Timer timer(o.reps);

    // Ceiling: device-to-device copy.
    {
      const int64_t bytes = int64_t{4} << 30;
      lt::Tensor a = randn({bytes / 2}, lt::DType::kBF16, 1),
                 b = lt::Tensor::empty({bytes / 2}, lt::DType::kBF16, kGpu);
      const double ms = timer.median_ms([&] {
        CUDA_CHECK(
            cudaMemcpyAsync(b.data_ptr(), a.data_ptr(), bytes, cudaMemcpyDeviceToDevice, stream()));
      });
      r.ceiling_tbps = 2.0 * bytes / (ms * 1e-3) / 1e12;
      r.figures["hbm_copy_tbps"] = r.ceiling_tbps;
      std::fprintf(stderr, "%-22s %9.3f ms  %6.3f TB/s\n", "hbm_copy", ms, r.ceiling_tbps);
    }
    lt::allocator(kGpu).empty_cache();

    section(r, o, "rms_norm", [&] {
      const lt::DType dt = lt::DType::kBF16;
      lt::Tensor x = randn({kTokens, kHidden}, dt, 2), w = randn({kHidden}, dt, 3);
      lt::Tensor y = lt::Tensor::empty({kTokens, kHidden}, dt, kGpu);
      lt::Tensor rstd = lt::Tensor::empty({kTokens}, lt::DType::kF32, kGpu);
      lt::Tensor dy = randn({kTokens, kHidden}, dt, 4);
      lt::Tensor dx = lt::Tensor::empty({kTokens, kHidden}, dt, kGpu);
      lt::Tensor dw = lt::Tensor::empty({kHidden}, dt, kGpu);
      const double act = static_cast<double>(kTokens * kHidden * 2);
      r.kernel("rms_norm_fwd",
               timer.median_ms([&] { lt::kernels::rms_norm_fwd_cuda(x, w, 1e-6, false, y, rstd); }),
               2 * act + kTokens * 4.0 + kHidden * 2.0);
      r.kernel("rms_norm_bwd", timer.median_ms([&] {
        lt::kernels::rms_norm_bwd_cuda(dy, x, w, rstd, false, dx, dw, lt::Tensor());
      }),
               3 * act + kTokens * 4.0 + 2 * kHidden * 2.0);
      // The residual add fused in front (the decoder's h + attn_out, then the norm), and the
      // backward that adds the sum's own gradient into dx.
      lt::Tensor b = randn({kTokens, kHidden}, dt, 5);
      lt::Tensor sum = lt::Tensor::empty({kTokens, kHidden}, dt, kGpu);
      r.kernel("add_rms_norm_fwd", timer.median_ms([&] {
        lt::kernels::add_rms_norm_fwd_cuda(x, b, w, 1e-6, false, sum, y, rstd);
      }),
               4 * act + kTokens * 4.0 + kHidden * 2.0);
      r.kernel("add_rms_norm_bwd", timer.median_ms([&] {
        lt::kernels::rms_norm_bwd_cuda(dy, x, w, rstd, false, dx, dw, b);
      }),
               4 * act + kTokens * 4.0 + 2 * kHidden * 2.0);
    });

    section(r, o, "rope", [&] {
      const lt::DType dt = lt::DType::kBF16;
      lt::Tensor q = randn({kTokens, kHeads, kHeadDim}, dt, 5);
      lt::Tensor k = randn({kTokens, kKvHeads, kHeadDim}, dt, 6);
      std::vector<int64_t> pos(kTokens);
      for (int64_t i = 0; i < kTokens; ++i) pos[i] = i % 4096;  // packed 4k sequences
      lt::Tensor p = lt::Tensor::from_vector(pos, {kTokens}, kGpu);
      lt::kernels::RopeConfig cfg;
      cfg.head_dim = kHeadDim;
      cfg.theta = 1000000.0;
      lt::Tensor inv = lt::Tensor::from_doubles(lt::kernels::rope_inv_freq(cfg), {kHeadDim / 2},
                                                lt::DType::kF32, kGpu);
      lt::Tensor qo = lt::Tensor::empty(q.shape(), dt, kGpu),
                 ko = lt::Tensor::empty(k.shape(), dt, kGpu);
      const double bytes = 2.0 * (q.nbytes() + k.nbytes()) + 2.0 * p.nbytes() + 2 * inv.nbytes();
      for (bool inverse : {false, true}) {
        r.kernel(inverse ? "rope_bwd" : "rope_fwd", timer.median_ms([&] {
          lt::kernels::rope_apply_cuda(q, p, inv, inverse, 1.0, qo);
          lt::kernels::rope_apply_cuda(k, p, inv, inverse, 1.0, ko);
        }),
                 bytes);
      }
    });

    section(r, o, "swiglu", [&] {
      const lt::DType dt = lt::DType::kBF16;
      lt::Tensor g = randn({kTokens, kInter}, dt, 7, 2.0), u = randn({kTokens, kInter}, dt, 8);
      lt::Tensor y = lt::Tensor::empty({kTokens, kInter}, dt, kGpu);
      const double act = static_cast<double>(g.nbytes());
      r.kernel("swiglu_fwd", timer.median_ms([&] { lt::kernels::swiglu_fwd_cuda(g, u, y); }),
               3 * act);
      lt::Tensor dy = randn({kTokens, kInter}, dt, 9);
      lt::Tensor dg = lt::Tensor::empty({kTokens, kInter}, dt, kGpu),
                 du = lt::Tensor::empty({kTokens, kInter}, dt, kGpu);
      r.kernel("swiglu_bwd",
               timer.median_ms([&] { lt::kernels::swiglu_bwd_cuda(dy, g, u, dg, du); }), 5 * act);
    });

    section(r, o, "cross_entropy", [&] {
      const lt::DType dt = lt::DType::kBF16;
      const int64_t t = o.ce_tokens;
      r.figures["cross_entropy_tokens"] = t;
      lt::Tensor z = randn({t, kVocab}, dt, 10, 3.0);
      std::vector<int64_t> y(t);
      for (int64_t i = 0; i < t; ++i) y[i] = (i % 17 == 16) ? -100 : (i * 7919) % kVocab;
      lt::Tensor tg = lt::Tensor::from_vector(y, {t}, kGpu);
      lt::Tensor loss = lt::Tensor::empty({t}, lt::DType::kF32, kGpu),
                 lse = lt::Tensor::empty({t}, lt::DType::kF32, kGpu);
      const double logits = static_cast<double>(z.nbytes());
      // The target check copies the targets to the host each call: part of the op's cost.
      r.kernel("cross_entropy_fwd",
               timer.median_ms([&] { lt::kernels::cross_entropy_fwd_cuda(z, tg, loss, lse); }),
               logits + t * 16.0);
      lt::Tensor d = lt::Tensor::empty({t, kVocab}, dt, kGpu);
      r.kernel("cross_entropy_bwd", timer.median_ms([&] {
        lt::kernels::cross_entropy_bwd_cuda(z, tg, lse, 1.0 / t, d);
      }),
               2 * logits + t * 12.0);
    });

    section(r, o, "adamw", [&] {
      // Qwen2.5-1.5B: embeddings (tied), 28 layers, final norm.
      std::vector<lt::Shape> shapes = {{kVocab, kHidden}, {kHidden}};
      for (int l = 0; l < kLayers; ++l) {
        for (const lt::Shape& s : std::vector<lt::Shape>{{kHidden, kHidden},
                                                         {kHidden},
                                                         {kKvHeads * kHeadDim, kHidden},
                                                         {kKvHeads * kHeadDim},
                                                         {kKvHeads * kHeadDim, kHidden},
                                                         {kKvHeads * kHeadDim},
                                                         {kHidden, kHidden},
                                                         {kInter, kHidden},
                                                         {kInter, kHidden},
                                                         {kHidden, kInter},
                                                         {kHidden},
                                                         {kHidden}})
          shapes.push_back(s);
      }
      std::vector<lt::AdamWTensor> ts;
      int64_t params = 0;
      uint64_t seed = 100;
      for (const lt::Shape& s : shapes) {
        lt::AdamWTensor t;
        t.param = randn(s, lt::DType::kBF16, seed++, 0.02);
        t.master = lt::Tensor::empty(s, lt::DType::kF32, kGpu, lt::MemTag::kOptimizer);
        lt::ops::copy(t.master, t.param);
        t.exp_avg = randn(s, lt::DType::kF32, seed++, 1e-3);
        t.exp_avg_sq = lt::Tensor::empty(s, lt::DType::kF32, kGpu, lt::MemTag::kOptimizer);
        lt::Generator g(seed++, lt::RngPurpose::kTest);
        lt::uniform_(t.exp_avg_sq, g, 0.0, 1e-6);
        t.grad = randn(s, lt::DType::kBF16, seed++, 1e-2);
        t.weight_decay = s.size() == 2 ? 0.1 : 0.0;
        params += t.param.numel();
        ts.push_back(std::move(t));
      }
      r.figures["adamw_params"] = static_cast<double>(params);
      r.figures["adamw_bytes_per_param"] = 28;
      int64_t step = 1;
      r.kernel("adamw", timer.median_ms([&] {
        lt::adamw_step_cuda(ts, lt::AdamWStepArgs{1e-5, 0.9, 0.95, 1e-8, step++, 1.0});
      }),
               28.0 * static_cast<double>(params));
    });
  } catch (const std::exception& e) {
    r.errors["setup"] = e.what();
  }
  nlohmann::json out;
  out["figures"] = r.figures;
  out["errors"] = r.errors;
  std::printf("%s\n", out.dump(1).c_str());
  return r.errors.empty() ? 0 : 1;
}
