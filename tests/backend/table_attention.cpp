// Table rows for varlen attention (kernels/attention.cu). The reference run is the CPU op on the
// same inputs converted to f64 (out, lse, dq, dk, dv). bf16/f16 outputs are held to
// flash-attention's rule against the naive same-dtype computation (naive.h); f32 and
// f64 (the simple kernel) to the normwise row of the table; lse elementwise. Outputs go into
// guard-banded buffers, so rows a kernel forgot to write fail; rows that see no key and rows
// outside every sequence must be exactly 0. The CPU self-check runs the CPU op in the input
// dtype where the device runs, held to the same rule.
// Cases: sequences of length 0 and 1, many short and a few long sequences, GQA ratios 1, 2, 4, 7
// (Qwen2.5-0.5B's) and 8, head_dim 64 and 128 (96: the fallback), decode-style Lq < Lk and
// Lq > Lk (rows that see nothing), non-causal, rows after the last sequence, sliding windows
// (Mistral, Gemma, Phi-3: shorter and longer than the tiles, of 1, in the KV-cache decode) and
// soft-capped scores (Gemma: the simple kernels, f32 and f64); and per case, host
// and device cu_seqlens (i32 and i64), missing and too-small max_seqlen hints, strided and
// misaligned q and outputs (equal to the plain call); the 4-warp head_dim-128 backward; argument
// errors; bitwise repeatability; rows before the first sequence.
// Two CUDA implementations keep this contract (kernels/attention.cu): the rows above force
// leantune's own kernels (LEANTUNE_ATTENTION=own); the attention_cudnn_* rows run every case
// inside cuDNN's surface (one cu_seqlens for queries and keys, bf16/f16, head_dim <= 128, no
// soft-cap) through cuDNN's fused attention, held to the same references, checked to have run
// on cuDNN, and compared with our kernels on the same inputs (skipped where cuDNN is absent).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "backend/naive.h"
#include "backend/table.h"
#include "engine/check.h"
#include "kernels/attention.h"

