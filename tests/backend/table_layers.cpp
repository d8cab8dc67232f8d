// Table rows for the per-token layers of kernels/ (each <op>.cu against its CPU path):
// rms_norm (and Gemma's (1 + w)), rope (and Phi-3's partial rotary with longrope's attention
// factor), swiglu and geglu, residual_add, dropout and embedding: raw forward and backward into
// guarded buffers, each gradient alone, in-place and strided operands, host and device ids or
// positions of both index types, and the autograd op. Sizes 1, 19, 71x229, the Qwen2.5-0.5B and
// Gemma 3 widths, rows in registers and in loops, and the 151,936-row vocabulary.
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "backend/table.h"
#include "engine/autograd.h"
#include "engine/rng.h"
#include "kernels/dropout.h"
#include "kernels/embedding.h"
#include "kernels/residual.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"

namespace leantune::backend_test {
namespace {

using testing::backend_repeat_tol;
using testing::backend_tol;

Tensor host_randn(const Shape& s, DType dt, uint64_t seed, double std = 1.0) {
  return testing::randn(s, dt, seed, Device::cpu(), std);
}

// A contiguous copy of t one element past a 16-byte boundary, on t's device.
Tensor misaligned_copy(const Tensor& t) {
  const Tensor wide = Tensor::zeros({t.numel() + 1}, t.dtype(), t.device());
  Tensor v = wide.narrow(0, 1, t.numel()).view(t.shape());
  v.copy_(t);
  return v;
}

// ---------------------------------------------------------------- rms_norm

constexpr double kEps = 1e-6;

void rms_norm(std::vector<Entry>& t) {
  struct Case {
    DType dt;
    int64_t t, h;
    bool offset = false;  // Gemma's (1 + w)
  };
  // 8192 is the widest bf16 row kept in registers, 10000 and 4097 take the loop kernels, 4096
  // rows the persistent backward grid; with the unit offset: rows in registers, the loop kernel,
  // q/k norms over head_dim 256, Gemma 3 1B's width 1152.
  for (const Case c : {Case{DType::kF32, 1, 1},          Case{DType::kBF16, 1, 1},
                       Case{DType::kF32, 19, 19},        Case{DType::kBF16, 19, 19},
                       Case{DType::kF32, 71, 229},       Case{DType::kBF16, 71, 229},
                       Case{DType::kF16, 71, 229},       Case{DType::kF32, 5, 896},
                       Case{DType::kBF16, 5, 896},       Case{DType::kBF16, 3, 4864},
                       Case{DType::kF32, 3, 4864},       Case{DType::kBF16, 2, 8192},
                       Case{DType::kBF16, 2, 10000},     Case{DType::kF32, 3, 4097},
                       Case{DType::kBF16, 4096, 896},    Case{DType::kF32, 1000, 1536},
                       Case{DType::kF32, 1, 1, true},    Case{DType::kBF16, 71, 229, true},
                       Case{DType::kF32, 71, 256, true}, Case{DType::kBF16, 3, 10000, true},
                       Case{DType::kF16, 19, 1152, true}}) {
    const std::string n =
        dt_name(c.dt) + "_" + shape_name({c.t, c.h}) + (c.offset ? "_unit_offset" : "");
    const DType sd = stat_dtype(c.dt);
    // dw sums t rows: its absolute error grows with sqrt(t); x*rstd is rounded before the weight
    // multiply, so 16-bit outputs may land two roundings apart (the table's 16-bit rows).
    const Rule y_rule = Rule::close(backend_tol(c.dt, 2.0));
    const Rule dx_rule = Rule::close(backend_tol(c.dt, 4.0));
    const Rule dw_rule = Rule::close(backend_tol(c.dt, 2.0 * std::sqrt(double(c.t))));
    t.push_back(
        {"rms_norm_fwd_" + n, [=](OpRun& r) {
           const Tensor x = r.randn({c.t, c.h}, c.dt, 101, 2.0), w = r.randn({c.h}, c.dt, 102);
           Tensor y = r.guarded({c.t, c.h}, c.dt), rstd = r.guarded({c.t}, sd);
           kernels::rms_norm_fwd(x, w, kEps, y, rstd, c.offset);
           r.out("rstd", rstd, Rule::close(backend_tol(sd, 0.0)));
           r.out("y", y, y_rule);
         }});
    t.push_back({"rms_norm_bwd_" + n, [=](OpRun& r) {
                   // Both backends differentiate at the host's rstd.
                   const Tensor xh = host_randn({c.t, c.h}, c.dt, 111, 2.0);
                   const Tensor wh = host_randn({c.h}, c.dt, 112);
                   Tensor yh = Tensor::empty({c.t, c.h}, c.dt), rh = Tensor::empty({c.t}, sd);
                   kernels::rms_norm_fwd(xh, wh, kEps, yh, rh, c.offset);
                   const Tensor x = r.on(xh), w = r.on(wh), rstd = r.on(rh);
                   const Tensor dy = r.randn({c.t, c.h}, c.dt, 113);
                   Tensor dx = r.guarded({c.t, c.h}, c.dt), dw = r.guarded({c.h}, c.dt);
                   kernels::rms_norm_bwd(dy, x, w, rstd, dx, dw, c.offset);
                   r.out("dx", dx, dx_rule);
                   r.out("dw", dw, dw_rule);
                   // Each gradient alone, bit for bit (no atomics).
                   Tensor dx_only = Tensor::empty({c.t, c.h}, c.dt, r.dev());
                   kernels::rms_norm_bwd(dy, x, w, rstd, dx_only, Tensor(), c.offset);
                   r.same("dx_only", dx_only, "dx");
                   Tensor dw_only = Tensor::empty({c.h}, c.dt, r.dev());
                   kernels::rms_norm_bwd(dy, x, w, rstd, Tensor(), dw_only, c.offset);
                   r.same("dw_only", dw_only, "dw");
                   // dy, x and dx one element off 16-byte alignment: the same bits.
                   const Tensor dx_off = misaligned_copy(Tensor::zeros({c.t, c.h}, c.dt, r.dev()));
                   kernels::rms_norm_bwd(misaligned_copy(dy), misaligned_copy(x), w, rstd, dx_off,
                                         Tensor(), c.offset);
                   r.same("dx_misaligned", dx_off, "dx");
                 }});
    t.push_back({"rms_norm_autograd_" + n, [=](OpRun& r) {
                   Tensor x = r.randn({c.t, c.h}, c.dt, 121, 2.0).set_requires_grad(true);
                   Tensor w = r.randn({c.h}, c.dt, 122).set_requires_grad(true);
                   const Tensor y = kernels::rms_norm(x, w, kEps, c.offset);
                   r.expect("y on the run's device",
                            ::testing::AssertionResult(y.device() == r.dev()));
                   r.out("y", y, y_rule);
                   y.backward(r.randn({c.t, c.h}, c.dt, 123));
                   r.out("dx", x.grad(), dx_rule);
                   r.out("dw", w.grad(), dw_rule);
                 }});
    // The residual add fused in front: against the other backend, and bit for bit against
    // residual_add then rms_norm on this one, gradients through both outputs (the sum's own
    // gradient is the backward's dres) and through y alone.
    t.push_back(
        {"add_rms_norm_" + n, [=](OpRun& r) {
           const Tensor a0 = r.randn({c.t, c.h}, c.dt, 131, 2.0);
           const Tensor b0 = r.randn({c.t, c.h}, c.dt, 132);
           const Tensor w0 = r.randn({c.h}, c.dt, 133);
           const Tensor ds = r.randn({c.t, c.h}, c.dt, 134), dy = r.randn({c.t, c.h}, c.dt, 135);
           for (const bool unfused : {false, true})
             for (const bool both : {true, false}) {
               const std::string m =
                   std::string(unfused ? "unfused_" : "") + (both ? "" : "y_only_");
               Tensor a = a0.clone().set_requires_grad(true),
                      b = b0.clone().set_requires_grad(true);
               Tensor w = w0.clone().set_requires_grad(true);
               kernels::AddRmsNormOutput o;
               if (unfused) {
                 o.sum = kernels::residual_add(a, b);
                 o.y = kernels::rms_norm(o.sum, w, kEps, c.offset);
               } else {
                 o = kernels::add_rms_norm(a, b, w, kEps, c.offset);
               }
               if (both)
                 backward({o.sum, o.y}, {ds, dy});
               else
                 backward({o.y}, {dy});
               const std::pair<std::string, Tensor> outs[] = {{"sum", o.sum},
                                                              {"y", o.y},
                                                              {"da", a.grad()},
                                                              {"db", b.grad()},
                                                              {"dw", w.grad()}};
               for (const auto& [name, v] : outs) {
                 if (!unfused) {
                   const Rule rule = name == "sum"  ? Rule::close(backend_repeat_tol(c.dt))
                                     : name == "y"  ? y_rule
                                     : name == "dw" ? dw_rule
                                                    : dx_rule;
                   r.out(m + name, v, rule);
                 } else {
                   r.same(m + name, v, (both ? "" : "y_only_") + name);
                 }
               }
             }
           // b handed over: y is written into b's storage (the kernel reads each element before
           // it writes it), with the same values.
           Tensor handed = b0.clone();
           const void* storage = handed.data_ptr();
           const kernels::AddRmsNormOutput o =
               kernels::add_rms_norm(a0, std::move(handed), w0, kEps, c.offset);
           r.expect("y in b's storage", ::testing::AssertionResult(o.y.data_ptr() == storage));
           r.same("handed_sum", o.sum, "sum");
           r.same("handed_y", o.y, "y");
           // a and b one element off 16-byte alignment: the same kernel and bits (the adapter
           // aligns them, so the reduction order follows from h alone).
           const kernels::AddRmsNormOutput off =
               kernels::add_rms_norm(misaligned_copy(a0), misaligned_copy(b0), w0, kEps, c.offset);
           r.same("misaligned_sum", off.sum, "sum");
           r.same("misaligned_y", off.y, "y");
         }});
  }
}

// ---------------------------------------------------------------- rope

// Positions of packed sequences: runs that restart at 0, up to max_pos.
Tensor positions(int64_t t, int64_t max_pos, DType dt) {
  std::vector<int64_t> p(static_cast<size_t>(t));
  int64_t cur = max_pos > 40 ? max_pos - 40 : 0;
  for (int64_t i = 0; i < t; ++i) {
    p[i] = cur;
    cur = (i % 23 == 22) ? 0 : std::min(cur + 1, max_pos);
  }
  Tensor out = Tensor::from_vector(p, {t});
  return dt == DType::kI64 ? out : out.to(dt);
}

void rope(std::vector<Entry>& t) {
  struct Case {
    DType dt;
    int64_t t, heads, d, max_pos;
  };
  for (const Case c : {Case{DType::kF32, 1, 1, 2, 0}, Case{DType::kBF16, 1, 1, 2, 0},
                       Case{DType::kF32, 19, 3, 6, 100}, Case{DType::kBF16, 19, 3, 6, 100},
                       Case{DType::kF32, 71, 2, 64, 4096}, Case{DType::kBF16, 71, 12, 128, 32768},
                       Case{DType::kF16, 71, 2, 128, 4096}, Case{DType::kF32, 229, 12, 128, 131072},
                       Case{DType::kBF16, 229, 14, 64, 8192}, Case{DType::kF64, 19, 2, 64, 1000}}) {
    const Shape s{c.t, c.heads, c.d};
    const std::string n = dt_name(c.dt) + "_" + shape_name(s) + "_pos" + std::to_string(c.max_pos);
    // cos/sin agree to a few f32 ulps (sincosf against the host's libm); one rounding to 16 bits.
    const Rule rule = Rule::close(backend_tol(c.dt));
    t.push_back({"rope_" + n, [=](OpRun& r) {
                   kernels::RopeConfig cfg;
                   cfg.head_dim = c.d;
                   cfg.theta = 1000000.0;
                   const DType table = stat_dtype(c.dt);
                   const Tensor inv =
                       Tensor::from_doubles(kernels::rope_inv_freq(cfg), {c.d / 2}, table);
                   const Tensor x = r.randn(s, c.dt, 401);
                   for (DType pdt : {DType::kI64, DType::kI32})
                     for (bool inverse : {false, true}) {
                       const std::string m =
                           std::string(inverse ? "inverse_" : "forward_") + dt_name(pdt);
                       const Tensor pos = positions(c.t, c.max_pos, pdt);
                       // Host positions and table, then the run's; in place (y aliases x).
                       Tensor y = r.guarded(s, c.dt);
                       kernels::rope_apply(x, pos, inv, inverse, y);
                       r.out(m, y, rule);
                       Tensor y2 = Tensor::empty(s, c.dt, r.dev());
                       kernels::rope_apply(x, r.on(pos), r.on(inv), inverse, y2);
                       r.same(m + "_device_positions", y2, m);
                       Tensor xi = x.clone();
                       kernels::rope_apply(xi, r.on(pos), r.on(inv), inverse, xi);
                       r.same(m + "_in_place", xi, m);
                     }
                 }});
    t.push_back({"rope_autograd_" + n, [=](OpRun& r) {
                   kernels::RopeConfig cfg;
                   cfg.head_dim = c.d;
                   Tensor x = r.randn(s, c.dt, 411).set_requires_grad(true);
                   const Tensor y =
                       kernels::rope(x, r.on(positions(c.t, c.max_pos, DType::kI64)), cfg);
                   r.out("y", y, rule);
                   y.backward(r.randn(s, c.dt, 412));
                   r.out("dx", x.grad(), rule);
                 }});
  }
}

// Phi-3's partial rotary (rotary_dim < head_dim: the rest passes through) with longrope's
// attention factor: forward and inverse into guarded buffers (the pass-through part x's own
// bits), in place equal to out of place, the autograd op's output equal to the raw op's, its
// gradient.
void rope_partial(std::vector<Entry>& t) {
  constexpr double kFactor = 1.19;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF64})
    for (auto [d, rot] : {std::pair<int64_t, int64_t>{16, 12}, {96, 72}, {128, 64}, {8, 2}}) {
      const Shape s{71, 3, d};
      const std::string n = dt_name(dt) + "_" + shape_name(s) + "_rotary" + std::to_string(rot);
      const Rule rule = Rule::close(backend_tol(dt));
      t.push_back({"rope_partial_" + n, [=](OpRun& r) {
                     kernels::RopeConfig cfg;
                     cfg.head_dim = d;
                     cfg.rotary_dim = rot;
                     cfg.attention_factor = kFactor;
                     const Tensor inv = r.on(Tensor::from_doubles(kernels::rope_inv_freq(cfg),
                                                                  {rot / 2}, stat_dtype(dt)));
                     const Tensor pos = r.on(positions(71, 5000, DType::kI64));
                     const Tensor x = r.randn(s, dt, 421);
                     r.keep("x_pass_through", x.narrow(2, rot, d - rot));
                     for (bool inverse : {false, true}) {
                       const std::string m = inverse ? "inverse" : "forward";
                       Tensor y = r.guarded(s, dt);
                       kernels::rope_apply(x, pos, inv, inverse, y, kFactor);
                       r.out(m, y, rule);
                       r.same(m + "_pass_through", y.narrow(2, rot, d - rot), "x_pass_through",
                              Rule::bits());
                       Tensor xi = x.clone();
                       kernels::rope_apply(xi, pos, inv, inverse, xi, kFactor);
                       r.same(m + "_in_place", xi, m);
                     }
                     Tensor xa = x.clone().set_requires_grad(true);
                     const Tensor ya = kernels::rope(xa, pos, cfg);
                     r.same("forward_autograd", ya, "forward");
                     ya.backward(r.randn(s, dt, 422));
                     r.out("dx", xa.grad(), rule);
                   }});
    }
}

