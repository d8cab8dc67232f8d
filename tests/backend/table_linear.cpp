// Table rows for the weight products of kernels/: linear (cuBLASLt against OpenBLAS): forward
// with and without bias, a row-strided x, backward (dx, dW, db, each optional: frozen W), f32
// gradients of 16-bit operands, f64 operands that take f64 gradients only, the autograd op;
// kv_cache_write (the paged pool's scatter, bit for bit); and quantized weights: NF4 (plain and
// nested) and int8 dequantization bit for bit into guarded and misaligned outputs, bitsandbytes'
// fixture states, quantizing on the device, and the quantized linear products.
#include <cmath>
#include <string>
#include <vector>

#include "backend/table.h"
#include "engine/autograd.h"
#include "kernels/kv_cache_write.h"
#include "kernels/linear.h"
#include "kernels/quant.h"
#include "loaders/safetensors.h"

namespace leantune::backend_test {
namespace {

using testing::backend_sum_tol;

Tensor host_randn(const Shape& s, DType dt, uint64_t seed, double std = 1.0) {
  return testing::randn(s, dt, seed, Device::cpu(), std);
}

// Both sides sum the same rounded inputs in f32 (f64) in different orders over k terms.
Rule sum_rule(DType dt, int64_t k) { return Rule::close(backend_sum_tol(dt, double(k))); }

void linear(std::vector<Entry>& t) {
  struct Case {
    DType dt;
    int64_t t, in, out;
    bool bias;
  };
  for (const Case c :
       {Case{DType::kF32, 1, 1, 1, true}, Case{DType::kBF16, 1, 1, 1, false},
        Case{DType::kF32, 19, 19, 19, false}, Case{DType::kBF16, 19, 19, 19, true},
        Case{DType::kF32, 71, 229, 19, true}, Case{DType::kBF16, 71, 229, 19, true},
        Case{DType::kF16, 71, 229, 19, false}, Case{DType::kBF16, 64, 896, 4864, false},
        Case{DType::kBF16, 33, 4864, 896, true}, Case{DType::kF32, 64, 896, 128, true},
        Case{DType::kBF16, 256, 896, 1152, true}, Case{DType::kF64, 19, 71, 23, true}}) {
    const std::string n =
        dt_name(c.dt) + "_" + shape_name({c.t, c.in, c.out}) + (c.bias ? "_bias" : "");
    t.push_back({"linear_fwd_" + n, [=](OpRun& r) {
                   const Tensor x = r.randn({c.t, c.in}, c.dt, 501);
                   const Tensor w = r.randn({c.out, c.in}, c.dt, 502, 0.5);
                   const Tensor b = c.bias ? r.randn({c.out}, c.dt, 503) : Tensor();
                   Tensor y = r.guarded({c.t, c.out}, c.dt);
                   kernels::linear_fwd(x, w, b, y);
                   r.out("y", y, sum_rule(c.dt, c.in));
                   // A row-strided x (a narrow of a wider buffer), used through its leading
                   // dimension.
                   const Tensor wide = r.randn({c.t, c.in + 8}, c.dt, 504);
                   Tensor y2 = Tensor::empty({c.t, c.out}, c.dt, r.dev());
                   kernels::linear_fwd(wide.narrow(1, 8, c.in), w, b, y2);
                   r.out("y_strided_x", y2, sum_rule(c.dt, c.in));
                 }});
    t.push_back({"linear_bwd_" + n, [=](OpRun& r) {
                   const Tensor x = r.randn({c.t, c.in}, c.dt, 511);
                   const Tensor w = r.randn({c.out, c.in}, c.dt, 512, 0.5);
                   const Tensor dy = r.randn({c.t, c.out}, c.dt, 513);
                   Tensor dx = r.guarded({c.t, c.in}, c.dt), dw = r.guarded({c.out, c.in}, c.dt),
                          db = r.guarded({c.out}, c.dt);
                   kernels::linear_bwd(dy, x, w, dx, dw, db);
                   r.out("dx", dx, sum_rule(c.dt, c.out));
                   r.out("dw", dw, sum_rule(c.dt, c.t));
                   r.out("db", db, sum_rule(c.dt, c.t));
                   // Frozen W (no dW) and no bias gradient.
                   Tensor dx_only = Tensor::empty({c.t, c.in}, c.dt, r.dev());
                   kernels::linear_bwd(dy, Tensor(), w, dx_only, Tensor(), Tensor());
                   r.out("dx_frozen_w", dx_only, sum_rule(c.dt, c.out));
                   if (c.dt == DType::kBF16 || c.dt == DType::kF16) {
                     // f32 gradients for 16-bit operands.
                     Tensor dw32 = Tensor::empty({c.out, c.in}, DType::kF32, r.dev());
                     Tensor db32 = Tensor::empty({c.out}, DType::kF32, r.dev());
                     kernels::linear_bwd(dy, x, Tensor(), Tensor(), dw32, db32);
                     r.out("dw_f32", dw32, sum_rule(DType::kF32, c.t));
                     r.out("db_f32", db32, sum_rule(DType::kF32, c.t));
                   } else if (c.dt == DType::kF64 && r.cuda()) {
                     // f64 operands take f64 gradients only: the kernel refuses an f32 dW (the
                     // CPU path computes it).
                     Tensor dw32 = Tensor::empty({c.out, c.in}, DType::kF32, r.dev());
                     r.throws("f32 dW for f64 operands", [&] {
                       kernels::linear_bwd(dy, x, Tensor(), Tensor(), dw32, Tensor());
                     });
                   }
                 }});
    t.push_back({"linear_autograd_" + n, [=](OpRun& r) {
                   Tensor x = r.randn({c.t, c.in}, c.dt, 521).set_requires_grad(true);
                   Tensor w = r.randn({c.out, c.in}, c.dt, 522, 0.5).set_requires_grad(true);
                   Tensor b = r.randn({c.out}, c.dt, 523).set_requires_grad(true);
                   const Tensor y = kernels::linear(x, w, c.bias ? b : Tensor());
                   r.out("y", y, sum_rule(c.dt, c.in));
                   y.backward(r.randn({c.t, c.out}, c.dt, 524));
                   r.out("dx", x.grad(), sum_rule(c.dt, c.out));
                   r.out("dw", w.grad(), sum_rule(c.dt, c.t));
                   if (c.bias) r.out("db", b.grad(), sum_rule(c.dt, c.t));
                 }});
  }
}

// 16-byte rows and odd widths (element words), strided rows, guard bands around the pool.
void kv_cache_write(std::vector<Entry>& t) {
  struct Case {
    DType dt;
    int64_t pool_rows, width, rows;
  };
  for (const Case c : {Case{DType::kF32, 1, 1, 1}, Case{DType::kBF16, 19, 8, 19},
                       Case{DType::kBF16, 229, 71, 71}, Case{DType::kF16, 64, 128, 13},
                       Case{DType::kF32, 4096, 256, 97}, Case{DType::kF64, 33, 5, 32}})
    t.push_back({"kv_cache_write_" + dt_name(c.dt) + "_pool" + shape_name({c.pool_rows, c.width}) +
                     "_rows" + std::to_string(c.rows),
                 [=](OpRun& r) {
                   const Tensor init = r.randn({c.pool_rows, c.width}, c.dt, 51);
                   const Tensor wide = r.randn({c.width, c.rows}, c.dt, 52);
                   std::vector<int64_t> s;
                   for (int64_t i = 0; i < c.rows; ++i) s.push_back((i * 5 + 1) % c.pool_rows);
                   const Tensor slots = Tensor::from_vector(s, {c.rows});
                   Tensor pool = r.guarded({c.pool_rows, c.width}, c.dt);
                   pool.copy_(init);
                   kernels::kv_cache_write(pool, slots, wide.transpose(0, 1));
                   r.out("pool", pool, Rule::exact());
                   // Contiguous rows.
                   Tensor again = init.clone();
                   kernels::kv_cache_write(again, slots, wide.transpose(0, 1).contiguous());
                   r.same("pool_contiguous_rows", again, "pool");
                 }});
}

// Dequantization equals the host bit for bit: NF4 plain and nested, int8; f32/bf16/f16/f64
// outputs; one element off 16-byte alignment takes the element-wise path.
void dequant(std::vector<Entry>& t) {
  struct Case {
    int64_t out, in;
    DType dt;
  };
  for (const Case c : {Case{1, 1, DType::kF32}, Case{1, 19, DType::kBF16}, Case{3, 64, DType::kF16},
                       Case{71, 229, DType::kBF16}, Case{97, 201, DType::kF32},
                       Case{33, 15, DType::kF64}, Case{300, 257, DType::kBF16}}) {
    const std::string n = dt_name(c.dt) + "_" + shape_name({c.out, c.in});
    const int64_t numel = c.out * c.in;
    auto record = [=](OpRun& r, const std::string& m, const auto& weight, auto dequantize) {
      Tensor out = r.guarded({numel}, c.dt);
      dequantize(weight, out);
      r.out(m, out, Rule::bits());
      Tensor shifted = Tensor::empty({numel + 1}, c.dt, r.dev()).narrow(0, 1, numel);
      dequantize(weight, shifted);
      r.same(m + "_misaligned", shifted, m, Rule::bits());
    };
    t.push_back({"nf4_dequantize_" + n, [=](OpRun& r) {
                   const Tensor w = host_randn({c.out, c.in}, DType::kF32, 101, 0.2);
                   for (bool nested : {false, true}) {
                     const std::string m = nested ? "nested" : "plain";
                     const kernels::Nf4Weight q = kernels::nf4_quantize(w, nested).to(r.dev());
                     r.out(m + "_block_absmax", kernels::nf4_block_absmax(q), Rule::bits());
                     record(r, m, q, [](const kernels::Nf4Weight& q, const Tensor& o) {
                       kernels::nf4_dequantize(q, o);
                     });
                   }
                 }});
    t.push_back(
        {"int8_dequantize_" + n, [=](OpRun& r) {
           const kernels::Int8Weight q =
               kernels::int8_quantize(host_randn({c.out, c.in}, DType::kF32, 102)).to(r.dev());
           record(r, "int8", q, [](const kernels::Int8Weight& q, const Tensor& o) {
             kernels::int8_dequantize(q, o);
           });
         }});
  }
  // bitsandbytes' own nested states (tests/fixtures/quant/nf4.safetensors).
  t.push_back({"nf4_dequantize_bitsandbytes_fixture", [](OpRun& r) {
                 auto f = SafetensorsFile::open(testing::fixture_path("quant/nf4.safetensors"));
                 for (const std::string name : {"case21", "r1x19", "r7x100_bf16",
                                                "r97x201_wide_bf16", "zeros_3x70", "ties_1x64"}) {
                   const Tensor w = f->tensor(name + ".weight");
                   kernels::Nf4Weight q;
                   q.shape = w.shape();
                   q.packed = r.on(f->tensor(name + ".packed"));
                   q.qabsmax = r.on(f->tensor(name + ".nested.qabsmax"));
                   q.absmax2 = r.on(f->tensor(name + ".nested.absmax2"));
                   q.offset = f->tensor(name + ".nested.offset").to_f32()[0];
                   const Tensor d = kernels::nf4_dequantize(q, w.dtype());
                   r.out(name, d, Rule::bits());
                   r.expect(name + " equals bitsandbytes",
                            ::testing::AssertionResult(
                                testing::bytes_of(d) ==
                                testing::bytes_of(f->tensor(name + ".nested.dequant"))));
                 }
               }});
  t.push_back({"nf4_int8_quantize_bf16_37x129", [](OpRun& r) {
                 const Tensor w = r.randn({37, 129}, DType::kBF16, 103);
                 const kernels::Nf4Weight q = kernels::nf4_quantize(w, true);
                 r.expect("on the run's device", ::testing::AssertionResult(q.device() == r.dev()));
                 r.expect("tagged kParam",
                          ::testing::AssertionResult(q.packed.tag() == MemTag::kParam));
                 r.out("packed", q.packed, Rule::bits());
                 r.out("qabsmax", q.qabsmax, Rule::bits());
                 r.out("absmax2", q.absmax2, Rule::bits());
                 r.out("offset", q.offset, Rule::exact());
                 r.out("int8", kernels::int8_quantize(w).q, Rule::bits());
               }});
}

// The quantized linear products: within GEMM rounding of the host.
void quant_linear(std::vector<Entry>& t) {
  struct Case {
    std::string fmt;
    DType dt;
    int64_t t, in, out;
    bool bias;
  };
  for (const Case& c :
       {Case{"nf4", DType::kF32, 1, 19, 7, false}, Case{"nf4dq", DType::kBF16, 33, 229, 71, true},
        Case{"nf4dq", DType::kF16, 5, 64, 3, true}, Case{"nf4", DType::kF64, 4, 33, 5, true},
        Case{"int8", DType::kBF16, 17, 229, 71, true}, Case{"int8", DType::kF32, 1, 19, 7, false}})
    t.push_back({c.fmt + "_linear_" + dt_name(c.dt) + "_" + shape_name({c.t, c.in, c.out}) +
                     (c.bias ? "_bias" : ""),
                 [=](OpRun& r) {
                   const Tensor wf = host_randn({c.out, c.in}, DType::kF32, 111, 0.1);
                   const Tensor x = r.randn({c.t, c.in}, c.dt, 112);
                   const Tensor dy = r.randn({c.t, c.out}, c.dt, 113);
                   const Tensor b = c.bias ? r.randn({c.out}, c.dt, 114) : Tensor();
                   Tensor y = r.guarded({c.t, c.out}, c.dt), dx = r.guarded({c.t, c.in}, c.dt);
                   Tensor db = c.bias ? r.guarded({c.out}, c.dt) : Tensor();
                   if (c.fmt == "int8") {
                     const kernels::Int8Weight q = kernels::int8_quantize(wf).to(r.dev());
                     kernels::int8_linear_fwd(x, q, b, y);
                     kernels::int8_linear_bwd(dy, q, dx, db);
                   } else {
                     const kernels::Nf4Weight q =
                         kernels::nf4_quantize(wf, c.fmt == "nf4dq").to(r.dev());
                     kernels::nf4_linear_fwd(x, q, b, y);
                     kernels::nf4_linear_bwd(dy, q, dx, db);
                   }
                   r.out("y", y, sum_rule(c.dt, c.in));
                   r.out("dx", dx, sum_rule(c.dt, c.out));
                   if (c.bias) r.out("db", db, sum_rule(c.dt, c.t));
                 }});
}

}  // namespace

std::vector<Entry> linear_entries() {
  std::vector<Entry> t;
  linear(t);
  kv_cache_write(t);
  dequant(t);
  quant_linear(t);
  return t;
}

}  // namespace leantune::backend_test
