// Table rows for the losses of kernels/: cross_entropy (the one-pass online forward, lse and
// per-row loss, and the one-pass backward, in place too; host and device targets of both index
// types; ignored rows, targets 0 and V-1, large logits, the 151,936-wide vocabulary; a bad
// target leaves the outputs untouched; row statistics), the vocabulary-block softmax, and
// linear_cross_entropy (loss, dhidden overwritten with 0 on ignored rows, dweight accumulated
// into; one and many chunks, consecutive and gathered valid rows, all rows ignored, dweight in
// another dtype or not contiguous, only one gradient, none, the autograd op; soft-capped logits;
// the row statistics), and linear_divergence (distillation: divergence, entropy and both
// gradients for beta 0, 1 and between, temperatures, soft-capping, masked rows, a wider teacher
// or one in another dtype, tiles that split rows and vocabulary unevenly, the 151,936-wide
// vocabulary; 16-bit rows also under flash-attention's rule).
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "backend/naive.h"
#include "backend/table.h"
#include "engine/autograd.h"
#include "kernels/cross_entropy.h"
#include "kernels/linear_cross_entropy.h"
#include "kernels/linear_divergence.h"
#include "kernels/vocab_block_softmax.h"

namespace leantune::backend_test {
namespace {

using kernels::kIgnoreIndex;
using testing::backend_norm_tol;
using testing::backend_sum_tol;
using testing::backend_tol;

Tensor host_randn(const Shape& s, DType dt, uint64_t seed, double std = 1.0) {
  return testing::randn(s, dt, seed, Device::cpu(), std);
}

Tensor with_index_dtype(const std::vector<int64_t>& y, DType dt) {
  const Tensor t = Tensor::from_vector(y, {static_cast<int64_t>(y.size())});
  return dt == DType::kI64 ? t : t.to(dt);
}

// Every third row ignored; the others cycle through 0, V-1 and pseudo-random targets.
Tensor ce_targets(int64_t t, int64_t v, DType dt) {
  std::vector<int64_t> y(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i)
    y[i] = i % 3 == 2 ? kIgnoreIndex : i % 5 == 0 ? 0 : i % 5 == 1 ? v - 1 : (i * 7919) % v;
  return with_index_dtype(y, dt);
}

::testing::AssertionResult all_equal(const Tensor& t, double v) {
  const Vec x = t.to_f64();
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i] != v) return ::testing::AssertionFailure() << "element " << i << " is " << x[i];
  return ::testing::AssertionSuccess();
}