// ---------------------------------------------------------------- swiglu, geglu

// The two activations share one CPU path and one kernel template; the rows check each.
struct GatedOp {
  std::string name;
  void (*fwd)(const Tensor&, const Tensor&, const Tensor&);
  void (*bwd)(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&);
  Tensor (*autograd)(const Tensor&, const Tensor&);
};

void gated(std::vector<Entry>& t, const GatedOp& op,
           const std::vector<std::pair<DType, Shape>>& cases) {
  for (const auto& [dt, s] : cases) {
    const std::string n = dt_name(dt) + "_" + shape_name(s);
    const Rule rule = Rule::close(backend_tol(dt));
    t.push_back({op.name + "_fwd_bwd_" + n, [=](OpRun& r) {
                   // Wide gate values reach both branches of the overflow-free sigmoid and
                   // gelu's saturated tanh.
                   const Tensor g = r.randn(s, dt, 201, 6.0), u = r.randn(s, dt, 202);
                   const Tensor dy = r.randn(s, dt, 203);
                   Tensor y = r.guarded(s, dt), dg = r.guarded(s, dt), du = r.guarded(s, dt);
                   op.fwd(g, u, y);
                   op.bwd(dy, g, u, dg, du);
                   r.out("y", y, rule);
                   r.out("dgate", dg, rule);
                   r.out("dup", du, rule);
                   // One gradient alone; a strided gate (a transposed view) is read correctly.
                   Tensor du_only = Tensor::empty(s, dt, r.dev());
                   op.bwd(dy, g, u, Tensor(), du_only);
                   r.same("dup_only", du_only, "dup");
                   const Tensor gt = g.transpose(0, 1).contiguous().transpose(0, 1);
                   Tensor y2 = Tensor::empty(s, dt, r.dev());
                   op.fwd(gt, u, y2);
                   r.same("y_strided_gate", y2, "y");
                   // The autograd op runs the same kernels: bit for bit the raw results.
                   Tensor ga = g.clone().set_requires_grad(true);
                   Tensor ua = u.clone().set_requires_grad(true);
                   const Tensor ya = op.autograd(ga, ua);
                   r.same("y_autograd", ya, "y", Rule::bits());
                   ya.backward(dy);
                   r.same("dgate_autograd", ga.grad(), "dgate", Rule::bits());
                   r.same("dup_autograd", ua.grad(), "dup", Rule::bits());
                 }});
    t.push_back({op.name + "_autograd_" + n, [=](OpRun& r) {
                   Tensor g = r.randn(s, dt, 211, 3.0).set_requires_grad(true);
                   Tensor u = r.randn(s, dt, 212).set_requires_grad(true);
                   const Tensor y = op.autograd(g, u);
                   r.out("y", y, rule);
                   y.backward(r.randn(s, dt, 213));
                   r.out("dgate", g.grad(), rule);
                   r.out("dup", u.grad(), rule);
                 }});
  }
}