namespace leantune::backend_test {
namespace {

using testing::backend_tol;

struct Case {
  std::string name;
  DType dt;
  int64_t hq, hk, d;
  std::vector<int64_t> lq;
  std::vector<int64_t> lk = {};  // empty: same as lq
  bool causal = true;
  int64_t tail_q = 0, tail_k = 0;  // rows after the last sequence
  int64_t window = 0;              // sliding window (0: none)
  double softcap = 0;              // score soft-cap (0: off; the naive yardstick has none)
};

struct Problem {
  Case c;
  std::vector<int64_t> cq, ck;  // cu_seqlens
  int64_t tq = 0, tk = 0;
  Tensor q, k, v, dout;  // host, dtype c.dt
};

Problem make_problem(const Case& c, uint64_t seed, int64_t lead_q = 0, int64_t lead_k = 0) {
  Problem p;
  p.c = c;
  const std::vector<int64_t>& lk = c.lk.empty() ? c.lq : c.lk;
  p.cq = {lead_q};
  p.ck = {lead_k};
  for (size_t b = 0; b < c.lq.size(); ++b) {
    p.cq.push_back(p.cq.back() + c.lq[b]);
    p.ck.push_back(p.ck.back() + lk[b]);
  }
  p.tq = p.cq.back() + c.tail_q;
  p.tk = p.ck.back() + c.tail_k;
  p.q = testing::randn({p.tq, c.hq, c.d}, c.dt, seed);
  p.k = testing::randn({p.tk, c.hk, c.d}, c.dt, seed + 1);
  p.v = testing::randn({p.tk, c.hk, c.d}, c.dt, seed + 2);
  p.dout = testing::randn({p.tq, c.hq, c.d}, c.dt, seed + 3);
  return p;
}

Tensor cu_tensor(const std::vector<int64_t>& cu, DType dt) {
  const Tensor t = Tensor::from_vector(cu, {static_cast<int64_t>(cu.size())});
  return dt == DType::kI64 ? t : t.to(dt);
}

struct Options {
  bool device_cu = true;
  DType cu_dt = DType::kI32;
  int hint = 1;            // 1: exact max_seqlen, 0: none, -1: too small (1)
  int64_t out_guard = 64;  // odd values misalign out/lse/grads (the copy fallback)
  kernels::AttentionBackend backend = kernels::AttentionBackend::kAuto;
};

struct Result {
  Tensor out, lse, dq, dk, dv;
};

// Forward and backward on r.dev() into guarded buffers (q given: it may be a strided view).
Result run_op(OpRun& r, const Problem& p, const Options& o, const Tensor& q) {
  const Case& c = p.c;
  kernels::AttentionOptions opt;
  opt.backend = o.backend;
  opt.causal = c.causal;
  opt.window = c.window;
  opt.softcap = c.softcap;
  if (o.hint != 0) {
    int64_t mq = 0, mk = 0;
    for (size_t b = 0; b + 1 < p.cq.size(); ++b) {
      mq = std::max(mq, p.cq[b + 1] - p.cq[b]);
      mk = std::max(mk, p.ck[b + 1] - p.ck[b]);
    }
    opt.max_seqlen_q = o.hint > 0 ? std::max<int64_t>(mq, 1) : 1;
    opt.max_seqlen_k = o.hint > 0 ? std::max<int64_t>(mk, 1) : 1;
    // The rows inside sequences, as the model passes them (cuDNN's dense graph needs it).
    if (o.hint > 0 && p.cq.back() == p.ck.back()) opt.total_seqlen = p.cq.back();
  }
  // One tensor for queries and keys when their sequences coincide, as the model passes them.
  Tensor cq = cu_tensor(p.cq, o.cu_dt), ck = cu_tensor(p.ck, o.cu_dt);
  if (o.device_cu) {
    cq = r.on(cq);
    ck = r.on(ck);
  }
  if (p.cq == p.ck) ck = cq;
  const Tensor k = r.on(p.k), v = r.on(p.v), g = r.on(p.dout);
  Result res;
  res.out = r.guarded(p.q.shape(), c.dt, o.out_guard);
  res.lse = r.guarded({c.hq, p.tq}, stat_dtype(c.dt), o.out_guard);
  kernels::attention_fwd(q, k, v, cq, ck, opt, res.out, res.lse);
  res.dq = r.guarded(p.q.shape(), c.dt, o.out_guard);
  res.dk = r.guarded(p.k.shape(), c.dt, o.out_guard);
  res.dv = r.guarded(p.v.shape(), c.dt, o.out_guard);
  kernels::attention_bwd(g, q, k, v, res.out, res.lse, cq, ck, opt, res.dq, res.dk, res.dv);
  return res;
}

// The CPU op in f64 on the same (rounded) inputs.
Result reference64(OpRun& r, const Problem& p) {
  Problem p64 = p;
  for (Tensor* t : {&p64.q, &p64.k, &p64.v, &p64.dout}) *t = t->to(DType::kF64);
  p64.c.dt = DType::kF64;
  return run_op(r, p64, Options{false, DType::kI64, 0}, p64.q);
}

// Rows that see no key (out, dq exactly 0) and rows outside every sequence (dk, dv too).
::testing::AssertionResult silent_rows_are_zero(const Problem& p, const Result& res) {
  const Case& c = p.c;
  const Vec out = res.out.to_f64(), dq = res.dq.to_f64(), dk = res.dk.to_f64(),
            dv = res.dv.to_f64();
  const int64_t row_q = c.hq * c.d, row_k = c.hk * c.d;
  std::vector<bool> silent_q(static_cast<size_t>(p.tq), true), silent_k(p.tk, true);
  for (size_t b = 0; b + 1 < p.cq.size(); ++b) {
    const int64_t lq = p.cq[b + 1] - p.cq[b], lk = p.ck[b + 1] - p.ck[b];
    for (int64_t i = 0; i < lq; ++i)
      silent_q[p.cq[b] + i] = (c.causal ? std::clamp<int64_t>(i + lk - lq + 1, 0, lk) : lk) == 0;
    for (int64_t j = 0; j < lk; ++j) silent_k[p.ck[b] + j] = false;
  }
  for (int64_t i = 0; i < p.tq; ++i)
    for (int64_t e = 0; silent_q[i] && e < row_q; ++e)
      if (out[i * row_q + e] != 0.0 || dq[i * row_q + e] != 0.0)
        return ::testing::AssertionFailure() << "query row " << i << " sees no key: out "
                                             << out[i * row_q + e] << ", dq " << dq[i * row_q + e];
  for (int64_t j = 0; j < p.tk; ++j)
    for (int64_t e = 0; silent_k[j] && e < row_k; ++e)
      if (dk[j * row_k + e] != 0.0 || dv[j * row_k + e] != 0.0)
        return ::testing::AssertionFailure() << "key row " << j << " is in no sequence: dk "
                                             << dk[j * row_k + e] << ", dv " << dv[j * row_k + e];
  return ::testing::AssertionSuccess();
}

// Records out, lse, dq, dk, dv against the references; returns what the run computed.
Result record_against_references(OpRun& r, const Problem& p) {
  const DType dt = p.c.dt;
  const bool low = dt == DType::kBF16 || dt == DType::kF16;
  const Result res = r.reference() ? reference64(r, p) : run_op(r, p, Options{}, r.on(p.q));
  r.expect("silent rows are 0", silent_rows_are_zero(p, res));
  // lse in f32 from the same rounded inputs agrees with f64 to ~1e-6 relative.
  r.out("lse", res.lse, Rule::close(backend_tol(stat_dtype(dt), 20.0)));
  if (!low) {
    for (auto [name, t] : {std::pair{"out", res.out}, std::pair{"dq", res.dq},
                           std::pair{"dk", res.dk}, std::pair{"dv", res.dv}})
      r.out(name, t, Rule::within(testing::backend_norm_tol(dt)));
    return res;
  }
  LT_CHECK(p.c.softcap == 0.0, "attention case ", p.c.name,
           ": no naive yardstick for soft-capped 16-bit scores");
  NaiveAttention naive;
  if (r.reference()) {
    naive = naive_attention(p.q, p.k, p.v, p.dout, p.cq, p.ck, p.c.causal, dt, p.c.window);
    // The naive computation is a real yardstick: it differs from ref64 by 16-bit rounding (in
    // some output: with a window of 1 each row averages one value, out exact on both sides).
    const bool differs = naive.out != res.out.to_f64() || naive.dq != res.dq.to_f64() ||
                         naive.dk != res.dk.to_f64() || naive.dv != res.dv.to_f64();
    r.expect("naive differs from the f64 reference", ::testing::AssertionResult(differs));
  }
  r.out("out", res.out, Rule::flash([v = naive.out] { return v; }));
  r.out("dv", res.dv, Rule::flash([v = naive.dv] { return v; }));
  // With a window of 1 every row sees one key: its softmax is constant, so dq and dk vanish
  // identically (0 in the naive and the f64 computations) and all that is left is the f32
  // cancellation of dP - rowsum(dO O), which the flash rule's floor (1e-4 of a zero reference)
  // cannot hold. They are held elementwise to the dtype's row instead.
  const bool vanishing = p.c.causal && p.c.window == 1;
  r.out("dq", res.dq,
        vanishing ? Rule::close(backend_tol(dt)) : Rule::flash([v = naive.dq] { return v; }));
  r.out("dk", res.dk,
        vanishing ? Rule::close(backend_tol(dt)) : Rule::flash([v = naive.dk] { return v; }));
  return res;
}

// Forward, dk and dv are deterministic; dq sums f32 atomics in any order (one rounding apart).
void record_same_as_base(OpRun& r, const std::string& m, const Result& res) {
  r.same("out" + m, res.out, "out");
  r.same("lse" + m, res.lse, "lse");
  r.same("dk" + m, res.dk, "dk");
  r.same("dv" + m, res.dv, "dv");
  r.same("dq" + m, res.dq, "dq", Rule::close(backend_tol(res.dq.dtype())));
}

void record_base(OpRun& r, const Result& res) {
  for (auto [name, t] : {std::pair{"out", res.out}, std::pair{"lse", res.lse},
                         std::pair{"dq", res.dq}, std::pair{"dk", res.dk}, std::pair{"dv", res.dv}})
    r.keep(name, t);
}

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"bf16_d128_mha_short", DType::kBF16, 4, 4, 128, {1, 17, 64, 130, 257}},
      {"bf16_d64_gqa4_many_short_few_long",
       DType::kBF16,
       8,
       2,
       64,
       {3, 1, 5, 0, 200, 7, 1, 2, 513, 9, 0, 33}},
      {"f16_d128_gqa8_zero_lengths_tail",
       DType::kF16,
       8,
       1,
       128,
       {0, 300, 1, 0, 129},
       {},
       true,
       5,
       7},
      {"bf16_d128_decode_lq_lt_lk", DType::kBF16, 4, 1, 128, {1, 3, 0, 64, 1}, {100, 3, 5, 257, 1}},
      {"bf16_d64_lq_gt_lk_rows_see_nothing", DType::kBF16, 2, 1, 64, {10, 70, 5}, {3, 0, 5}},
      {"bf16_d64_noncausal_gqa2", DType::kBF16, 4, 2, 64, {5, 100, 1}, {7, 64, 300}, false},
      {"bf16_d64_gqa7_qwen05b", DType::kBF16, 14, 2, 64, {40, 97}},
      {"bf16_d128_long", DType::kBF16, 2, 1, 128, {1100, 3}},
      {"bf16_d96_simple_kernel", DType::kBF16, 4, 2, 96, {1, 50, 77}},
      {"f32_d128_gqa4_tail", DType::kF32, 8, 2, 128, {1, 0, 65, 130}, {}, true, 3, 3},
      {"f64_d32_decode", DType::kF64, 2, 1, 32, {4, 0, 9}, {4, 2, 20}},
      {"f16_d64_tail_only_rows", DType::kF16, 2, 2, 64, {31, 0}, {}, true, 9, 4},
      {"bf16_d128_window_varlen",
       DType::kBF16,
       4,
       2,
       128,
       {1, 19, 300, 71, 229},
       {},
       true,
       0,
       0,
       37},
      {"bf16_d64_window_long", DType::kBF16, 8, 2, 64, {700, 1, 129}, {}, true, 3, 0, 200},
      {"f16_d128_window1_decode",
       DType::kF16,
       4,
       1,
       128,
       {1, 3, 0, 64, 1},
       {100, 3, 5, 257, 1},
       true,
       0,
       0,
       1},
      {"bf16_d64_window_decode", DType::kBF16, 4, 4, 64, {1, 2, 5}, {90, 40, 5}, true, 0, 2, 16},
      {"f32_d128_window_gqa4", DType::kF32, 8, 2, 128, {71, 1, 19}, {}, true, 0, 0, 9},
      {"f32_d64_softcap", DType::kF32, 4, 2, 64, {33, 1, 9}, {}, true, 0, 0, 0, 0.8},
      {"f64_d32_window_softcap_decode",
       DType::kF64,
       2,
       1,
       32,
       {4, 0, 9},
       {4, 2, 20},
       true,
       0,
       0,
       5,
       0.6},
  };
  return c;
}