void cross_entropy(std::vector<Entry>& t) {
  struct Case {
    DType dt;
    int64_t t, v;
    double std;
  };
  for (const Case c : {Case{DType::kF32, 1, 1, 1.0}, Case{DType::kBF16, 1, 1, 1.0},
                       Case{DType::kF32, 19, 19, 1.0}, Case{DType::kBF16, 19, 19, 3.0},
                       Case{DType::kF32, 71, 229, 3.0}, Case{DType::kBF16, 71, 229, 3.0},
                       Case{DType::kF16, 71, 229, 2.0}, Case{DType::kBF16, 33, 4864, 3.0},
                       Case{DType::kF32, 9, 151936, 3.0}, Case{DType::kBF16, 9, 151936, 3.0},
                       Case{DType::kF32, 19, 1001, 1000.0}, Case{DType::kF64, 19, 229, 3.0}}) {
    const std::string n = dt_name(c.dt) + "_" + shape_name({c.t, c.v}) + "_std" +
                          std::to_string(static_cast<int64_t>(c.std));
    const DType sd = stat_dtype(c.dt);
    t.push_back({"cross_entropy_fwd_bwd_" + n, [=](OpRun& r) {
                   const Tensor z = r.randn({c.t, c.v}, c.dt, 701, c.std);
                   // lse ~ log V + max; the loss is a difference of two such numbers.
                   const double mag = c.std + 12.0;
                   for (DType tdt : {DType::kI64, DType::kI32}) {
                     const std::string m = std::string("_") + dt_name(tdt);
                     const Tensor y = ce_targets(c.t, c.v, tdt);
                     Tensor loss = r.guarded({c.t}, sd), lse = r.guarded({c.t}, sd);
                     kernels::cross_entropy_fwd(z, r.on(y), loss, lse);
                     r.out("lse" + m, lse, Rule::close(backend_tol(sd, mag)));
                     r.out("loss" + m, loss, Rule::close(backend_tol(sd, 2 * mag)));
                     // Probabilities scaled by 0.37 (host targets).
                     Tensor d = r.guarded({c.t, c.v}, c.dt);
                     kernels::cross_entropy_bwd(z, y, lse, 0.37, d);
                     r.out("dlogits" + m, d, Rule::close(backend_tol(c.dt, 1e-2)));
                     // In place: dlogits overwrite the logits (the target's logit is read before
                     // its row is written).
                     Tensor zi = z.clone();
                     kernels::cross_entropy_bwd(zi, r.on(y), lse, 0.37, zi);
                     r.same("dlogits_in_place" + m, zi, "dlogits" + m);
                   }
                 }});
    t.push_back({"cross_entropy_autograd_" + n, [=](OpRun& r) {
                   Tensor z = r.randn({c.t, c.v}, c.dt, 711, c.std).set_requires_grad(true);
                   const Tensor loss =
                       kernels::cross_entropy(z, r.on(ce_targets(c.t, c.v, DType::kI64)), 40.0);
                   r.out("loss", loss.item(), Rule::close(backend_tol(DType::kF32)));
                   loss.backward();
                   r.out("dlogits", z.grad(), Rule::close(backend_tol(c.dt, 1e-3)));
                 }});
    t.push_back({"cross_entropy_bad_target_" + n, [=](OpRun& r) {
                   const Tensor z = r.randn({c.t, c.v}, c.dt, 721);
                   std::vector<int64_t> y(static_cast<size_t>(c.t), 0);
                   y.back() = c.v;
                   const Tensor yt = Tensor::from_vector(y, {c.t});
                   Tensor loss = Tensor::full({c.t}, 5.0, sd, r.dev());
                   Tensor lse = Tensor::full({c.t}, 5.0, sd, r.dev());
                   r.throws("target V (host targets)",
                            [&] { kernels::cross_entropy_fwd(z, yt, loss, lse); });
                   r.throws("target V (device targets)",
                            [&] { kernels::cross_entropy_fwd(z, r.on(yt), loss, lse); });
                   r.expect("loss untouched", all_equal(loss, 5.0));
                 }});
  }
  // Entropy and top-1 hit per row, from the host's lse.
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF64})
    for (auto [rows, v] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {19, 229}, {71, 4099}})
      t.push_back(
          {"cross_entropy_row_stats_" + dt_name(dt) + "_" + shape_name({rows, v}), [=](OpRun& r) {
             const Tensor z = host_randn({rows, v}, dt, 7 + rows, 2.0);
             std::vector<int64_t> y(static_cast<size_t>(rows));
             for (int64_t i = 0; i < rows; ++i) y[i] = i % 4 == 3 ? kIgnoreIndex : (i * 31) % v;
             const Tensor tg = Tensor::from_vector(y, {rows});
             const DType sd = stat_dtype(dt);
             Tensor loss = Tensor::empty({rows}, sd), lse = Tensor::empty({rows}, sd);
             kernels::cross_entropy_fwd(z, tg, loss, lse);
             Tensor ent = Tensor::empty({rows}, sd, r.dev());
             Tensor top = Tensor::empty({rows}, sd, r.dev());
             kernels::cross_entropy_row_stats(r.on(z), r.on(tg), r.on(lse), ent, top);
             r.out("entropy", ent, Rule::close(backend_tol(sd)));
             r.out("top1", top, Rule::exact());
           }});
}

// The merged lse and target logits over vocabulary blocks, then the block gradients in place
// (from the host's lse).
void vocab_blocks(std::vector<Entry>& t) {
  for (DType dt : {DType::kF32, DType::kF64})
    for (auto [rows, v, block] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
             {1, 1, 1}, {19, 229, 7}, {71, 229, 229}, {71, 229, 64}})
      t.push_back({"vocab_block_softmax_" + dt_name(dt) + "_" + shape_name({rows, v}) + "_block" +
                       std::to_string(block),
                   [=](OpRun& r) {
                     const Tensor z = host_randn({rows, v}, dt, 29 + rows, 3.0);
                     std::vector<int64_t> y(static_cast<size_t>(rows));
                     for (int64_t i = 0; i < rows; ++i)
                       y[i] = i % 3 == 2 ? kIgnoreIndex : (i * 53) % v;
                     const Tensor tg = Tensor::from_vector(y, {rows});
                     auto block_of = [&](int64_t v0) {
                       return z.narrow(1, v0, std::min(block, v - v0)).contiguous();
                     };
                     Tensor host_lse = Tensor::full({rows}, -INFINITY, dt);
                     Tensor host_zy = Tensor::zeros({rows}, dt);
                     Tensor lse = r.on(host_lse), zy = r.on(host_zy);
                     for (int64_t v0 = 0; v0 < v; v0 += block) {
                       kernels::vocab_block_lse_update(block_of(v0), tg, v0, host_lse, host_zy);
                       kernels::vocab_block_lse_update(r.on(block_of(v0)), r.on(tg), v0, lse, zy);
                     }
                     r.out("lse", lse, Rule::close(backend_tol(dt)));
                     r.out("target_logit", zy, Rule::exact());
                     for (int64_t v0 = 0; v0 < v; v0 += block) {
                       Tensor zb = r.on(block_of(v0));
                       kernels::vocab_block_softmax_grad(zb, r.on(tg), v0, r.on(host_lse), 0.5, zb);
                       r.out("grad_block" + std::to_string(v0), zb, Rule::close(backend_tol(dt)));
                     }
                   }});
}

