// Table rows for the raw ops of engine/ (ops_cuda_*.cu against the CPU ops): copies with and
// without conversion (host <-> device, strided sources and destinations), fills, elementwise
// binary ops with broadcasts, unary ops, reductions (special values included), softmax over up
// to the 151,936-wide vocabulary, index_rows with host and device ids, and gemm. Odd sizes (1,
// 19, 71x229) and the Qwen2.5-0.5B widths (896, 4864); guard bands around preallocated outputs.
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "backend/table.h"
#include "engine/ops.h"

namespace leantune::backend_test {
namespace {

using testing::backend_sum_tol;
using testing::backend_tol;

// The table is built while gtest registers its tests (static initialisation): no
// namespace-scope objects that need constructing.
const std::vector<Shape>& shapes() {
  static const std::vector<Shape> s = {{1}, {19}, {71, 229}, {3, 896}, {2, 4864}};
  return s;
}

Tensor host_randn(const Shape& s, DType dt, uint64_t seed, double std = 1.0) {
  return testing::randn(s, dt, seed, Device::cpu(), std);
}

void copies(std::vector<Entry>& t, DType dt) {
  const std::string d = dt_name(dt);
  for (const Shape& s : shapes())
    t.push_back({"copy_roundtrip_" + d + "_" + shape_name(s), [=](OpRun& r) {
                   const Tensor x = r.randn(s, dt, 11);
                   r.out("back", x.to(Device::cpu()), Rule::exact());
                 }});
  // Device-side conversion into a guarded buffer (bool cannot hold the sentinel), host -> device
  // and device -> host with conversion.
  t.push_back({"copy_convert_" + d + "_71x229", [=](OpRun& r) {
                 const Tensor h = host_randn({71, 229}, dt, 12, 50.0);
                 const Tensor x = r.on(h);
                 for (DType dst : {DType::kF32, DType::kBF16, DType::kF16, DType::kF64, DType::kI32,
                                   DType::kI64, DType::kBool}) {
                   const std::string n = dt_name(dst);
                   Tensor out = dst == DType::kBool ? Tensor::empty({71, 229}, dst, r.dev())
                                                    : r.guarded({71, 229}, dst);
                   ops::copy(out, x);
                   r.out("to_" + n, out, Rule::exact());
                   Tensor up = Tensor::empty({71, 229}, dst, r.dev());
                   ops::copy(up, h);
                   r.out("up_" + n, up, Rule::exact());
                   Tensor down = Tensor::empty({71, 229}, dst);
                   ops::copy(down, x);
                   r.out("down_" + n, down, Rule::exact());
                 }
               }});
  // Transposed and narrowed sources into strided destinations, with and without a dtype change;
  // host strided sources into device destinations and back.
  t.push_back(
      {"copy_strided_" + d + "_71x229", [=](OpRun& r) {
         const Tensor h = host_randn({71, 229}, dt, 13);
         const Tensor x = r.on(h);
         const std::vector<std::function<Tensor(const Tensor&)>> views = {
             [](const Tensor& v) { return v.transpose(0, 1); },
             [](const Tensor& v) { return v.narrow(1, 3, 100); },
             [](const Tensor& v) { return v.narrow(0, 5, 19).transpose(0, 1).narrow(0, 1, 7); }};
         for (size_t i = 0; i < views.size(); ++i) {
           const Tensor vd = views[i](x), vh = views[i](h);
           const std::string n = "view" + std::to_string(i);
           r.out(n + "_contiguous", vd.contiguous(), Rule::exact());
           std::vector<DType> out_dts = {dt};
           if (dt != DType::kF32) out_dts.push_back(DType::kF32);
           for (DType out_dt : out_dts) {
             const std::string m = n + "_" + dt_name(out_dt);
             auto strided = [&](Device dev) {
               return Tensor::zeros({vd.size(1), vd.size(0)}, out_dt, dev).transpose(0, 1);
             };
             Tensor a = strided(r.dev()), b = strided(r.dev()), c = strided(Device::cpu());
             ops::copy(a, vd);
             ops::copy(b, vh);
             ops::copy(c, vd);
             r.out(m + "_device", a, Rule::exact());
             r.out(m + "_from_host", b, Rule::exact());
             r.out(m + "_to_host", c, Rule::exact());
           }
         }
       }});
}

void fills(std::vector<Entry>& t, DType dt) {
  t.push_back({"fill_" + dt_name(dt) + "_71x229", [=](OpRun& r) {
                 for (double v : {0.0, -3.25, 1e30}) {
                   Tensor g = r.guarded({71, 229}, dt);
                   ops::fill(g, v);
                   r.out("fill_" + std::to_string(v), g, Rule::exact());
                 }
                 Tensor x = r.randn({19, 71}, dt, 14);
                 ops::fill(x.narrow(1, 2, 5), 7.5);
                 ops::fill(x.transpose(0, 1).narrow(0, 60, 11), -1.0);
                 r.out("strided", x, Rule::exact());
               }});
}

void elementwise(std::vector<Entry>& t, DType dt) {
  const std::string d = dt_name(dt);
  for (const Shape& s : shapes()) {
    const std::string sn = d + "_" + shape_name(s);
    // b of the same shape, a single element, a row; away from 0 for div.
    t.push_back({"binary_" + sn, [=](OpRun& r) {
                   const Tensor a = r.randn(s, dt, 21);
                   const Shape row(s.end() - 1, s.end());
                   const std::vector<Shape> bshapes = {s, Shape{1}, row};
                   const Rule rule = Rule::close(backend_tol(dt, 4.0));
                   for (size_t i = 0; i < bshapes.size(); ++i) {
                     const Tensor b = r.randu(bshapes[i], dt, 22, 0.5, 2.0);
                     const std::string n = "_b" + std::to_string(i);
                     r.out("add" + n, ops::add(a, b, 0.75), rule);
                     r.out("sub" + n, ops::sub(a, b), rule);
                     r.out("mul" + n, ops::mul(a, b), rule);
                     r.out("div" + n, ops::div(a, b), rule);
                     Tensor g = r.guarded(s, dt);
                     ops::copy(g, a);
                     ops::add_(g, b, -2.0);
                     ops::mul_(g, b);
                     r.out("in_place" + n, g, rule);
                   }
                 }});
    t.push_back(
        {"unary_" + sn, [=](OpRun& r) {
           const Tensor x = r.randn(s, dt, 31, 3.0);
           const Tensor pos = r.randu(s, dt, 32, 0.01, 5.0);
           const Rule rule = Rule::close(backend_tol(dt, 2.0));
           for (ops::Unary op : {ops::Unary::kNeg, ops::Unary::kExp, ops::Unary::kSigmoid,
                                 ops::Unary::kLogSigmoid, ops::Unary::kTanh, ops::Unary::kRelu,
                                 ops::Unary::kSquare, ops::Unary::kAbs, ops::Unary::kSilu})
             r.out("unary" + std::to_string(static_cast<int>(op)), ops::unary(x, op), rule);
           for (ops::Unary op : {ops::Unary::kLog, ops::Unary::kSqrt})
             r.out("unary" + std::to_string(static_cast<int>(op)), ops::unary(pos, op), rule);
           r.out("affine", ops::affine(x, -1.5, 0.25), rule);
           r.out("scale", ops::scale(x, 3.0), rule);
           Tensor g = r.guarded(s, dt);
           ops::copy(g, x);
           ops::scale_(g, -0.125);
           r.out("scale_in_place", g, rule);
         }});
    t.push_back({"reduce_" + sn, [=](OpRun& r) {
                   const Tensor x = r.randn(s, dt, 41);
                   const double n = static_cast<double>(x.numel());
                   // Sums accumulate in double on both sides; the f32 result rounds once.
                   r.out("sum", ops::sum(x),
                         Rule::close(testing::backend_repeat_tol(DType::kF32, 10 * std::sqrt(n))));
                   r.out("sum_squares", ops::sum_squares(x),
                         Rule::close(backend_tol(DType::kF64, 1e3 * n)));
                   r.out("max_abs", ops::max_abs(x), Rule::exact());
                   r.expect("all_finite", ::testing::AssertionResult(ops::all_finite(x)));
                   r.out("max_last", ops::max_last(x), Rule::exact());
                   r.out("argmax_last", ops::argmax_last(x), Rule::exact());
                   for (int64_t dim = 0; dim < x.dim(); ++dim)
                     for (bool keep : {false, true})
                       r.out("sum_dim" + std::to_string(dim) + (keep ? "_keep" : ""),
                             ops::sum_dim(x, dim, keep),
                             Rule::close(backend_tol(dt, std::sqrt(double(x.size(dim))))));
                 }});
  }
  // b of another dtype is converted to a's first; a strided a is read through its view.
  t.push_back({"binary_mixed_strided_" + d + "_71x229", [=](OpRun& r) {
                 const Tensor a = r.randn({71, 229}, dt, 23);
                 const Tensor b = r.randn({229}, DType::kF32, 24);
                 const Tensor c = r.randn({229, 71}, dt, 25);
                 r.out("add_f32_row", ops::add(a, b), Rule::close(backend_tol(dt, 4.0)));
                 r.out("mul_strided", ops::mul(c.transpose(0, 1), a),
                       Rule::close(backend_tol(dt, 4.0)));
               }});
  // A long reduced dimension (the split reduction) and a strided input.
  t.push_back({"reduce_split_" + d + "_4093x3x5", [=](OpRun& r) {
                 const Tensor x = r.randn({4093, 3, 5}, dt, 42);
                 r.out("sum_dim0", ops::sum_dim(x, 0), Rule::close(backend_tol(dt, 64.0)));
                 r.out("sum_dim2_strided", ops::sum_dim(x.transpose(0, 2), 2),
                       Rule::close(backend_tol(dt, 64.0)));
               }});
  // Rows: ties (first maximum wins), NaN first (argmax 0), NaN inside (ignored by max), all -inf.
  t.push_back(
      {"reduce_special_values_" + d, [=](OpRun& r) {
         const double nan = std::numeric_limits<double>::quiet_NaN();
         const double inf = std::numeric_limits<double>::infinity();
         const Tensor x = r.on(Tensor::from_doubles(
             {1, 3, 3, -2, nan, 5, 1, 2, 0, nan, 4, 4, -inf, -inf, -inf, -inf}, {4, 4}, dt));
         r.out("argmax_last", ops::argmax_last(x), Rule::exact());
         r.out("max_last", ops::max_last(x), Rule::exact());
         r.expect("max_abs is NaN", ::testing::AssertionResult(std::isnan(ops::max_abs(x))));
         r.expect("not all finite", ::testing::AssertionResult(!ops::all_finite(x)));
         const Tensor fin = r.on(Tensor::from_doubles({1, 2, inf}, {3}, dt));
         r.expect("inf is not finite", ::testing::AssertionResult(!ops::all_finite(fin)));
         r.expect("max_abs of inf", ::testing::AssertionResult(ops::max_abs(fin) == inf));
       }});
  for (const Shape& s :
       {Shape{1, 1}, Shape{19, 19}, Shape{71, 229}, Shape{4, 4864}, Shape{2, 151936}})
    t.push_back({"softmax_" + d + "_" + shape_name(s), [=](OpRun& r) {
                   const Tensor x = r.randn(s, dt, 51, 4.0);
                   r.out("softmax", ops::softmax_last(x), Rule::close(backend_tol(dt, 1e-3)));
                   r.out("log_softmax", ops::log_softmax_last(x),
                         Rule::close(backend_tol(dt, 10.0)));
                 }});
  t.push_back(
      {"index_rows_" + d + "_229x71", [=](OpRun& r) {
         const Tensor table = r.randn({229, 71}, dt, 61);
         const Tensor ids =
             Tensor::from_vector(std::vector<int64_t>{0, 228, 5, 5, 100, 17, 228, 1, 0, 64, 3, 3, 3,
                                                      200, 9, 10, 11, 12, 13},
                                 {19});
         r.out("host_ids", ops::index_rows(table, ids), Rule::exact());
         r.out("device_ids", ops::index_rows(table, r.on(ids)), Rule::exact());
         r.out("device_i32_ids", ops::index_rows(table, r.on(ids.to(DType::kI32))), Rule::exact());
         // 16-byte rows (the vector path) and a narrowed table (a strided view).
         const Tensor wide = r.randn({64, 896}, dt, 62);
         const Tensor ids2 = Tensor::from_vector(std::vector<int64_t>{63, 0, 7}, {3});
         r.out("wide_rows", ops::index_rows(wide, r.on(ids2)), Rule::exact());
         r.out("narrowed_table", ops::index_rows(wide.narrow(1, 1, 19), ids2), Rule::exact());
         // Out-of-range ids are Errors, from host and from device ids.
         const Tensor bad = Tensor::from_vector(std::vector<int64_t>{1, 229}, {2});
         r.throws("id 229 (host ids)", [&] { ops::index_rows(table, bad); });
         r.throws("id 229 (device ids)", [&] { ops::index_rows(table, r.on(bad)); });
         const Tensor neg = Tensor::from_vector(std::vector<int32_t>{-1}, {1});
         r.throws("id -1 (device i32 ids)", [&] { ops::index_rows(table, r.on(neg)); });
       }});
}

struct GemmCase {
  DType dt, c_dt;
  int64_t m, n, k;
  bool ta, tb;
};

void gemms(std::vector<Entry>& t) {
  for (const GemmCase c : {GemmCase{DType::kF32, DType::kF32, 1, 1, 1, false, false},
                           GemmCase{DType::kF32, DType::kF32, 19, 71, 229, false, true},
                           GemmCase{DType::kF32, DType::kF32, 71, 19, 229, true, false},
                           GemmCase{DType::kBF16, DType::kBF16, 71, 229, 19, false, true},
                           GemmCase{DType::kBF16, DType::kBF16, 64, 896, 896, false, true},
                           GemmCase{DType::kBF16, DType::kF32, 896, 128, 4864, true, false},
                           GemmCase{DType::kF16, DType::kF16, 19, 229, 71, true, true},
                           GemmCase{DType::kF64, DType::kF64, 19, 71, 229, true, false},
                           GemmCase{DType::kBF16, DType::kBF16, 1, 4864, 896, false, true}}) {
    const std::string name = "gemm_" + dt_name(c.dt) + "_" + dt_name(c.c_dt) + "_" +
                             shape_name({c.m, c.n, c.k}) + (c.ta ? "_ta" : "") +
                             (c.tb ? "_tb" : "");
    t.push_back({name, [=](OpRun& r) {
                   const Tensor a = r.randn(c.ta ? Shape{c.k, c.m} : Shape{c.m, c.k}, c.dt, 71);
                   const Tensor b = r.randn(c.tb ? Shape{c.n, c.k} : Shape{c.k, c.n}, c.dt, 72);
                   const Tensor c0 = r.randn({c.m, c.n}, c.c_dt, 73);
                   // Both sides sum the same rounded inputs in f32 (f64) in different orders;
                   // 16-bit operands into f32 take the operands' row.
                   const DType tol_dt = c.c_dt == DType::kF32 ? c.dt : c.c_dt;
                   const Rule rule = Rule::close(backend_sum_tol(tol_dt, double(c.k)));
                   for (double beta : {0.0, 0.5}) {
                     Tensor out = c0.clone();
                     ops::gemm(a, c.ta, b, c.tb, out, 1.25, beta);
                     r.out(beta == 0.0 ? "beta0" : "beta05", out, rule);
                   }
                   // The same product through transposed views (taken as they are).
                   const Tensor at = a.transpose(0, 1).contiguous().transpose(0, 1);
                   Tensor out = Tensor::empty({c.m, c.n}, c.c_dt, r.dev());
                   ops::gemm(at, c.ta, b, c.tb, out);
                   r.out("transposed_view", out, rule);
                 }});
  }
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
    t.push_back(
        {"gemm_edge_" + dt_name(dt), [=](OpRun& r) {
           // k == 0: c = beta * c.
           Tensor c = r.randn({3, 5}, dt, 81);
           ops::gemm(Tensor::empty({3, 0}, dt, r.dev()), false, Tensor::empty({0, 5}, dt, r.dev()),
                     false, c, 1.0, 0.5);
           r.out("k0", c, Rule::close(backend_tol(dt)));
           // Mixed inputs compute in f32 (as the host does) and round into c.
           const Tensor x = r.randn({19, 71}, dt, 82), y = r.randn({71, 23}, DType::kF32, 83);
           Tensor o = Tensor::empty({19, 23}, dt, r.dev());
           ops::gemm(x, false, y, false, o);
           r.out("mixed", o, Rule::close(backend_sum_tol(dt, 71)));
         }});
}

}  // namespace

std::vector<Entry> engine_op_entries() {
  std::vector<Entry> t;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16, DType::kF64}) {
    copies(t, dt);
    fills(t, dt);
    elementwise(t, dt);
  }
  gemms(t);
  return t;
}

}  // namespace leantune::backend_test