const std::vector<std::pair<std::string, std::string>> kOwn = {{"LEANTUNE_ATTENTION", "own"}};

// Inside the cuDNN path's surface (kernels/attention_cudnn.h).
bool cudnn_case(const Case& c) {
  return (c.dt == DType::kBF16 || c.dt == DType::kF16) && c.d % 8 == 0 && c.d <= 128 &&
         c.softcap == 0 && c.lk.empty() && c.tail_q == c.tail_k;
}

// GPU tier: why the cuDNN rows cannot run on device 0 ("" when they can).
std::string cudnn_missing() {
  const kernels::CudnnAttentionStatus st = kernels::cudnn_attention_status(0);
  return st.available ? "" : st.why;
}

// Whether every sequence of a case has the longest length (cuDNN's dense graph).
bool equal_lengths(const Case& c) {
  return c.tail_q == 0 &&
         std::all_of(c.lq.begin(), c.lq.end(), [&](int64_t l) { return l == c.lq[0] && l > 0; });
}

// A case through cuDNN (LEANTUNE_ATTENTION=cudnn) in the graph form `form` (LEANTUNE_CUDNN_GRAPH:
// auto, ragged, ragged_bottom_right): the references as for our kernels, one forward and one
// backward counted on cuDNN (on the dense graph exactly when the form is auto and the lengths are
// equal), and our kernels on the same inputs within the dtype's normwise row of each other (both
// are within the flash rule of the references).
void cudnn_entry(std::vector<Entry>& t, const Case& c, const std::string& form = "auto") {
  const std::string name = form == "auto" ? c.name : form + "_" + c.name;
  t.push_back({"attention_cudnn_" + name,
               [=](OpRun& r) {
                 const Problem p = make_problem(c, 9601);
                 if (!r.cuda()) {
                   record_against_references(r, p);
                   return;
                 }
                 const kernels::CudnnAttentionStatus before =
                     kernels::cudnn_attention_status(r.dev().index);
                 record_against_references(r, p);
                 const kernels::CudnnAttentionStatus after =
                     kernels::cudnn_attention_status(r.dev().index);
                 const int64_t ran = after.calls - before.calls;
                 const int64_t dense = after.dense_calls - before.dense_calls;
                 const int64_t want_dense = form == "auto" && equal_lengths(c) ? 2 : 0;
                 r.expect("cuDNN ran the forward and the backward",
                          ::testing::AssertionResult(ran == 2) << ran << " cuDNN calls");
                 r.expect("the graph form", ::testing::AssertionResult(dense == want_dense)
                                                << dense << " dense calls, want " << want_dense);
                 Options own;
                 own.backend = kernels::AttentionBackend::kOwn;
                 const Result mine = run_op(r, p, own, r.on(p.q));
                 const Rule near = Rule::within(2 * testing::backend_norm_tol(c.dt));
                 for (auto [name, t2] : {std::pair{"out", mine.out}, std::pair{"dq", mine.dq},
                                         std::pair{"dk", mine.dk}, std::pair{"dv", mine.dv}})
                   r.same(std::string(name) + "_own", t2, name, near);
                 r.same("lse_own", mine.lse, "lse", Rule::close(backend_tol(DType::kF32, 20.0)));
               },
               {{"LEANTUNE_ATTENTION", "cudnn"}, {"LEANTUNE_CUDNN_GRAPH", form}},
               cudnn_missing});
}