// ---------------------------------------------------------------- linear_cross_entropy

// Targets cycling through 0, V-1 and pseudo-random ids; every `ignore_every`-th row ignored.
Tensor lce_targets(int64_t t, int64_t v, int ignore_every, DType dt = DType::kI64) {
  std::vector<int64_t> y(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) {
    if (ignore_every > 0 && i % ignore_every == ignore_every - 1)
      y[i] = kIgnoreIndex;
    else
      y[i] = i % 5 == 0 ? 0 : i % 5 == 1 ? v - 1 : (i * 7919 + 13) % v;
  }
  return with_index_dtype(y, dt);
}

int64_t count_valid(const Tensor& y) {
  int64_t n = 0;
  for (int64_t v : y.to_i64()) n += v != kIgnoreIndex;
  return n;
}

DType grad_dtype(DType dt) { return stat_dtype(dt); }

// The loss sums one row's loss per valid row.
Rule loss_rule(DType dt, int64_t valid) {
  return Rule::close(backend_sum_tol(dt, static_cast<double>(valid + 1)));
}

// A gradient held in a 16-bit weight's dtype is rounded into it once per chunk of valid rows: the
// error grows about as the square root of the number of chunks.
Rule input_dtype_dweight_rule(DType dt, int64_t valid, int64_t chunk) {
  const double chunks = std::max(1.0, std::ceil(double(valid) / double(chunk)));
  return Rule::norm(backend_norm_tol(dt) * (1.0 + 0.27 * std::sqrt(chunks)));
}

::testing::AssertionResult ignored_rows_zero(const Tensor& dh, const Tensor& y) {
  const std::vector<int64_t> yy = y.to_i64();
  const Vec d = dh.to_f64();
  const int64_t h = dh.size(1);
  for (size_t i = 0; i < yy.size(); ++i)
    if (yy[i] == kIgnoreIndex)
      for (int64_t j = 0; j < h; ++j)
        if (d[i * h + j] != 0.0)
          return ::testing::AssertionFailure() << "ignored row " << i << ": " << d[i * h + j];
  return ::testing::AssertionSuccess();
}