void gated_mlp(std::vector<Entry>& t) {
  gated(t, {"swiglu", kernels::swiglu_fwd, kernels::swiglu_bwd, kernels::swiglu},
        {{DType::kF32, {1, 1}},
         {DType::kBF16, {1, 1}},
         {DType::kF32, {1, 19}},
         {DType::kBF16, {19, 1}},
         {DType::kF32, {71, 229}},
         {DType::kBF16, {71, 229}},
         {DType::kF16, {71, 229}},
         {DType::kBF16, {7, 4864}},
         {DType::kF32, {7, 4864}},
         {DType::kF64, {19, 71}}});
  // Gemma's GeGLU; 6912 is Gemma 3 1B's intermediate width.
  std::vector<std::pair<DType, Shape>> geglu;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16, DType::kF64})
    for (const Shape& s : {Shape{1, 1}, Shape{19, 19}, Shape{71, 229}, Shape{5, 6912}})
      geglu.push_back({dt, s});
  gated(t, {"geglu", kernels::geglu_fwd, kernels::geglu_bwd, kernels::geglu}, geglu);
}

// ---------------------------------------------------------------- residual_add

void residual(std::vector<Entry>& t) {
  struct Case {
    DType dt;
    Shape shape;
  };
  for (const Case& c :
       {Case{DType::kF32, {1}}, Case{DType::kBF16, {1}}, Case{DType::kF32, {19}},
        Case{DType::kBF16, {19}}, Case{DType::kF32, {71, 229}}, Case{DType::kBF16, {71, 229}},
        Case{DType::kF16, {71, 229}}, Case{DType::kBF16, {33, 896}}, Case{DType::kF32, {5, 4864}},
        Case{DType::kF64, {19, 71}}}) {
    const std::string n = dt_name(c.dt) + "_" + shape_name(c.shape);
    // One f32 sum rounded once on both sides: identical results.
    t.push_back({"residual_add_" + n, [=](OpRun& r) {
                   const Tensor a = r.randn(c.shape, c.dt, 301), b = r.randn(c.shape, c.dt, 302);
                   Tensor y = r.guarded(c.shape, c.dt);
                   kernels::residual_add_fwd(a, b, y);
                   r.out("y", y, Rule::exact());
                   Tensor acc = a.clone();
                   kernels::residual_add_fwd(acc, b, acc);
                   r.same("in_place", acc, "y");
                 }});
    if (c.shape.size() != 2) continue;
    t.push_back({"residual_add_strided_autograd_" + n, [=](OpRun& r) {
                   const Shape tr{c.shape[1], c.shape[0]};
                   const Tensor a = r.randn(tr, c.dt, 311), b = r.randn(c.shape, c.dt, 312);
                   Tensor y = Tensor::empty(c.shape, c.dt, r.dev());
                   kernels::residual_add_fwd(a.transpose(0, 1), b, y);
                   r.out("y_strided", y, Rule::exact());
                   Tensor x1 = r.on(b).set_requires_grad(true),
                          x2 = r.on(b).set_requires_grad(true);
                   const Tensor dy = r.randn(c.shape, c.dt, 313);
                   kernels::residual_add(x1, x2).backward(dy);
                   r.out("dy", dy, Rule::exact());
                   r.same("da", x1.grad(), "dy");
                   r.same("db", x2.grad(), "dy");
                 }});
  }
}