void per_case(std::vector<Entry>& t, const Case& c) {
  if (cudnn_case(c)) {
    cudnn_entry(t, c);
    cudnn_entry(t, c, "ragged_bottom_right");
  }
  t.push_back({"attention_" + c.name,
               [=](OpRun& r) { record_against_references(r, make_problem(c, 9001)); }, kOwn});
  // The device's variants of the call against its plain call: host i64 cu_seqlens without
  // hints, a too-small hint, device i64 without hints.
  // (Device-side behaviour: the reference run records nothing.)
  t.push_back({"attention_cu_seqlens_variants_" + c.name,
               [=](OpRun& r) {
                 if (r.reference()) return;
                 const Problem p = make_problem(c, 9101);
                 const Tensor q = r.on(p.q);
                 record_base(r, run_op(r, p, Options{}, q));
                 const std::vector<std::pair<std::string, Options>> variants = {
                     {"_host_i64_no_hint", Options{false, DType::kI64, 0}},
                     {"_small_hint", Options{true, DType::kI32, -1}},
                     {"_device_i64_no_hint", Options{true, DType::kI64, 0}}};
                 for (const auto& [m, o] : variants) record_same_as_base(r, m, run_op(r, p, o, q));
               },
               kOwn});
  // q as a strided view into a wider buffer (rows of Hq*D + 8 elements), starting 8 elements in
  // (rows stay 16-byte aligned: used in place) or 1 element in (copied for the tensor cores);
  // outputs misaligned by 3 elements (written through a workspace).
  t.push_back(
      {"attention_strided_misaligned_" + c.name,
       [=](OpRun& r) {
         if (r.reference()) return;
         const Problem p = make_problem(c, 9201);
         const Tensor q = r.on(p.q);
         record_base(r, run_op(r, p, Options{}, q));
         const int64_t w = c.hq * c.d;
         for (int64_t offset : {int64_t{8}, int64_t{1}}) {
           const Tensor wide = Tensor::zeros({p.tq, w + 8}, c.dt, r.dev());
           Tensor qv = make_view(wide, {p.tq, c.hq, c.d}, {w + 8, c.d, 1}, wide.offset() + offset);
           qv.copy_(q);
           Options o;
           o.out_guard = 3;
           record_same_as_base(r, "_offset" + std::to_string(offset), run_op(r, p, o, qv));
         }
       },
       kOwn});
}

}  // namespace