void linear_cross_entropy(std::vector<Entry>& t) {
  struct Case {
    DType dt;
    int64_t t, h, v, chunk;
    int ignore_every;  // every n-th row ignored (0: none)
  };
  for (const Case c :
       {Case{DType::kBF16, 1, 8, 5, 1024, 0}, Case{DType::kF32, 19, 32, 229, 7, 3},
        Case{DType::kBF16, 71, 64, 1001, 16, 3}, Case{DType::kBF16, 300, 128, 4096, 1024, 0},
        Case{DType::kBF16, 257, 96, 2053, 64, 4}, Case{DType::kF16, 65, 64, 512, 32, 2},
        Case{DType::kF32, 130, 64, 3000, 64, 0}, Case{DType::kF64, 23, 16, 97, 5, 3},
        Case{DType::kBF16, 40, 256, 151936, 1 << 20, 5}}) {
    const std::string n = dt_name(c.dt) + "_" + shape_name({c.t, c.h, c.v}) + "_chunk" +
                          std::to_string(c.chunk) + "_ignore" + std::to_string(c.ignore_every);
    const DType gd = grad_dtype(c.dt);
    const Rule grad_rule = Rule::norm(backend_norm_tol(c.dt));
    t.push_back({"linear_cross_entropy_" + n, [=](OpRun& r) {
                   const Tensor x = r.randn({c.t, c.h}, c.dt, 801);
                   const Tensor w = r.randn({c.v, c.h}, c.dt, 802, 0.08);
                   const Tensor dw0 = host_randn({c.v, c.h}, gd, 803, 0.01);
                   const Tensor y = lce_targets(c.t, c.v, c.ignore_every);
                   kernels::LinearCrossEntropyOptions opt;
                   opt.chunk_tokens = c.chunk;
                   for (bool device_targets : {false, true}) {
                     const std::string m = device_targets ? "_device_targets" : "_host_targets";
                     Tensor dh = r.guarded({c.t, c.h}, c.dt);
                     dh.fill_(7.0);  // ignored rows must be zeroed, not left alone
                     Tensor dw = r.guarded({c.v, c.h}, gd);
                     dw.copy_(dw0);
                     const double loss = kernels::linear_cross_entropy_fwd_bwd(
                         x, w, device_targets ? r.on(y) : y, 0.37, dh, dw, opt);
                     r.out("loss" + m, loss, loss_rule(c.dt, count_valid(y)));
                     r.out("dhidden" + m, dh, grad_rule);
                     // The accumulated part alone (dw - dw0) carries the comparison.
                     r.out("dweight_added" + m, ops::sub(dw.to(Device::cpu()), dw0), grad_rule);
                     r.expect("ignored rows of dhidden are 0" + m, ignored_rows_zero(dh, y));
                     if (device_targets || (c.dt != DType::kBF16 && c.dt != DType::kF16)) continue;
                     // 16-bit: also flash-attention's rule against the CPU op in f64 on the same
                     // rounded inputs, with the same-dtype naive loss as the yardstick.
                     if (r.reference()) {
                       const Tensor x64 = x.to(DType::kF64), w64 = w.to(DType::kF64);
                       dh = Tensor::empty({c.t, c.h}, DType::kF64);
                       dw = Tensor::zeros({c.v, c.h}, DType::kF64);
                       kernels::linear_cross_entropy_fwd_bwd(x64, w64, y, 0.37, dh, dw, opt);
                     }
                     auto naive = std::make_shared<NaiveLinearCrossEntropy>();
                     auto compute = [=] {
                       if (naive->dhidden.empty())
                         *naive = naive_linear_cross_entropy(x, w, y.to_i64(), 0.37, c.dt);
                     };
                     r.out("dhidden_vs_f64", dh, Rule::flash([=] {
                             compute();
                             return naive->dhidden;
                           }));
                     r.out("dweight_added_vs_f64",
                           r.reference() ? dw : ops::sub(dw.to(Device::cpu()), dw0),
                           Rule::flash([=] {
                             compute();
                             return naive->dweight;
                           }));
                   }
                 }});
    // Loss only, one gradient only, dweight in the input dtype or as a non-contiguous view; the
    // reference is the full computation (f32 dweight) in every case.
    t.push_back(
        {"linear_cross_entropy_partial_" + n, [=](OpRun& r) {
           const Tensor x = r.randn({c.t, c.h}, c.dt, 811);
           const Tensor w = r.randn({c.v, c.h}, c.dt, 812, 0.08);
           const Tensor y = lce_targets(c.t, c.v, c.ignore_every, DType::kI32);
           kernels::LinearCrossEntropyOptions opt;
           opt.chunk_tokens = c.chunk;
           const Rule loss = loss_rule(c.dt, count_valid(y));
           const Rule dw16 = input_dtype_dweight_rule(c.dt, count_valid(y), c.chunk);
           if (r.reference()) {
             Tensor dh = Tensor::empty({c.t, c.h}, c.dt);
             Tensor dw = Tensor::zeros({c.v, c.h}, gd);
             const double l = kernels::linear_cross_entropy_fwd_bwd(x, w, y, 1.0, dh, dw, opt);
             r.out("loss_only", l, loss);
             r.out("loss_with_dhidden", l, loss);
             r.out("dhidden_only", dh, grad_rule);
             if (c.dt != DType::kF64) r.out("dweight_input_dtype", dw, dw16);
             r.out("dweight_transposed_view", dw, grad_rule);
             if (c.dt == DType::kBF16 || c.dt == DType::kF16)
               r.out("dhidden_f32", dh.to(DType::kF32), grad_rule);
             return;
           }
           r.out("loss_only",
                 kernels::linear_cross_entropy_fwd_bwd(x, w, y, 1.0, Tensor(), Tensor(), opt),
                 loss);
           Tensor dh = Tensor::empty({c.t, c.h}, c.dt, r.dev());
           r.out("loss_with_dhidden",
                 kernels::linear_cross_entropy_fwd_bwd(x, w, y, 1.0, dh, Tensor(), opt), loss);
           r.out("dhidden_only", dh, grad_rule);
           if (c.dt != DType::kF64) {
             Tensor dw = Tensor::zeros({c.v, c.h}, c.dt, r.dev());
             kernels::linear_cross_entropy_fwd_bwd(x, w, y, 1.0, Tensor(), dw, opt);
             r.out("dweight_input_dtype", dw, dw16);
           }
           const Tensor dwt = Tensor::zeros({c.h, c.v}, gd, r.dev()).transpose(0, 1);
           kernels::linear_cross_entropy_fwd_bwd(x, w, y, 1.0, Tensor(), dwt, opt);
           r.out("dweight_transposed_view", dwt, grad_rule);
           if (c.dt == DType::kBF16 || c.dt == DType::kF16) {
             Tensor dh32 = Tensor::empty({c.t, c.h}, DType::kF32, r.dev());
             kernels::linear_cross_entropy_fwd_bwd(x, w, y, 1.0, dh32, Tensor(), opt);
             r.out("dhidden_f32", dh32, grad_rule);
           }
         }});
  }
  // Row statistics (opt.stats: TRL's SFT entropy and top-1 share): the loss and dhidden are
  // bit for bit those without them; on the CPU the sums equal those of the full f64 logits.
  for (const Case c :
       {Case{DType::kF32, 19, 32, 229, 7, 3}, Case{DType::kBF16, 71, 64, 1001, 16, 3},
        Case{DType::kF64, 23, 16, 97, 5, 3}, Case{DType::kBF16, 1, 8, 5, 1024, 0}}) {
    const std::string n =
        dt_name(c.dt) + "_" + shape_name({c.t, c.h, c.v}) + "_chunk" + std::to_string(c.chunk);
    t.push_back({"linear_cross_entropy_stats_" + n, [=](OpRun& r) {
                   const Tensor x = r.randn({c.t, c.h}, c.dt, 851);
                   const Tensor w = r.randn({c.v, c.h}, c.dt, 852, 0.3);
                   const Tensor y = lce_targets(c.t, c.v, c.ignore_every);
                   const int64_t valid = count_valid(y);
                   kernels::LinearCrossEntropyOptions opt;
                   opt.chunk_tokens = c.chunk;
                   kernels::LinearCrossEntropyStats st;
                   opt.stats = &st;
                   Tensor dh = Tensor::empty({c.t, c.h}, c.dt, r.dev());
                   const double with =
                       kernels::linear_cross_entropy_fwd_bwd(x, w, y, 1.0, dh, Tensor(), opt);
                   opt.stats = nullptr;
                   Tensor dh0 = Tensor::empty({c.t, c.h}, c.dt, r.dev());
                   const double without =
                       kernels::linear_cross_entropy_fwd_bwd(x, w, y, 1.0, dh0, Tensor(), opt);
                   r.expect("loss unchanged by stats", ::testing::AssertionResult(with == without));
                   r.keep("dhidden_without_stats", dh0);
                   r.same("dhidden", dh, "dhidden_without_stats", Rule::bits());
                   r.out("entropy_sum", st.entropy_sum, loss_rule(c.dt, valid));
                   r.out("top1", static_cast<double>(st.top1), Rule::close({0.5, 0.0}));
                   if (!r.reference() && r.cuda()) return;
                   // The full logits in f64, their rows' statistics summed over the valid rows.
                   const Tensor x64 = x.to(Device::cpu()).to(DType::kF64);
                   const Tensor w64 = w.to(Device::cpu()).to(DType::kF64);
                   const Tensor z = ops::matmul(x64, w64, false, true);
                   Tensor rows = Tensor::empty({c.t}, DType::kF64), lse = rows.clone();
                   Tensor ent = rows.clone(), top = rows.clone();
                   kernels::cross_entropy_fwd(z, y, rows, lse);
                   kernels::cross_entropy_row_stats(z, y, lse, ent, top);
                   double e = 0, hits = 0;
                   const std::vector<int64_t> yy = y.to_i64();
                   const Vec ev = ent.to_f64(), tv = top.to_f64();
                   for (int64_t i = 0; i < c.t; ++i)
                     if (yy[i] != kIgnoreIndex) e += ev[i], hits += tv[i];
                   const testing::Tol tl = backend_sum_tol(c.dt, static_cast<double>(valid + 1));
                   r.expect("entropy_sum of the full f64 logits",
                            ::testing::AssertionResult(std::abs(st.entropy_sum - e) <=
                                                       tl.atol + tl.rtol * std::abs(e))
                                << st.entropy_sum << " vs " << e);
                   r.expect("top1 of the full f64 logits",
                            ::testing::AssertionResult(static_cast<double>(st.top1) == hits)
                                << st.top1 << " vs " << hits);
                 }});
  }
  t.push_back({"linear_cross_entropy_all_ignored_bf16_9x32x100", [](OpRun& r) {
                 const Tensor x = r.randn({9, 32}, DType::kBF16, 821);
                 const Tensor w = r.randn({100, 32}, DType::kBF16, 822);
                 const Tensor y = Tensor::full({9}, double(kIgnoreIndex), DType::kI64);
                 Tensor dh = Tensor::full({9, 32}, 3.0, DType::kBF16, r.dev());
                 Tensor dw = Tensor::full({100, 32}, 0.5, DType::kF32, r.dev());
                 const double loss =
                     kernels::linear_cross_entropy_fwd_bwd(x, w, y, 1.0, dh, dw, {});
                 r.out("loss", loss, Rule::exact());
                 r.expect("zero loss", ::testing::AssertionResult(loss == 0.0));
                 r.expect("dhidden all 0", all_equal(dh, 0.0));
                 r.expect("dweight untouched", all_equal(dw, 0.5));
               }});
  t.push_back({"linear_cross_entropy_bad_target_bf16_6x16x50", [](OpRun& r) {
                 const Tensor x = r.randn({6, 16}, DType::kBF16, 831);
                 const Tensor w = r.randn({50, 16}, DType::kBF16, 832);
                 const Tensor y =
                     Tensor::from_vector(std::vector<int64_t>{1, 2, kIgnoreIndex, 50, 3, 4}, {6});
                 Tensor dw = Tensor::full({50, 16}, 0.25, DType::kF32, r.dev());
                 r.throws("target V (host targets)", [&] {
                   kernels::linear_cross_entropy_fwd_bwd(x, w, y, 1.0, Tensor(), dw, {});
                 });
                 r.throws("target V (device targets)", [&] {
                   kernels::linear_cross_entropy_fwd_bwd(x, w, r.on(y), 1.0, Tensor(), dw, {});
                 });
                 r.expect("dweight untouched", all_equal(dw, 0.25));
               }});
  // Chunking changes nothing beyond rounding: the same rows, per-row math and summation.
  t.push_back({"linear_cross_entropy_chunking_f32_333x64x777", [](OpRun& r) {
                 const Tensor x = r.randn({333, 64}, DType::kF32, 841);
                 const Tensor w = r.randn({777, 64}, DType::kF32, 842, 0.1);
                 const Tensor y = lce_targets(333, 777, 4);
                 const Rule grad = Rule::norm(backend_norm_tol(DType::kF32));
                 for (int64_t chunk : {int64_t{1} << 20, int64_t{13}}) {
                   const std::string m = "_chunk" + std::to_string(chunk);
                   Tensor dh = Tensor::empty({333, 64}, DType::kF32, r.dev());
                   Tensor dw = Tensor::zeros({777, 64}, DType::kF32, r.dev());
                   const double l =
                       kernels::linear_cross_entropy_fwd_bwd(x, w, y, 1.0, dh, dw, {chunk});
                   if (chunk != 13) {
                     r.out("loss" + m, l, loss_rule(DType::kF32, count_valid(y)));
                     r.out("dhidden" + m, dh, grad);
                     r.out("dweight" + m, dw, grad);
                   } else {
                     const std::string one = "_chunk" + std::to_string(int64_t{1} << 20);
                     r.same("loss" + m, l, "loss" + one,
                            Rule::close(testing::backend_repeat_tol(DType::kF32, 0.0)));
                     r.same("dhidden" + m, dh, "dhidden" + one, grad);
                     r.same("dweight" + m, dw, "dweight" + one, grad);
                   }
                 }
               }});
  // Gemma's final logit soft-capping inside the chunks: wide logits (std 8) capped at 3, the raw
  // op and the autograd op (the weight's gradient in its own dtype).
  for (DType dt : {DType::kF32, DType::kBF16})
    t.push_back(
        {"linear_cross_entropy_softcap_" + dt_name(dt) + "_71x64x1000_chunk16", [=](OpRun& r) {
           const Tensor x = r.randn({71, 64}, dt, 501, 2.0);
           const Tensor w = r.randn({1000, 64}, dt, 502, 0.5);
           std::vector<int64_t> tg(71);
           for (int64_t i = 0; i < 71; ++i) tg[i] = i % 5 == 0 ? kIgnoreIndex : (i * 37) % 1000;
           const Tensor y = r.on(Tensor::from_vector(tg, {71}));
           const int64_t valid = count_valid(y);
           kernels::LinearCrossEntropyOptions opt;
           opt.chunk_tokens = 16;
           opt.softcap = 3.0;
           const Rule grad = Rule::norm(backend_norm_tol(dt));
           Tensor dh = r.guarded({71, 64}, dt);
           dh.fill_(7.0);  // ignored rows must be zeroed
           Tensor dw = r.guarded({1000, 64}, grad_dtype(dt));
           dw.fill_(0.0);
           r.out("loss", kernels::linear_cross_entropy_fwd_bwd(x, w, y, 0.37, dh, dw, opt),
                 loss_rule(dt, valid));
           r.out("dhidden", dh, grad);
           r.out("dweight", dw, grad);
           r.expect("ignored rows of dhidden are 0", ignored_rows_zero(dh, y));
           Tensor xa = x.clone().set_requires_grad(true), wa = w.clone().set_requires_grad(true);
           const Tensor loss = kernels::linear_cross_entropy(xa, wa, y, 7.0, opt);
           r.out("loss_autograd", loss.item(), loss_rule(dt, valid));
           loss.backward();
           r.out("dhidden_autograd", xa.grad(), grad);
           r.out("dweight_autograd", wa.grad(), input_dtype_dweight_rule(dt, valid, 16));
         }});
  t.push_back({"linear_cross_entropy_autograd_bf16_47x64x503", [](OpRun& r) {
                 Tensor x = r.randn({47, 64}, DType::kBF16, 851).set_requires_grad(true);
                 Tensor w = r.randn({503, 64}, DType::kBF16, 852, 0.08).set_requires_grad(true);
                 const Tensor y = lce_targets(47, 503, 3);
                 const Tensor loss = kernels::linear_cross_entropy(x, w, r.on(y), 40.0);
                 r.out("loss", loss.item(), loss_rule(DType::kBF16, count_valid(y)));
                 loss.backward();
                 r.out("dhidden", x.grad(), Rule::norm(backend_norm_tol(DType::kBF16)));
                 r.out("dweight", w.grad(), Rule::norm(backend_norm_tol(DType::kBF16)));
               }});
}

