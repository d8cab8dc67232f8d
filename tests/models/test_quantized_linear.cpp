// Quantized bases (models/quantized_linear.h) and whole-model quantization
// (models/quantize_model.h), on the host:
//   - Nf4Linear / Int8Linear autograd equals the dense linear over the dequantized weight,
//     gradcheck in f64, leading dimensions;
//   - storage bytes (NF4 ~0.5 B/param + absmax, double quant smaller, int8 ~1 B/param);
//   - memory: between forward and backward nothing but the output is held (no saved
//     activation, no dequantized weight: the kWorkspace scratch is shared and can be dropped),
//     backward dequantizes again, and a stack of layers uses one scratch of the largest layer;
//   - quantize_model / load_quantized on the tiny HF fixtures: which modules, forward and
//     gradients equal a dense model holding the dequantized weights, load == load + quantize;
//   - the trainer options (trainers/common/quant_options.h) and their errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "engine/allocator.h"
#include "engine/autograd.h"
#include "engine/ops.h"
#include "kernels/linear.h"
#include "loaders/safetensors.h"
#include "models/decoder.h"
#include "models/quantize_model.h"
#include "models/quantized_linear.h"
#include "testing/gradcheck.h"
#include "testing/testing.h"
#include "trainers/common/quant_options.h"