// ---------------------------------------------------------------- dropout

// The CUDA mask and values equal the host's bit for bit (the same Philox mapping), and equal
// bernoulli_ drawn on the same device from the same offset.
void dropout(std::vector<Entry>& t) {
  struct Case {
    DType dt;
    double p;
    int64_t n;
  };
  for (const Case c :
       {Case{DType::kF32, 0.1, 4096}, Case{DType::kF32, 0.5, 1001}, Case{DType::kBF16, 0.1, 65536},
        Case{DType::kF16, 0.3, 8}, Case{DType::kF64, 0.25, 777}}) {
    const std::string n = dt_name(c.dt) + "_p" + std::to_string(static_cast<int>(c.p * 100)) + "_" +
                          std::to_string(c.n);
    t.push_back(
        {"dropout_fwd_bwd_" + n, [=](OpRun& r) {
           const Tensor x = r.randn({c.n}, c.dt, 501);
           const PhiloxParams params{1234, 17, static_cast<uint32_t>(RngPurpose::kDropout), 0};
           Tensor y = r.guarded({c.n}, c.dt);
           kernels::dropout_fwd(x, y, c.p, params);
           r.out("y", y, Rule::exact());
           Tensor dx = Tensor::empty({c.n}, c.dt, r.dev());
           kernels::dropout_bwd(x, dx, c.p, params);
           r.out("dx", dx, Rule::exact());
         }});
    t.push_back({"dropout_mask_is_bernoulli_" + n, [=](OpRun& r) {
                   const Tensor ones = Tensor::full({c.n}, 1.0, c.dt, r.dev());
                   Generator g1(8, RngPurpose::kDropout), g2(8, RngPurpose::kDropout);
                   const Tensor y = kernels::dropout(ones, c.p, g1);
                   Tensor keep = Tensor::empty({c.n}, c.dt, r.dev());
                   bernoulli_(keep, g2, 1.0 - c.p);
                   auto mask = [](const Tensor& v) {
                     std::vector<double> m = v.to_f64();
                     for (double& e : m) e = e != 0.0 ? 1.0 : 0.0;
                     return Tensor::from_doubles(m, {static_cast<int64_t>(m.size())}, DType::kF32);
                   };
                   r.out("dropout_mask", mask(y), Rule::exact());
                   r.same("bernoulli_mask", mask(keep), "dropout_mask");
                   r.out("dropout_offset", static_cast<double>(g1.offset()), Rule::exact());
                   r.same("bernoulli_offset", static_cast<double>(g2.offset()), "dropout_offset");
                 }});
    if (c.n % 8 != 0) continue;  // the strided case views n as [8, n/8]
    t.push_back(
        {"dropout_autograd_strided_" + n, [=](OpRun& r) {
           Tensor x = r.randn({8, c.n / 8}, c.dt, 511).transpose(0, 1).set_requires_grad(true);
           Generator g(3, RngPurpose::kDropout);
           const Tensor y = kernels::dropout(x, c.p, g);
           r.out("y", y, Rule::exact());
           y.backward(r.randn(y.shape(), c.dt, 512));
           r.out("dx", x.grad(), Rule::exact());
         }});
  }
}