// ---------------------------------------------------------------- linear_divergence

void linear_divergence(std::vector<Entry>& t) {
  struct Case {
    const char* name;
    DType sd, td;  // the student's and the teacher's dtypes
    int64_t n, hs, ht, v, chunk_tokens, chunk_vocab;
    double beta, temperature, softcap;  // softcap: both models'
  };
  for (const Case& c :
       {Case{"jsd", DType::kF32, DType::kF32, 1, 8, 8, 5, 1024, 1 << 15, 0.5, 1.0, 0.0},
        Case{"forward_kl", DType::kF32, DType::kF32, 19, 32, 32, 229, 7, 64, 0.0, 1.0, 0.0},
        Case{"reverse_kl_t2", DType::kBF16, DType::kBF16, 71, 64, 64, 1001, 16, 256, 1.0, 2.0, 0.0},
        Case{"jsd_wide_teacher", DType::kBF16, DType::kBF16, 257, 64, 96, 2053, 64, 512, 0.5, 1.0,
             0.0},
        Case{"jsd_softcap", DType::kBF16, DType::kBF16, 71, 64, 64, 1000, 16, 300, 0.3, 0.7, 3.0},
        Case{"jsd_f16", DType::kF16, DType::kF16, 65, 64, 64, 512, 32, 128, 0.5, 1.0, 0.0},
        Case{"forward_kl_f32_teacher", DType::kBF16, DType::kF32, 40, 64, 48, 1000, 1024, 1 << 15,
             0.0, 1.0, 0.0},
        Case{"jsd_f64", DType::kF64, DType::kF64, 23, 16, 16, 97, 5, 13, 0.3, 1.5, 2.0},
        Case{"reverse_kl_qwen_vocab", DType::kBF16, DType::kBF16, 9, 128, 128, 151936, 1024, 32768,
             1.0, 1.0, 0.0}}) {
    const std::string n = std::string(c.name) + "_" + dt_name(c.sd) + "_" +
                          shape_name({c.n, c.hs, c.v}) + "_chunk" + std::to_string(c.chunk_tokens) +
                          "x" + std::to_string(c.chunk_vocab);
    t.push_back(
        {"linear_divergence_" + n, [=](OpRun& r) {
           const Tensor xs = r.randn({c.n, c.hs}, c.sd, 901);
           const Tensor ws = r.randn({c.v, c.hs}, c.sd, 902, 0.1);
           const Tensor xt = r.randn({c.n, c.ht}, c.td, 903);
           const Tensor wt = r.randn({c.v, c.ht}, c.td, 904, 0.1);
           std::vector<int64_t> mask(static_cast<size_t>(c.n));
           std::vector<double> coef(mask.size());
           for (int64_t i = 0; i < c.n; ++i) {
             mask[i] = c.n == 1 || i % 4 != 3;
             coef[i] = 0.25 + 0.5 * static_cast<double>((i * 37) % 11) / 11.0;
           }
           const Tensor m = Tensor::from_vector(mask, {c.n});
           kernels::LinearDivergenceOptions opt;
           opt.beta = c.beta;
           opt.temperature = c.temperature;
           opt.student_softcap = opt.teacher_softcap = c.softcap;
           opt.chunk_tokens = c.chunk_tokens;
           opt.chunk_vocab = c.chunk_vocab;
           const DType od = c.sd == DType::kF64 ? DType::kF64 : DType::kF32;
           // The divergence is a difference of two log-sum-exps of size ~ log V + 12.
           const double mag = 2 * (std::log(static_cast<double>(c.v)) + 12);
           auto run = [&](const Tensor& a, const Tensor& b, const Tensor& ta, const Tensor& tb) {
             Tensor x = a.clone().set_requires_grad(true);
             Tensor w = b.clone().set_requires_grad(true);
             const kernels::LinearDivergence out =
                 kernels::linear_divergence(x, w, ta, tb, r.on(m), opt);
             const DType gd = out.divergence.dtype();
             out.divergence.backward(r.on(Tensor::from_vector(coef, {c.n}).to(gd)));
             return std::make_tuple(out, x.grad(), w.grad());
           };
           kernels::LinearDivergence out;
           Tensor dx, dw;
           std::tie(out, dx, dw) = run(xs, ws, xt, wt);
           r.out("divergence", out.divergence, Rule::close(backend_tol(od, mag)));
           r.out("entropy", out.entropy, Rule::close(backend_tol(od, mag)));
           r.out("dhidden", dx, Rule::norm(backend_norm_tol(c.sd)));
           r.out("dweight", dw, Rule::norm(backend_norm_tol(c.sd)));
           r.expect("divergence is 0 on masked rows and >= 0 elsewhere", [&] {
             const Vec d = out.divergence.to_f64();
             for (size_t i = 0; i < d.size(); ++i)
               if (mask[i] == 0 ? d[i] != 0.0 : d[i] < -1e-5)
                 return ::testing::AssertionFailure() << "row " << i << ": " << d[i];
             return ::testing::AssertionSuccess();
           }());
           r.expect("dhidden is 0 on masked rows", [&] {
             const Vec g = dx.to_f64();
             for (int64_t i = 0; i < c.n; ++i)
               for (int64_t k = 0; mask[i] == 0 && k < c.hs; ++k)
                 if (g[i * c.hs + k] != 0.0)
                   return ::testing::AssertionFailure() << "row " << i << ": " << g[i * c.hs + k];
             return ::testing::AssertionSuccess();
           }());
           if (c.softcap != 0 || (c.sd != DType::kBF16 && c.sd != DType::kF16) || c.td != c.sd)
             return;
           // 16-bit: flash-attention's rule for dhidden against the op in f64 on the same
           // rounded inputs, with the same-dtype naive loss as the yardstick.
           Tensor dx_rule = dx;
           if (r.reference())
             dx_rule = std::get<1>(run(xs.to(DType::kF64), ws.to(DType::kF64), xt.to(DType::kF64),
                                       wt.to(DType::kF64)));
           r.out("dhidden_vs_f64", dx_rule, Rule::flash([=] {
                   return naive_linear_divergence(xs, ws, xt, wt, mask, c.beta, c.temperature, coef,
                                                  c.sd)
                       .dhidden;
                 }));
         }});
  }
  // No row counts: every output is exactly 0 on both devices.
  t.push_back({"linear_divergence_all_masked_bf16_19x32x229", [](OpRun& r) {
                 Tensor x = r.randn({19, 32}, DType::kBF16, 911).set_requires_grad(true);
                 Tensor w = r.randn({229, 32}, DType::kBF16, 912, 0.1).set_requires_grad(true);
                 const Tensor xt = r.randn({19, 48}, DType::kBF16, 913);
                 const Tensor wt = r.randn({229, 48}, DType::kBF16, 914, 0.1);
                 const Tensor m = r.on(Tensor::zeros({19}, DType::kI64));
                 const kernels::LinearDivergence out = kernels::linear_divergence(x, w, xt, wt, m);
                 r.out("divergence", out.divergence, Rule::exact());
                 r.out("entropy", out.entropy, Rule::exact());
                 out.divergence.backward(r.on(Tensor::full({19}, 1.0, DType::kF32)));
                 r.out("dhidden", x.grad(), Rule::exact());
                 r.out("dweight", w.grad(), Rule::exact());
               }});
}

}  // namespace

std::vector<Entry> loss_entries() {
  std::vector<Entry> t;
  cross_entropy(t);
  vocab_blocks(t);
  linear_cross_entropy(t);
  linear_divergence(t);
  return t;
}

}  // namespace leantune::backend_test