namespace leantune {
namespace {

using testing::randn;

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  std::vector<uint8_t> v(c.nbytes());
  if (!v.empty()) std::memcpy(v.data(), c.data_ptr(), v.size());
  return v;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && bytes_of(a) == bytes_of(b);
}

// The caching allocator's block size for a request (sizes round up to 512 bytes).
int64_t rounded(int64_t bytes) { return (bytes + 511) / 512 * 512; }

std::shared_ptr<LinearBase> make_base(const std::string& fmt, const Tensor& w) {
  if (fmt == "int8") return Int8Linear::quantize(w, Device::cpu());
  return Nf4Linear::quantize(w, Device::cpu(), fmt == "nf4dq");
}

// ---------------------------------------------------------------- the bases

struct BaseCase {
  std::string fmt;  // nf4, nf4dq, int8
  DType dt;
};
std::string base_name(const ::testing::TestParamInfo<BaseCase>& i) {
  return i.param.fmt + "_" + dtype_name(i.param.dt);
}

class QuantBase : public ::testing::TestWithParam<BaseCase> {};

TEST_P(QuantBase, AutogradEqualsDenseLinearOverDequantizedWeight) {
  const BaseCase c = GetParam();
  const int64_t in = 71, out = 19;
  auto base = make_base(c.fmt, randn({out, in}, DType::kF32, 1, Device::cpu(), 0.1));
  EXPECT_EQ(base->kind(), c.fmt == "int8" ? "int8" : "nf4");
  // [2, 3, in]: leading dimensions are flattened and restored.
  Tensor x = randn({2, 3, in}, c.dt, 2).set_requires_grad(true);
  Tensor b = randn({out}, c.dt, 3).set_requires_grad(true);
  Tensor y = base->forward(x, b);
  ASSERT_EQ(y.shape(), (Shape{2, 3, out}));
  ASSERT_TRUE(y.requires_grad());
  const Tensor g = randn({2, 3, out}, c.dt, 4);
  y.backward(g);

  const Tensor w = base->dequantize(c.dt);
  EXPECT_EQ(w.shape(), (Shape{out, in}));
  Tensor x2 = x.detach().reshape({6, in}).clone().set_requires_grad(true);
  Tensor b2 = b.detach().clone().set_requires_grad(true);
  Tensor y2 = kernels::linear(x2, w, b2);
  y2.backward(g.reshape({6, out}));
  EXPECT_TRUE(same_bits(y.detach().reshape({6, out}), y2.detach()));
  EXPECT_TRUE(same_bits(x.grad().reshape({6, in}), x2.grad()));
  EXPECT_TRUE(same_bits(b.grad(), b2.grad()));
}

TEST_P(QuantBase, NoGradModeRecordsNothing) {
  const BaseCase c = GetParam();
  auto base = make_base(c.fmt, randn({8, 64}, DType::kF32, 5));
  Tensor x = randn({4, 64}, c.dt, 6).set_requires_grad(true);
  NoGradGuard ng;
  EXPECT_FALSE(base->forward(x, Tensor()).requires_grad());
}

INSTANTIATE_TEST_SUITE_P(Cpu, QuantBase,
                         ::testing::Values(BaseCase{"nf4", DType::kF32},
                                           BaseCase{"nf4dq", DType::kBF16},
                                           BaseCase{"nf4dq", DType::kF32},
                                           BaseCase{"int8", DType::kF32},
                                           BaseCase{"int8", DType::kBF16}),
                         base_name);

TEST(QuantBaseGrad, GradcheckF64) {
  for (const std::string fmt : {"nf4dq", "int8"}) {
    auto base = make_base(fmt, randn({5, 19}, DType::kF32, 7, Device::cpu(), 0.3));
    testing::GradFn f = [&](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{base->forward(in[0], in[1])};
    };
    EXPECT_TRUE(testing::gradcheck(f, {randn({3, 19}, DType::kF64, 8), randn({5}, DType::kF64, 9)}))
        << fmt;
  }
}

TEST(QuantBaseStorage, BytesPerParameter) {
  const int64_t out = 256, in = 512, n = out * in, blocks = n / 64;
  const Tensor w = randn({out, in}, DType::kBF16, 10);
  const int64_t nf4 = Nf4Linear::quantize(w, Device::cpu(), false)->storage_bytes();
  const int64_t nf4dq = Nf4Linear::quantize(w, Device::cpu(), true)->storage_bytes();
  const int64_t i8 = Int8Linear::quantize(w, Device::cpu())->storage_bytes();
  EXPECT_EQ(nf4, n / 2 + 4 * blocks);                                 // 0.5625 B/param
  EXPECT_EQ(nf4dq, n / 2 + blocks + 4 * ((blocks + 255) / 256) + 4);  // ~0.5159 B/param
  EXPECT_EQ(i8, n + 4 * out);                                         // ~1.008 B/param
  EXPECT_NEAR(double(nf4) / n, 0.5625, 1e-12);
  EXPECT_LT(double(nf4dq) / n, 0.516);
  EXPECT_LT(nf4dq, nf4);
  EXPECT_EQ(int64_t(w.nbytes()), 2 * n);  // bf16: 2 B/param
}

// ---------------------------------------------------------------- memory

// Between forward and backward a quantized linear holds its output and nothing else: the
// dequantized weight lives only in the shared scratch (kWorkspace), which can even be dropped;
// backward dequantizes again.
TEST(QuantBaseMemory, NothingButTheOutputBetweenForwardAndBackward) {
  for (const std::string fmt : {"nf4dq", "int8"}) {
    SCOPED_TRACE(fmt);
    const Device cpu = Device::cpu();
    Allocator& a = allocator(cpu);
    const int64_t t = 8, in = 512, out = 256, dense = out * in * 4;
    auto base = make_base(fmt, randn({out, in}, DType::kF32, 11));
    Tensor x = randn({t, in}, DType::kF32, 12).set_requires_grad(true);
    kernels::release_quant_workspace(cpu);
    const AllocatorStats s0 = a.stats();
    a.reset_peak_stats();

    Tensor y = base->forward(x, Tensor());
    const AllocatorStats s1 = a.stats();
    EXPECT_EQ(s1.tag(MemTag::kActivation).current - s0.tag(MemTag::kActivation).current,
              rounded(t * out * 4));
    EXPECT_EQ(s1.tag(MemTag::kWorkspace).current - s0.tag(MemTag::kWorkspace).current, dense);
    // At the peak, next to the scratch: the recovered block scales of a nested weight.
    EXPECT_LE(s1.tag(MemTag::kWorkspace).peak - s0.tag(MemTag::kWorkspace).current,
              dense + rounded(out * in / 64 * 4));
    EXPECT_EQ(kernels::quant_workspace_bytes(cpu), dense);

    kernels::release_quant_workspace(cpu);
    const AllocatorStats s2 = a.stats();
    EXPECT_EQ(s2.allocated.current - s0.allocated.current, rounded(t * out * 4));

    y.backward(Tensor::full({t, out}, 1.0, DType::kF32));
    const AllocatorStats s3 = a.stats();
    EXPECT_EQ(kernels::quant_workspace_bytes(cpu), dense);  // dequantized again
    EXPECT_EQ(s3.tag(MemTag::kWorkspace).current - s0.tag(MemTag::kWorkspace).current, dense);
    EXPECT_EQ(x.grad().shape(), (Shape{t, in}));
  }
}

// A stack of layers shares one scratch of the largest layer's size.
TEST(QuantBaseMemory, StackUsesOneScratchOfTheLargestLayer) {
  const Device cpu = Device::cpu();
  Allocator& a = allocator(cpu);
  const std::vector<int64_t> dims = {64, 200, 96, 320, 64};
  std::vector<std::shared_ptr<LinearBase>> layers;
  int64_t largest = 0, scales = 0;
  const int64_t t = 5;
  for (size_t i = 0; i + 1 < dims.size(); ++i) {
    layers.push_back(make_base("nf4dq", randn({dims[i + 1], dims[i]}, DType::kF32, 20 + i)));
    largest = std::max(largest, dims[i + 1] * dims[i] * 4);
    scales = std::max(scales, rounded((dims[i + 1] * dims[i] + 63) / 64 * 4));
  }
  const int64_t last = rounded(t * dims.back() * 4);
  Tensor x = randn({t, dims[0]}, DType::kF32, 30).set_requires_grad(true);
  kernels::release_quant_workspace(cpu);
  const AllocatorStats s0 = a.stats();
  a.reset_peak_stats();
  Tensor h = x;
  for (auto& l : layers) h = l->forward(h, Tensor());
  const AllocatorStats s1 = a.stats();
  // No layer saves its input: only the last output is still held.
  EXPECT_EQ(s1.tag(MemTag::kActivation).current - s0.tag(MemTag::kActivation).current, last);
  EXPECT_EQ(s1.tag(MemTag::kWorkspace).current - s0.tag(MemTag::kWorkspace).current, largest);
  EXPECT_LE(s1.tag(MemTag::kWorkspace).peak - s0.tag(MemTag::kWorkspace).current, largest + scales);
  h.backward(Tensor::full(h.shape(), 1.0, DType::kF32));
  EXPECT_EQ(a.stats().tag(MemTag::kWorkspace).current - s0.tag(MemTag::kWorkspace).current,
            largest);
  EXPECT_EQ(x.grad().shape(), x.shape());
}

// ---------------------------------------------------------------- whole models

Batch fixture_batch(const std::string& model) {
  auto f = SafetensorsFile::open(testing::fixture_path("models/" + model + "/case.safetensors"));
  Batch b;
  b.input_ids = f->tensor("input_ids").clone(MemTag::kOther);
  b.labels = f->tensor("labels").clone(MemTag::kOther);
  b.cu_seqlens = f->tensor("cu_seqlens").clone(MemTag::kOther);
  std::vector<int64_t> cu = b.cu_seqlens.to_i64(), pos;
  for (size_t s = 1; s < cu.size(); ++s)
    for (int64_t i = cu[s - 1]; i < cu[s]; ++i) pos.push_back(i - cu[s - 1]);
  b.position_ids = Tensor::from_vector(pos, {static_cast<int64_t>(pos.size())});
  return b;
}

std::string model_dir(const std::string& model) {
  return testing::fixture_path("models/" + model + "/model");
}

QuantConfig cfg_for(const std::string& fmt, DType dt) {
  QuantConfig c;
  c.load_in_4bit = fmt != "int8";
  c.load_in_8bit = fmt == "int8";
  c.double_quant = fmt == "nf4dq";
  c.compute_dtype = dt;
  return c;
}

struct ModelCase {
  std::string model;
  std::string fmt;
};
std::string model_case_name(const ::testing::TestParamInfo<ModelCase>& i) {
  return i.param.model + "_" + i.param.fmt;
}

class QuantModel : public ::testing::TestWithParam<ModelCase> {};

TEST_P(QuantModel, QuantizesEveryProjectionButTheHead) {
  const ModelCase c = GetParam();
  auto model = DecoderModel::load(model_dir(c.model), Device::cpu(), DType::kF32);
  const QuantizeReport r = quantize_model(*model, cfg_for(c.fmt, DType::kF32));
  const int64_t layers = model->num_layers();
  // Every projection of a layer (Phi-3's fused qkv_proj and gate_up_proj count once each).
  EXPECT_EQ(r.quantized_modules, static_cast<int64_t>(model->layer(0).linears().size()) * layers);
  EXPECT_EQ(r.skipped_modules, model->tied() ? 0 : 1);
  int64_t dense = 0, quant = 0;
  for (LinearModule* m : model->linear_modules()) {
    if (m->name == "lm_head") {
      EXPECT_FALSE(m->base);
      EXPECT_TRUE(m->weight.defined());
      continue;
    }
    ASSERT_TRUE(m->base) << m->name;
    EXPECT_FALSE(m->weight.defined()) << m->name;
    EXPECT_EQ(m->base->kind(), c.fmt == "int8" ? "int8" : "nf4");
    dense += m->out_features * m->in_features * 4;
    quant += m->base->storage_bytes();
  }
  EXPECT_EQ(r.dense_bytes, dense);
  EXPECT_EQ(r.quantized_bytes, quant);
  EXPECT_LT(quant * (c.fmt == "int8" ? 3 : 7), dense);
  // Quantizing twice is an error naming the module.
  EXPECT_THROW(quantize_model(*model, cfg_for(c.fmt, DType::kF32)), Error);
}

// The quantized model computes exactly what a dense model holding the dequantized weights
// computes: loss, logits and the gradients that flow through every quantized projection.
TEST_P(QuantModel, ForwardAndGradientsEqualDenseModelOfDequantizedWeights) {
  const ModelCase c = GetParam();
  auto q = DecoderModel::load(model_dir(c.model), Device::cpu(), DType::kF32);
  auto d = DecoderModel::load(model_dir(c.model), Device::cpu(), DType::kF32);
  ForwardOptions fo;
  fo.need_logits = true;
  double dense_loss;
  {
    NoGradGuard ng;
    dense_loss = d->forward(fixture_batch(c.model), fo).loss.item();
  }
  quantize_model(*q, cfg_for(c.fmt, DType::kF32));
  std::vector<LinearModule*> qm = q->linear_modules(), dm = d->linear_modules();
  ASSERT_EQ(qm.size(), dm.size());
  {
    NoGradGuard ng;
    for (size_t i = 0; i < qm.size(); ++i)
      if (qm[i]->base) dm[i]->weight.copy_(qm[i]->base->dequantize(DType::kF32));
  }
  for (DecoderModel* m : {q.get(), d.get()}) {
    m->embed_tokens().set_requires_grad(true);
    m->final_norm().set_requires_grad(true);
  }
  ForwardResult rq = q->forward(fixture_batch(c.model), fo);
  ForwardResult rd = d->forward(fixture_batch(c.model), fo);
  EXPECT_TRUE(same_bits(rq.logits.detach(), rd.logits.detach()));
  EXPECT_EQ(rq.loss.item(), rd.loss.item());
  rq.loss.backward();
  rd.loss.backward();
  EXPECT_TRUE(testing::all_close(q->embed_tokens().grad(), d->embed_tokens().grad(), 1e-7, 1e-5));
  EXPECT_TRUE(testing::all_close(q->final_norm().grad(), d->final_norm().grad(), 1e-7, 1e-5));
  EXPECT_GT(ops::max_abs(q->embed_tokens().grad()), 0.0);
  // Quantization noise moves the loss only a little from the original model's.
  const double rel = std::abs(rq.loss.item() - dense_loss) / dense_loss;
  EXPECT_LT(rel, c.fmt == "int8" ? 0.01 : 0.1) << rq.loss.item() << " vs " << dense_loss;
}

// load_quantized never materialises a quantized weight densely on the device and gives the
// same bases as load + quantize_model, in f32 and in bf16 (weights on disk are f32: rounded to
// bf16 first, as transformers casts before quantizing).
TEST_P(QuantModel, LoadQuantizedEqualsLoadThenQuantize) {
  const ModelCase c = GetParam();
  for (DType dt : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(dt));
    QuantizeReport r;
    auto a = load_quantized(model_dir(c.model), Device::cpu(), dt, cfg_for(c.fmt, dt), &r);
    auto b = DecoderModel::load(model_dir(c.model), Device::cpu(), dt);
    const QuantizeReport rb = quantize_model(*b, cfg_for(c.fmt, dt));
    EXPECT_EQ(r.quantized_modules, rb.quantized_modules);
    EXPECT_EQ(r.quantized_bytes, rb.quantized_bytes);
    std::vector<LinearModule*> am = a->linear_modules(), bm = b->linear_modules();
    for (size_t i = 0; i < am.size(); ++i) {
      ASSERT_EQ(bool(am[i]->base), bool(bm[i]->base)) << am[i]->name;
      if (!am[i]->base) continue;
      EXPECT_TRUE(same_bits(am[i]->base->dequantize(dt), bm[i]->base->dequantize(dt)))
          << am[i]->name;
    }
    NoGradGuard ng;
    ForwardOptions fo;
    fo.need_logits = true;
    EXPECT_TRUE(same_bits(a->forward(fixture_batch(c.model), fo).logits,
                          b->forward(fixture_batch(c.model), fo).logits));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, QuantModel,
    ::testing::Values(ModelCase{"llama_gqa", "nf4dq"}, ModelCase{"llama_gqa", "int8"},
                      ModelCase{"qwen2_bias", "nf4"}, ModelCase{"qwen2_tied", "nf4dq"},
                      ModelCase{"qwen3", "nf4dq"}, ModelCase{"mistral", "int8"},
                      ModelCase{"phi3", "nf4"}, ModelCase{"gemma3", "nf4dq"}),
    model_case_name);

TEST(QuantModelErrors, HeadDtypeAndContradictions) {
  auto model = DecoderModel::load(model_dir("llama_gqa"), Device::cpu(), DType::kF32);
  QuantConfig c = cfg_for("nf4dq", DType::kF32);
  c.skip_modules.clear();
  try {
    quantize_model(*model, c);
    FAIL() << "lm_head was quantized";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("lm_head"), std::string::npos) << e.what();
  }
  try {
    quantize_model(*model, cfg_for("nf4", DType::kBF16));
    FAIL() << "compute dtype mismatch accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("bnb_4bit_compute_dtype"), std::string::npos);
  }
  QuantConfig both = cfg_for("nf4", DType::kF32);
  both.load_in_8bit = true;
  EXPECT_THROW(quantize_model(*model, both), Error);
  // Nothing asked: nothing changes.
  const QuantizeReport none = quantize_model(*model, QuantConfig{});
  EXPECT_EQ(none.quantized_modules, 0);
  for (LinearModule* m : model->linear_modules()) EXPECT_TRUE(m->weight.defined());
}