std::vector<Entry> attention_entries() {
  std::vector<Entry> t;
  for (const Case& c : cases()) per_case(t, c);
  // Batches of equal-length sequences (cuDNN's dense graph; one sequence always is), and two that
  // only look so by their row count, in each of the three graph forms.
  for (const Case& c :
       {Case{"bf16_d128_gqa4_equal_lengths", DType::kBF16, 8, 2, 128, {257, 257, 257}},
        Case{"f16_d64_mha_equal_lengths_window",
             DType::kF16,
             4,
             4,
             64,
             {130, 130},
             {},
             true,
             0,
             0,
             37},
        Case{"bf16_d64_gqa7_one_sequence", DType::kBF16, 14, 2, 64, {97}},
        Case{"bf16_d128_noncausal_equal_lengths",
             DType::kBF16,
             4,
             2,
             128,
             {64, 64, 64, 64},
             {},
             false},
        // T == B * S with unequal lengths: rows after the last sequence (cu 0, 64, 96 over 128
        // rows) keep the batch ragged.
        Case{"bf16_d64_tail_rows_b_times_s", DType::kBF16, 4, 2, 64, {64, 32}, {}, true, 32, 32},
        Case{"f16_d128_noncausal_tail_rows_b_times_s",
             DType::kF16,
             2,
             2,
             128,
             {64, 32},
             {},
             false,
             32,
             32}})
    for (const char* form : {"auto", "ragged", "ragged_bottom_right"}) cudnn_entry(t, c, form);
  // The 4-warp (kBc = 64) head_dim-128 backward that devices with 99 KiB of opt-in shared memory
  // (sm_86/sm_89) run, forced on any device.
  for (const Case& c : {Case{"bf16_d128_mha_short", DType::kBF16, 4, 4, 128, {1, 17, 64, 130, 257}},
                        Case{"f16_d128_gqa8_zero_lengths_tail",
                             DType::kF16,
                             8,
                             1,
                             128,
                             {0, 300, 1, 0, 129},
                             {},
                             true,
                             5,
                             7},
                        Case{"bf16_d128_noncausal_lq_ne_lk",
                             DType::kBF16,
                             4,
                             2,
                             128,
                             {5, 100, 1},
                             {7, 64, 300},
                             false},
                        Case{"bf16_d128_window45_varlen",
                             DType::kBF16,
                             4,
                             2,
                             128,
                             {1, 19, 300, 71},
                             {},
                             true,
                             0,
                             0,
                             45}})
    t.push_back({"attention_bwd_4warps_" + c.name,
                 [=](OpRun& r) { record_against_references(r, make_problem(c, 9401)); },
                 {{"LEANTUNE_ATTENTION_BWD_WARPS", "4"}, {"LEANTUNE_ATTENTION", "own"}}});
  t.push_back(
      {"attention_bad_arguments_bf16", [](OpRun& r) {
         const Tensor q = r.randn({4, 2, 64}, DType::kBF16, 1);
         const Tensor k = r.randn({4, 1, 64}, DType::kBF16, 2);
         const Tensor cu = cu_tensor({0, 4}, DType::kI32);
         Tensor out = Tensor::empty({4, 2, 64}, DType::kBF16, r.dev());
         Tensor lse = Tensor::empty({2, 4}, DType::kF32, r.dev());
         const kernels::AttentionOptions opt;
         if (r.cuda()) {
           // Head dim beyond every kernel (the CPU takes any).
           const Tensor qb = r.randn({4, 1, 640}, DType::kBF16, 3);
           Tensor ob = Tensor::empty({4, 1, 640}, DType::kBF16, r.dev());
           Tensor lb = Tensor::empty({1, 4}, DType::kF32, r.dev());
           r.throws("head_dim 640",
                    [&] { kernels::attention_fwd(qb, qb, qb, cu, cu, opt, ob, lb); });
           if (kernels::cudnn_attention_status(r.dev().index).available) {
             // A graph form that does not exist is named, not ignored.
             kernels::AttentionOptions on_cudnn;
             on_cudnn.backend = kernels::AttentionBackend::kCudnn;
             const char* prev = std::getenv("LEANTUNE_CUDNN_GRAPH");
             const std::string saved = prev ? prev : "";
             ::setenv("LEANTUNE_CUDNN_GRAPH", "sideways", 1);
             r.throws("LEANTUNE_CUDNN_GRAPH=sideways",
                      [&] { kernels::attention_fwd(q, k, k, cu, cu, on_cudnn, out, lse); });
             if (prev)
               ::setenv("LEANTUNE_CUDNN_GRAPH", saved.c_str(), 1);
             else
               ::unsetenv("LEANTUNE_CUDNN_GRAPH");
           }
         }
         r.throws("overlong host cu_seqlens", [&] {
           kernels::attention_fwd(q, k, k, cu_tensor({0, 5}, DType::kI32), cu, opt, out, lse);
         });
         const Tensor dec = cu_tensor({0, 3, 2}, DType::kI32);
         r.throws("decreasing host cu_seqlens",
                  [&] { kernels::attention_fwd(q, k, k, dec, dec, opt, out, lse); });
         Tensor lse64 = Tensor::empty({2, 4}, DType::kF64, r.dev());
         r.throws("f64 lse for bf16",
                  [&] { kernels::attention_fwd(q, k, k, cu, cu, opt, out, lse64); });
         const Tensor k3 = r.randn({4, 3, 64}, DType::kBF16, 4);
         r.throws("3 kv heads for 2 query heads",
                  [&] { kernels::attention_fwd(q, k3, k3, cu, cu, opt, out, lse); });
       }});
  t.push_back({"attention_repeatable_bf16_d128_gqa4",
               [](OpRun& r) {
                 if (r.reference()) return;
                 const Case c{"det", DType::kBF16, 8, 2, 128, {700, 1, 300}};
                 const Problem p = make_problem(c, 9301);
                 const Tensor q = r.on(p.q);
                 record_base(r, run_op(r, p, Options{}, q));
                 record_same_as_base(r, "_again", run_op(r, p, Options{}, q));
               },
               kOwn});
  // A device cu_seqlens with both max_seqlen hints is not read back; with cu[0] > 0 the rows
  // before the first sequence are still written: out = 0, lse = -inf, dq = dk = dv = 0. The CPU
  // reads cu_seqlens and refuses cu[0] != 0.
  for (DType dt : {DType::kBF16, DType::kF32})
    t.push_back(
        {"attention_rows_before_first_sequence_" + dt_name(dt), [=](OpRun& r) {
           const Problem p =
               make_problem({"lead", dt, 4, 2, 128, {30, 70}, {}, true, 3, 2}, 9501, 5, 6);
           if (!r.cuda()) {
             r.throws("cu_seqlens from 5", [&] { run_op(r, p, Options{}, r.on(p.q)); });
             return;
           }
           const Result res = run_op(r, p, Options{}, r.on(p.q));
           const int64_t row_q = 4 * 128, row_k = 2 * 128;
           const Vec out = res.out.to_f64(), lse = res.lse.to_f64(), dq = res.dq.to_f64(),
                     dk = res.dk.to_f64(), dv = res.dv.to_f64();
           bool zero_q = true, zero_k = true, lse_inf = true, finite = true;
           for (int64_t i = 0; i < 5 * row_q; ++i) zero_q &= out[i] == 0.0 && dq[i] == 0.0;
           for (int64_t i = 0; i < 6 * row_k; ++i) zero_k &= dk[i] == 0.0 && dv[i] == 0.0;
           for (int64_t h = 0; h < 4; ++h)
             for (int64_t i = 0; i < 5; ++i)
               lse_inf &= lse[h * p.tq + i] == -std::numeric_limits<double>::infinity();
           for (double x : out) finite &= std::isfinite(x);
           r.expect("out, dq of the 5 leading rows are 0", ::testing::AssertionResult(zero_q));
           r.expect("dk, dv of the 6 leading rows are 0", ::testing::AssertionResult(zero_k));
           r.expect("lse of the leading rows is -inf", ::testing::AssertionResult(lse_inf));
           r.expect("out is finite", ::testing::AssertionResult(finite));
         }});
  return t;
}

}  // namespace leantune::backend_test
