// Table rows for zigzag ring attention on CUDA (kernels/ring_attention.{cpp,cu}): the CUDA ring's
// forward and backward against the CPU ring at cp 1 and 2, the ranks being threads of this
// process (tests/kernels/ring_test_util.h), so the driver, the block schedule and the
// ring_*_cuda kernels run on one GPU.
//   f32: against the CPU ring in f32, normwise (the attention's own f32 parity) for out, lse, dq,
//        dk, dv.
//   bf16: against the CPU ring in f64 on the same bf16 inputs under flash-attention's rule, the
//        naive computation being the whole padded batch in bf16 (naive.h) read at the
//        rank's rows; lse elementwise. The CPU ring refuses bf16, so the self-check's stand-in
//        is the CPU ring in f32 with its outputs rounded to bf16.
// Cases: documents of length 1, odd lengths, an empty document, GQA 4 (Hq 8, Hk 2), head_dim 64
// (the tensor-core kernels for bf16), documents longer than one tile. Pad rows (dout 0) must get
// exactly zero dQ/dK/dV.
#include <string>
#include <vector>

#include "backend/naive.h"
#include "backend/table.h"
#include "kernels/ring_test_util.h"

namespace leantune::backend_test {
namespace {

using ring_test::RankResult;
using ring_test::RingCase;

// (A function-local table: the entries are built during static initialisation.)
const std::vector<RingCase>& cases() {
  static const std::vector<RingCase> c = {
      {"short", {1, 7, 0, 33, 18}, 8, 2, 64},
      {"tiles", {1, 127, 3, 200}, 8, 2, 64},
  };
  return c;
}

// Pad rows of a local [T, H, D] gradient are exactly zero.
::testing::AssertionResult zero_pads(const Tensor& g, const kernels::ZigzagLayout& z) {
  const Vec a = g.to_f64();
  const int64_t row = g.numel() / std::max<int64_t>(g.size(0), 1);
  for (int64_t i = 0; i < z.local_rows(); ++i)
    for (int64_t e = 0; z.is_pad[i] && e < row; ++e)
      if (a[i * row + e] != 0.0) return ::testing::AssertionFailure() << "pad row " << i;
  return ::testing::AssertionSuccess();
}

void ring_case(OpRun& r, const RingCase& c, int cp, DType dt, uint64_t seed) {
  const ring_test::Global g = ring_test::make_global(c, cp, dt, seed);
  const bool f32 = dt == DType::kF32;
  std::vector<RankResult> res;
  if (r.reference()) {
    res = ring_test::run_rings(c, g, cp, Device::cpu(), f32 ? dt : DType::kF64);
  } else if (r.cuda() || f32) {
    res = ring_test::run_rings(c, g, cp, r.dev(), dt);
  } else {
    res = ring_test::run_rings(c, g, cp, r.dev(), DType::kF32);
    for (RankResult& x : res)
      for (Tensor* t : {&x.out, &x.dq, &x.dk, &x.dv}) *t = t->to(dt);
  }
  NaiveAttention naive;
  if (r.reference() && !f32) {
    const std::vector<int32_t>& cu32 = g.z0.cu_seqlens_global;
    const std::vector<int64_t> cu(cu32.begin(), cu32.end());
    naive = naive_attention(g.q, g.k, g.v, g.dout, cu, cu, true, dt);
  }
  const int64_t rq = c.hq * c.d, rk = c.hk * c.d;
  for (int rank = 0; rank < cp; ++rank) {
    const kernels::ZigzagLayout z = kernels::zigzag_layout(c.lengths, cp, rank);
    const RankResult& a = res[rank];
    const std::string m = "rank" + std::to_string(rank) + "_";
    if (!r.reference()) {
      r.expect(m + "dtypes",
               ::testing::AssertionResult(a.out.dtype() == dt && a.dq.dtype() == dt &&
                                          a.dk.dtype() == dt && a.lse.dtype() == DType::kF32));
      r.expect(m + "pad rows of dq are 0", zero_pads(a.dq, z));
      r.expect(m + "pad rows of dk are 0", zero_pads(a.dk, z));
      r.expect(m + "pad rows of dv are 0", zero_pads(a.dv, z));
    }
    if (f32) {
      const Rule within = Rule::within(testing::backend_norm_tol(dt));
      for (auto [name, t] : {std::pair{"lse", a.lse}, std::pair{"out", a.out},
                             std::pair{"dq", a.dq}, std::pair{"dk", a.dk}, std::pair{"dv", a.dv}})
        r.out(m + name, t, within);
      continue;
    }
    r.out(m + "lse", a.lse, Rule::close(testing::backend_tol(dt)));
    auto flash = [&](const Vec& global, int64_t row) {
      return Rule::flash(
          [v = r.reference() ? ring_test::local_rows(global, row, z) : Vec()] { return v; });
    };
    r.out(m + "out", a.out, flash(naive.out, rq));
    r.out(m + "dq", a.dq, flash(naive.dq, rq));
    r.out(m + "dk", a.dk, flash(naive.dk, rk));
    r.out(m + "dv", a.dv, flash(naive.dv, rk));
  }
}

}  // namespace

std::vector<Entry> ring_entries() {
  std::vector<Entry> t;
  for (int ci = 0; ci < 2; ++ci)
    for (int cp : {1, 2})
      for (DType dt : {DType::kF32, DType::kBF16})
        t.push_back({"ring_attention_" + std::string(cases()[ci].name) + "_cp" +
                         std::to_string(cp) + "_" + dt_name(dt),
                     [=](OpRun& r) { ring_case(r, cases()[ci], cp, dt, 7000 + 10 * cp + ci); }});
  return t;
}

}  // namespace leantune::backend_test
