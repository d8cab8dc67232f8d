// Table rows for the optimizer steps: the fused multi-tensor AdamW (engine/optim.cu) and the
// AdamW class, 8-bit AdamW (kernels/optim_8bit.cu) and the paged optimizers. Each side runs the
// same steps on copies of the same parameters, states and gradients. The device does the host's
// arithmetic operation for operation (IEEE-rounded, no FMA), so AdamW is held to the "repeat"
// row of the tolerance table (a host compiler may contract to FMA) and 8-bit AdamW to the bit.
// Cases: bf16/f16 parameters with f32 masters, f32 parameters in place, gradients of other
// dtypes, per-tensor weight decay, odd and misaligned sizes, more tensors and chunks than one
// launch holds; 8-bit states with full and short last blocks, 32-bit states below the size
// threshold, stochastic rounding; paged states in pinned host memory, slab by slab.
#include <string>
#include <vector>

#include "backend/table.h"
#include "engine/optim.h"
#include "kernels/optim_8bit.h"

namespace leantune::backend_test {
namespace {

using testing::backend_repeat_tol;

struct Spec {
  Shape shape;
  DType param, grad;
  bool master;
  double wd;
  int64_t offset = 0;  // elements of misalignment (a narrow of a larger buffer)
};

// One tensor's state on the run's device: parameter, master, m, v (gradients drawn per step).
AdamWTensor make_state(OpRun& r, const Spec& s, uint64_t seed) {
  const int64_t n = shape_numel(s.shape);
  AdamWTensor t;
  t.param = r.randn({n + s.offset}, s.param, seed, 0.5).narrow(0, s.offset, n).view(s.shape);
  if (s.master) {
    t.master = Tensor::empty(s.shape, DType::kF32, r.dev(), MemTag::kOptimizer);
    ops::copy(t.master, t.param);
  }
  // Non-zero moments, as after earlier steps (v >= 0).
  t.exp_avg = r.randn(s.shape, DType::kF32, seed + 1, 0.01);
  t.exp_avg_sq = r.randu(s.shape, DType::kF32, seed + 2, 0.0, 1e-3);
  t.weight_decay = s.wd;
  return t;
}

void adamw_steps(OpRun& r, const std::vector<Spec>& specs, int steps) {
  std::vector<AdamWTensor> ts;
  for (size_t i = 0; i < specs.size(); ++i) ts.push_back(make_state(r, specs[i], 1000 + 10 * i));
  for (int step = 1; step <= steps; ++step) {
    for (size_t i = 0; i < specs.size(); ++i)
      ts[i].grad = r.randn(specs[i].shape, specs[i].grad, 5000 + 100 * step + i);
    adamw_step(ts, {1e-3 * step, 0.9, 0.95, 1e-8, step, step == 2 ? 0.5 : 1.0});
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    std::string n = "t";
    n += std::to_string(i);
    n += '_';
    r.out(n + "param", ts[i].param, Rule::close(backend_repeat_tol(specs[i].param)));
    r.out(n + "exp_avg", ts[i].exp_avg, Rule::close(backend_repeat_tol(DType::kF32, 1e-2)));
    r.out(n + "exp_avg_sq", ts[i].exp_avg_sq, Rule::close(backend_repeat_tol(DType::kF32, 1e-5)));
    if (ts[i].master.defined())
      r.out(n + "master", ts[i].master, Rule::close(backend_repeat_tol(DType::kF32)));
  }
}

void adamw(std::vector<Entry>& t) {
  for (DType pdt : {DType::kF32, DType::kBF16, DType::kF16}) {
    const bool master = pdt != DType::kF32;
    const std::string d = dt_name(pdt);
    t.push_back({"adamw_mixed_tensors_" + d, [=](OpRun& r) {
                   adamw_steps(r,
                               {
                                   {{1}, pdt, DType::kF32, master, 0.1},
                                   {{19}, pdt, pdt, master, 0.0},
                                   {{71, 229}, pdt, DType::kF32, master, 0.01},
                                   {{896}, pdt, DType::kBF16, master, 0.0, 1},  // scalar path
                                   {{4864, 3}, pdt, pdt, master, 0.1, 3},
                                   {{896, 130}, pdt, DType::kF16, master, 0.05},  // partial chunk
                                   {{65536}, pdt, DType::kF32, master, 0.0},      // one whole chunk
                               },
                               3);
                 }});
    t.push_back({"adamw_many_launches_" + d, [=](OpRun& r) {
                   // 130 tensors (more than two launches' 60 slots) of awkward sizes, and one of
                   // 331 chunks (a launch of hundreds of blocks, its tensor found by search).
                   std::vector<Spec> specs;
                   for (int i = 0; i < 130; ++i)
                     specs.push_back(
                         {{37 * i + 1}, pdt, i % 2 ? DType::kF32 : pdt, master, 0.01 * (i % 3)});
                   specs.push_back({{330 * 65536 + 5}, pdt, DType::kBF16, master, 0.1});
                   adamw_steps(r, specs, 2);
                 }});
  }
  for (DType pdt : {DType::kF32, DType::kBF16})
    t.push_back({"adamw_class_" + dt_name(pdt) + "_71x229", [=](OpRun& r) {
                   Tensor w = r.randn({71, 229}, pdt, 31), b = r.randn({229}, pdt, 32);
                   const AdamWConfig cfg{1e-3, 0.9, 0.999, 1e-8, 0.1};
                   AdamW opt({{"w", w, true}, {"b", b, false}}, cfg);
                   for (int step = 1; step <= 3; ++step) {
                     w.set_grad(r.randn({71, 229}, DType::kF32, 40 + step));
                     b.set_grad(r.randn({229}, DType::kF32, 50 + step));
                     opt.step(1e-3 / step, 0.8);
                   }
                   r.out("w", w, Rule::close(backend_repeat_tol(pdt)));
                   r.out("b", b, Rule::close(backend_repeat_tol(pdt)));
                   for (const auto& [name, state] : opt.state_tensors()) {
                     r.expect(name + " on the parameters' device",
                              ::testing::AssertionResult(state.device() == r.dev()));
                     r.out(name, state, Rule::close(backend_repeat_tol(DType::kF32, 1e-2)));
                   }
                 }});
}

struct Case8 {
  std::string name;
  int64_t n;
  DType param, grad;
  double wd;
  bool sr = false;  // stochastic rounding of a bf16 param
};

void adamw8bit(std::vector<Entry>& t) {
  for (const Case8& c : {Case8{"f32_4128_wd", 4128, DType::kF32, DType::kF32, 0.01},
                         Case8{"bf16_71x229", 71 * 229, DType::kBF16, DType::kBF16, 0.0},
                         Case8{"f32_bf16grad_65536", 65536, DType::kF32, DType::kBF16, 0.1},
                         Case8{"f32_small_992_wd", 992, DType::kF32, DType::kF32, 0.01},
                         Case8{"bf16_small_19", 19, DType::kBF16, DType::kF32, 0.0},
                         Case8{"bf16_sr_71x229", 71 * 229, DType::kBF16, DType::kBF16, 0.01, true},
                         Case8{"bf16_sr_small_19", 19, DType::kBF16, DType::kF32, 0.0, true}})
    t.push_back({"adamw8bit_" + c.name, [=](OpRun& r) {
                   kernels::Adam8Tensor s;
                   s.param = r.randn({c.n}, c.param, 11, 0.1);
                   const bool q = c.n >= kernels::kOptim8bitMinSize;
                   const DType sdt = q ? DType::kU8 : DType::kF32;
                   s.state1 = Tensor::zeros({c.n}, sdt, r.dev(), MemTag::kOptimizer);
                   s.state2 = Tensor::zeros({c.n}, sdt, r.dev(), MemTag::kOptimizer);
                   if (q) {
                     const int64_t blocks = (c.n + 255) / 256;
                     s.absmax1 = Tensor::zeros({blocks}, DType::kF32, r.dev(), MemTag::kOptimizer);
                     s.absmax2 = Tensor::zeros({blocks}, DType::kF32, r.dev(), MemTag::kOptimizer);
                   }
                   s.weight_decay = c.wd;
                   s.stochastic_round = c.sr;
                   s.seed = 0x5eed;
                   for (int step = 1; step <= 3; ++step) {
                     s.grad = r.randn({c.n}, c.grad, 100 + step, 0.01);
                     kernels::adamw8bit_step({s}, {1e-3 * step, 0.9, 0.999, 1e-8, step, 0.75});
                     const std::string n = "_step" + std::to_string(step);
                     r.out("param" + n, s.param, Rule::bits());
                     r.out("state1" + n, s.state1, Rule::bits());
                     r.out("state2" + n, s.state2, Rule::bits());
                     if (q) {
                       r.out("absmax1" + n, s.absmax1, Rule::bits());
                       r.out("absmax2" + n, s.absmax2, Rule::bits());
                     }
                   }
                 }});
  // paged_adamw_8bit / paged_adamw_32bit on a device: states in pinned host memory, paged
  // through two device slots in slabs (2048 elements: 8 slabs, the copy of each overlapping the
  // step of the one before on the copy stream) against the host optimizer, unpaged.
  for (int64_t slab : {int64_t{2048}, kernels::kPagedSlabElements})
    for (bool eight : {true, false})
      t.push_back(
          {"adamw8bit_paged_" + std::string(eight ? "8bit" : "32bit") + "_slab" +
               std::to_string(slab) + "_bf16_71x229",
           [=](OpRun& r) {
             Tensor p = r.randn({71, 229}, DType::kBF16, 21, 0.1);
             kernels::AdamW8bit opt({{"w", p, true}}, AdamWConfig{1e-3, 0.9, 0.999, 1e-8, 0.01},
                                    kernels::AdamW8bitOptions{eight, r.cuda(), slab});
             for (int step = 1; step <= 3; ++step) {
               p.set_grad(r.randn({71, 229}, DType::kBF16, 200 + step, 0.01));
               opt.step(1e-3);
             }
             r.out("w", p, Rule::bits());
             for (const auto& [name, state] : opt.state_tensors()) {
               r.out(name, state, Rule::bits());
               if (!r.cuda()) continue;
               r.expect(name + " on the host", ::testing::AssertionResult(state.device().is_cpu()));
               r.expect(name + " pinned", ::testing::AssertionResult(state.storage()->is_pinned()));
             }
           }});
}

}  // namespace

std::vector<Entry> optim_entries() {
  std::vector<Entry> t;
  adamw(t);
  adamw8bit(t);
  return t;
}

}  // namespace leantune::backend_test