TEST(QuantModelErrors, MissingTensorIsNamed) {
  const std::string dir = testing::temp_dir("quant_missing");
  auto model = DecoderModel::load(model_dir("llama_gqa"), Device::cpu(), DType::kF32);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (auto& [name, t] : model->named_parameters())
    if (name != "model.layers.1.mlp.up_proj.weight") tensors.emplace_back(name, t);
  save_model_tensors(dir, tensors);
  model->config().save(dir);
  try {
    load_quantized(dir, Device::cpu(), DType::kF32, cfg_for("nf4", DType::kF32));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("model.layers.1.mlp.up_proj.weight"), std::string::npos)
        << e.what();
  }
}

TEST(QuantSkips, MatchesWholeDottedComponents) {
  QuantConfig c;
  EXPECT_TRUE(quant_skips(c, "lm_head"));
  EXPECT_FALSE(quant_skips(c, "model.layers.0.mlp.up_proj"));
  c.skip_modules = {"mlp.down_proj", "layers.1"};
  EXPECT_TRUE(quant_skips(c, "model.layers.0.mlp.down_proj"));
  EXPECT_TRUE(quant_skips(c, "model.layers.1.self_attn.q_proj"));
  EXPECT_FALSE(quant_skips(c, "model.layers.10.self_attn.q_proj"));
  EXPECT_FALSE(quant_skips(c, "model.layers.0.mlp.down_proj_x"));
  EXPECT_FALSE(quant_skips(c, "lm_head"));
}