// ---------------------------------------------------------------- embedding

// Ids with repeats: a long run of one id (like padding), the first and last ids, the rest
// pseudo-random.
Tensor make_ids(int64_t t, int64_t v, DType dt) {
  std::vector<int64_t> ids(static_cast<size_t>(t));
  uint64_t s = 12345;
  for (int64_t i = 0; i < t; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    ids[i] = static_cast<int64_t>((s >> 33) % static_cast<uint64_t>(v));
  }
  for (int64_t i = t / 2; i < t && i < t / 2 + 40; ++i) ids[i] = v / 3;
  if (t > 0) ids[0] = v - 1;
  if (t > 1) ids[t - 1] = 0;
  Tensor out = Tensor::from_vector(ids, {t});
  return dt == DType::kI64 ? out : out.to(dt);
}

void embedding(std::vector<Entry>& t) {
  struct Case {
    DType dt;
    int64_t t, v, h;
  };
  for (const Case c : {Case{DType::kF32, 1, 1, 1}, Case{DType::kBF16, 1, 1, 1},
                       Case{DType::kF32, 19, 7, 19}, Case{DType::kBF16, 19, 7, 19},
                       Case{DType::kF32, 229, 71, 229}, Case{DType::kBF16, 229, 71, 229},
                       Case{DType::kF16, 229, 71, 229}, Case{DType::kBF16, 1000, 4864, 896},
                       Case{DType::kF32, 300, 151936, 64}, Case{DType::kF64, 71, 19, 33}}) {
    const std::string n =
        dt_name(c.dt) + "_" + std::to_string(c.t) + "ids_" + shape_name({c.v, c.h});
    t.push_back({"embedding_fwd_" + n, [=](OpRun& r) {
                   const Tensor w = r.randn({c.v, c.h}, c.dt, 601);
                   for (DType idt : {DType::kI64, DType::kI32}) {
                     const std::string m = "y_" + dt_name(idt);
                     const Tensor ids = make_ids(c.t, c.v, idt);
                     Tensor y = r.guarded({c.t, c.h}, c.dt);
                     kernels::embedding_fwd(w, ids, y);
                     r.out(m, y, Rule::exact());
                     Tensor y2 = Tensor::empty({c.t, c.h}, c.dt, r.dev());
                     kernels::embedding_fwd(w, r.on(ids), y2);
                     r.same(m + "_device_ids", y2, m);
                   }
                 }});
    // Sums of the same rounded rows in the same order: identical to the CPU path.
    t.push_back({"embedding_bwd_" + n, [=](OpRun& r) {
                   const Tensor dy = r.randn({c.t, c.h}, c.dt, 611);
                   for (DType idt : {DType::kI64, DType::kI32}) {
                     const std::string m = "dw_" + dt_name(idt);
                     const Tensor ids = make_ids(c.t, c.v, idt);
                     Tensor dw = r.guarded({c.v, c.h}, c.dt);
                     ops::fill(dw, 3.0);  // overwritten, not accumulated
                     kernels::embedding_bwd(dy, r.on(ids), dw);
                     r.out(m, dw, Rule::exact());
                     Tensor dw2 = Tensor::empty({c.v, c.h}, c.dt, r.dev());
                     kernels::embedding_bwd(dy, ids, dw2);
                     r.same(m + "_host_ids", dw2, m);
                   }
                   // f32 gradient for 16-bit dy (the accumulation dtype of bf16 weights).
                   Tensor dw32 = Tensor::empty({c.v, c.h}, DType::kF32, r.dev());
                   kernels::embedding_bwd(dy, r.on(make_ids(c.t, c.v, DType::kI64)), dw32);
                   r.out("dw_f32", dw32, Rule::exact());
                 }});
    t.push_back({"embedding_out_of_range_ids_" + n, [=](OpRun& r) {
                   const Tensor w = r.randn({c.v, c.h}, c.dt, 621);
                   for (int64_t bad : {c.v, int64_t{-1}}) {
                     std::vector<int64_t> v(static_cast<size_t>(c.t), 0);
                     v[static_cast<size_t>(c.t - 1)] = bad;
                     const Tensor ids = Tensor::from_vector(v, {c.t});
                     const std::string m = "id " + std::to_string(bad);
                     Tensor y = Tensor::empty({c.t, c.h}, c.dt, r.dev());
                     r.throws(m + " (forward, host ids)",
                              [&] { kernels::embedding_fwd(w, ids, y); });
                     r.throws(m + " (forward, device ids)",
                              [&] { kernels::embedding_fwd(w, r.on(ids), y); });
                     Tensor dw = Tensor::empty({c.v, c.h}, c.dt, r.dev());
                     const Tensor dy = Tensor::zeros({c.t, c.h}, c.dt, r.dev());
                     r.throws(m + " (backward, device ids)",
                              [&] { kernels::embedding_bwd(dy, r.on(ids), dw); });
                   }
                 }});
    t.push_back({"embedding_autograd_" + n, [=](OpRun& r) {
                   Tensor w = r.randn({c.v, c.h}, c.dt, 631).set_requires_grad(true);
                   const Tensor y = kernels::embedding(w, r.on(make_ids(c.t, c.v, DType::kI64)));
                   r.out("y", y, Rule::exact());
                   y.backward(r.randn({c.t, c.h}, c.dt, 632));
                   r.out("dw", w.grad(), Rule::exact());
                 }});
  }
}

}  // namespace

std::vector<Entry> layer_entries() {
  std::vector<Entry> t;
  rms_norm(t);
  rope(t);
  rope_partial(t);
  gated_mlp(t);
  residual(t);
  dropout(t);
  embedding(t);
  return t;
}

}  // namespace leantune::backend_test