// ---------------------------------------------------------------- trainer options

Options quant_options() {
  Options o("sft");
  add_quant_options(o);
  return o;
}

TEST(QuantOptions, DefaultsAndFlags) {
  Options o = quant_options();
  o.parse({});
  QuantConfig c = quant_config_from_options(o, DType::kBF16);
  EXPECT_FALSE(c.enabled());
  EXPECT_TRUE(c.double_quant);
  EXPECT_EQ(c.compute_dtype, DType::kBF16);
  EXPECT_EQ(c.skip_modules, std::vector<std::string>{"lm_head"});

  o = quant_options();
  o.parse({"--load_in_4bit", "--bnb_4bit_use_double_quant", "false", "--bnb_4bit_compute_dtype",
           "bfloat16", "--llm_int8_skip_modules", "lm_head,mlp.down_proj"});
  c = quant_config_from_options(o, DType::kBF16);
  EXPECT_TRUE(c.load_in_4bit);
  EXPECT_FALSE(c.load_in_8bit);
  EXPECT_FALSE(c.double_quant);
  EXPECT_EQ(c.kind(), "nf4");
  EXPECT_EQ(c.skip_modules, (std::vector<std::string>{"lm_head", "mlp.down_proj"}));

  o = quant_options();
  o.parse({"--load-in-8bit"});
  EXPECT_EQ(quant_config_from_options(o, DType::kF32).kind(), "int8");
}

TEST(QuantOptions, ErrorsNameTheOption) {
  struct Bad {
    std::vector<std::string> args;
    std::string needle;
  };
  const std::vector<Bad> bad = {
      {{"--load_in_4bit", "--load_in_8bit"}, "load_in_8bit"},
      {{"--load_in_4bit", "--bnb_4bit_quant_type", "fp4"}, "bnb_4bit_quant_type"},
      {{"--bnb_4bit_quant_type", "int4"}, "bnb_4bit_quant_type"},
      {{"--load_in_4bit", "--bnb_4bit_compute_dtype", "float32"}, "bnb_4bit_compute_dtype"},
      {{"--bnb_4bit_compute_dtype", "int8"}, "bnb_4bit_compute_dtype"},
  };
  for (const Bad& b : bad) {
    Options o = quant_options();
    o.parse(b.args);
    try {
      quant_config_from_options(o, DType::kBF16);
      FAIL() << "accepted " << b.args[0];
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInput);
      EXPECT_NE(std::string(e.what()).find(b.needle), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace leantune
