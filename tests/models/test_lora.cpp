// LoRA (models/lora.h, models/peft_io.h apply_peft): scaling (acceptance case 20), the fused
// op against finite differences in f64, PEFT's init, B = 0 starting at the base, a frozen base
// without gradients, model-level gradients against finite differences, dropout only while
// training and replayed under gradient checkpointing, a quantized (LinearBase) base, and the
// memory the op keeps for backward.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "engine/allocator.h"
#include "engine/autograd.h"
#include "engine/ops.h"
#include "kernels/linear.h"
#include "models/decoder.h"
#include "models/lora.h"
#include "models/peft_io.h"
#include "testing/gradcheck.h"
#include "testing/testing.h"

namespace leantune {
namespace {

std::unique_ptr<DecoderModel> load_fixture(const std::string& name, DType dt = DType::kF32) {
  return DecoderModel::load(testing::fixture_path("models/" + name + "/model"), Device::cpu(), dt);
}

// A varlen batch of two sequences over ids in [3, V).
Batch small_batch(int64_t vocab) {
  const std::vector<int64_t> lens = {6, 9};
  std::vector<int64_t> ids, pos;
  std::vector<int32_t> cu = {0};
  uint64_t state = 12345;
  for (int64_t len : lens) {
    for (int64_t i = 0; i < len; ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      ids.push_back(3 + static_cast<int64_t>((state >> 33) % (vocab - 3)));
      pos.push_back(i);
    }
    cu.push_back(cu.back() + static_cast<int32_t>(len));
  }
  Batch b;
  const int64_t t = static_cast<int64_t>(ids.size());
  b.input_ids = Tensor::from_vector(ids, {t});
  b.labels = Tensor::from_vector(ids, {t});
  b.position_ids = Tensor::from_vector(pos, {t});
  b.cu_seqlens = Tensor::from_vector(cu, {static_cast<int64_t>(cu.size())});
  b.max_seqlen = 9;
  return b;
}

void randomize_b(const PeftSetup& s, uint64_t seed, double std = 0.05) {
  NoGradGuard ng;
  Generator g(seed, RngPurpose::kTest);
  for (const auto& a : s.adapters) normal_(a->lora_B(), g, 0.0, std);
}

// ---------------------------------------------------------------- scaling (acceptance case 20)

struct ScalingCase {
  double alpha;
  int64_t r;
  bool rslora;
  double expected;
  std::string name;
};

class LoraScaling : public ::testing::TestWithParam<ScalingCase> {};

TEST_P(LoraScaling, MatchesPeft) {
  const ScalingCase& c = GetParam();
  EXPECT_DOUBLE_EQ(lora_scaling(c.alpha, c.r, c.rslora), c.expected);
  auto runtime = std::make_shared<LoraRuntime>();
  LoraAdapter a("m", 8, 4, c.r, c.alpha, c.rslora, 0.0, Device::cpu(), DType::kF32, runtime);
  EXPECT_DOUBLE_EQ(a.scaling(), c.expected);
}

INSTANTIATE_TEST_SUITE_P(Cases, LoraScaling,
                         ::testing::Values(ScalingCase{3, 16, false, 0.1875, "alpha3_r16"},
                                           ScalingCase{3, 16, true, 0.75, "alpha3_r16_rslora"},
                                           ScalingCase{32, 16, false, 2.0, "trl_default"},
                                           ScalingCase{16, 8, true, 16.0 / std::sqrt(8.0),
                                                       "alpha16_r8_rslora"}),
                         [](const auto& info) { return info.param.name; });

// ---------------------------------------------------------------- the fused op

struct OpCase {
  Shape x_shape;  // leading dims + in
  int64_t out;
  int64_t r;
  double p;
  std::string name;
};

class LoraLinearOp : public ::testing::TestWithParam<OpCase> {};

TEST_P(LoraLinearOp, GradcheckF64) {
  const OpCase& c = GetParam();
  const int64_t in = c.x_shape.back();
  Shape out_shape = c.x_shape;
  out_shape.back() = c.out;
  Generator gen(99, RngPurpose::kDropout);
  testing::GradFn f = [&](const std::vector<Tensor>& v) {
    gen.set_offset(0);
    return std::vector<Tensor>{lora_linear(v[0], v[1], v[2], v[3], 0.75, c.p, &gen)};
  };
  EXPECT_TRUE(testing::gradcheck(
      f,
      {testing::randn(c.x_shape, DType::kF64, 1), testing::randn(out_shape, DType::kF64, 2),
       testing::randn({c.r, in}, DType::kF64, 3), testing::randn({c.out, c.r}, DType::kF64, 4)}));
}

TEST_P(LoraLinearOp, ForwardIsBasePlusScaledBAx) {
  const OpCase& c = GetParam();
  const int64_t in = c.x_shape.back();
  Tensor x = testing::randn(c.x_shape, DType::kF64, 11);
  Tensor x2 = x.reshape({-1, in});
  const int64_t t = x2.size(0);
  Tensor base = testing::randn({t, c.out}, DType::kF64, 12);
  Tensor a = testing::randn({c.r, in}, DType::kF64, 13);
  Tensor b = testing::randn({c.out, c.r}, DType::kF64, 14);
  Generator gen(5, RngPurpose::kDropout);
  Tensor y = lora_linear(x2, base, a, b, 0.5, c.p, &gen);
  // The reference draws the same mask with bernoulli_ from the same offset.
  Generator ref(5, RngPurpose::kDropout);
  Tensor keep = Tensor::empty(x2.shape(), DType::kF64);
  bernoulli_(keep, ref, 1.0 - c.p);
  Tensor xd = ops::scale(ops::mul(x2, keep), 1.0 / (1.0 - c.p));
  Tensor expect =
      ops::add(base, ops::scale(ops::matmul(ops::matmul(xd, a, false, true), b, false, true), 0.5));
  EXPECT_TRUE(testing::all_close(y, expect, 1e-12, 1e-12));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, LoraLinearOp,
    ::testing::Values(OpCase{{7, 5}, 6, 3, 0.0, "rows7_in5_out6_r3"},
                      OpCase{{7, 5}, 6, 3, 0.3, "rows7_in5_out6_r3_dropout"},
                      OpCase{{2, 3, 4}, 5, 2, 0.5, "batch2x3_in4_out5_r2_dropout"},
                      OpCase{{1, 8}, 8, 1, 0.0, "one_row_rank1"}),
    [](const auto& info) { return info.param.name; });

// Gradients only where asked for, each equal to the one of the full backward.
TEST(LoraLinearOpPartial, EachInputAlone) {
  const Tensor x = testing::randn({6, 5}, DType::kF64, 41);
  const Tensor base = testing::randn({6, 4}, DType::kF64, 42);
  const Tensor a = testing::randn({3, 5}, DType::kF64, 43);
  const Tensor b = testing::randn({4, 3}, DType::kF64, 44);
  const Tensor g = testing::randn({6, 4}, DType::kF64, 45);
  auto grads = [&](std::vector<bool> need) {
    std::vector<Tensor> in = {x.clone(), base.clone(), a.clone(), b.clone()};
    for (size_t i = 0; i < in.size(); ++i) in[i].set_requires_grad(need[i]);
    Generator gen(3, RngPurpose::kDropout);
    lora_linear(in[0], in[1], in[2], in[3], 1.5, 0.25, &gen).backward(g);
    std::vector<Tensor> out;
    for (const Tensor& t : in) out.push_back(t.grad());
    return out;
  };
  const std::vector<Tensor> all = grads({true, true, true, true});
  for (size_t i = 0; i < 4; ++i) {
    std::vector<bool> need(4, false);
    need[i] = true;
    const std::vector<Tensor> one = grads(need);
    for (size_t j = 0; j < 4; ++j) {
      ASSERT_EQ(one[j].defined(), j == i) << i << " " << j;
      if (j == i) {
        EXPECT_EQ(one[j].to_f64(), all[j].to_f64()) << i;
      }
    }
  }
}

// Only the Philox coordinates and u = x A^T ([T, r]) are kept for backward beyond what the base
// projection already holds: the dropped copy of x is freed after forward.
TEST(LoraLinearMemory, DroppedInputIsNotKeptForBackward) {
  const int64_t t = 256, in = 512, out = 512, r = 8;
  Tensor x = testing::randn({t, in}, DType::kF32, 1);
  Tensor base = testing::randn({t, out}, DType::kF32, 2);
  Tensor a = testing::randn({r, in}, DType::kF32, 3).set_requires_grad(true);
  Tensor b = testing::randn({out, r}, DType::kF32, 4).set_requires_grad(true);
  Generator gen(1, RngPurpose::kDropout);
  auto held_after_forward = [&](double p) {
    const int64_t before = allocator(Device::cpu()).stats().allocated.current;
    Tensor y = lora_linear(x, base, a, b, 2.0, p, &gen);
    return allocator(Device::cpu()).stats().allocated.current - before;
  };
  const int64_t plain = held_after_forward(0.0), dropped = held_after_forward(0.3);
  EXPECT_EQ(dropped, plain);
  // y [t, out] plus u [t, r] (allocator rounding aside): far below one more [t, in] copy.
  EXPECT_LT(plain, static_cast<int64_t>((t * out + t * r) * 4 + 4096));
}

// A base output handed over (moved in, nothing else holding it) is written in place: y shares
// its storage, nothing [t, out] is allocated, and the values equal the copying call's bit for bit.
// A base output the caller still holds is left as it was.
TEST(LoraLinearMemory, AHandedOverBaseOutputIsWrittenInPlace) {
  const int64_t t = 64, in = 96, out = 80, r = 4;
  Tensor x = testing::randn({t, in}, DType::kF32, 1);
  const Tensor base = testing::randn({t, out}, DType::kF32, 2);
  Tensor a = testing::randn({r, in}, DType::kF32, 3).set_requires_grad(true);
  Tensor b = testing::randn({out, r}, DType::kF32, 4).set_requires_grad(true);
  const std::vector<double> base_before = base.to_f64();
  const Tensor copied = lora_linear(x, base, a, b, 2.0);
  EXPECT_EQ(base.to_f64(), base_before);
  EXPECT_NE(copied.data_ptr(), base.data_ptr());

  Tensor handed = base.clone();
  const void* storage = handed.data_ptr();
  const int64_t before = allocator(Device::cpu()).stats().allocated.current;
  Tensor y = lora_linear(x, std::move(handed), a, b, 2.0);
  const int64_t held = allocator(Device::cpu()).stats().allocated.current - before;
  EXPECT_EQ(y.data_ptr(), storage);
  EXPECT_LT(held, static_cast<int64_t>(t * out * 4));  // u [t, r] only
  EXPECT_EQ(y.to_f64(), copied.to_f64());
  // Gradients flow as through the copying call.
  y.backward(testing::randn({t, out}, DType::kF32, 5));
  const std::vector<double> da = a.grad().to_f64(), db = b.grad().to_f64();
  a.zero_grad();
  b.zero_grad();
  copied.backward(testing::randn({t, out}, DType::kF32, 5));
  EXPECT_EQ(a.grad().to_f64(), da);
  EXPECT_EQ(b.grad().to_f64(), db);
}

// ---------------------------------------------------------------- on the model

TEST(LoraModel, ZeroBStartsExactlyAtTheBase) {
  auto model = load_fixture("llama_gqa");
  const Batch batch = small_batch(model->config().vocab_size);
  ForwardOptions opt;
  opt.need_logits = true;
  opt.need_loss = false;
  NoGradGuard ng;
  const std::vector<double> base = model->forward(batch, opt).logits.to_f64();
  PeftConfig cfg;
  cfg.target_modules = {"all-linear"};
  cfg.lora_dropout = 0.0;
  PeftSetup s = apply_peft(cfg, *model, 7);
  EXPECT_EQ(s.adapters.size(), 14u);
  EXPECT_EQ(model->forward(batch, opt).logits.to_f64(), base);
}

TEST(LoraModel, InitIsPeftKaimingUniformFromTheLoraInitStream) {
  auto model = load_fixture("qwen2_tied");
  PeftConfig cfg;  // defaults: r 16, q_proj and v_proj
  PeftSetup s = apply_peft(cfg, *model, 31);
  ASSERT_EQ(s.adapters.size(), 4u);
  EXPECT_EQ(s.adapters[0]->module_name(), "model.layers.0.self_attn.q_proj");
  EXPECT_EQ(s.adapters[1]->module_name(), "model.layers.0.self_attn.v_proj");
  Generator ref(31, RngPurpose::kLoraInit);
  for (const auto& a : s.adapters) {
    const int64_t in = a->lora_A().size(1);
    EXPECT_EQ(a->lora_A().shape(), (Shape{16, in}));
    Tensor expect = Tensor::empty(a->lora_A().shape(), DType::kF32);
    uniform_(expect, ref, -1.0 / std::sqrt(in), 1.0 / std::sqrt(in));
    EXPECT_EQ(a->lora_A().to_f64(), expect.to_f64()) << a->module_name();
    EXPECT_EQ(ops::max_abs(a->lora_B()), 0.0);
    EXPECT_LE(ops::max_abs(a->lora_A()), 1.0 / std::sqrt(in));
    EXPECT_GT(ops::max_abs(a->lora_A()), 0.5 / std::sqrt(in));
  }
  EXPECT_DOUBLE_EQ(s.adapters[0]->scaling(), 2.0);
}

TEST(LoraModel, FrozenBaseGetsNoGradientAndAdaptersDo) {
  auto model = load_fixture("llama_gqa");
  PeftConfig cfg;
  cfg.r = 4;
  cfg.target_modules = {"all-linear"};
  PeftSetup s = apply_peft(cfg, *model, 3);
  randomize_b(s, 4);
  for (const auto& [name, t] : model->named_parameters()) EXPECT_FALSE(t.requires_grad()) << name;
  const auto trainable = s.trainable_parameters(*model);
  EXPECT_EQ(trainable.size(), 28u);
  EXPECT_EQ(trainable[0].first, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
  model->forward(small_batch(model->config().vocab_size)).loss.backward();
  for (const auto& [name, t] : model->named_parameters()) EXPECT_FALSE(t.grad().defined()) << name;
  for (const auto& [name, t] : trainable) {
    ASSERT_TRUE(t.grad().defined()) << name;
    EXPECT_GT(ops::max_abs(t.grad()), 0.0) << name;
  }
}

// dLoss/dA and dLoss/dB of the whole model against central differences, in f64.
TEST(LoraModel, GradientsMatchFiniteDifferencesF64) {
  auto model = load_fixture("qwen2_tied", DType::kF64);
  PeftConfig cfg;
  cfg.r = 2;
  cfg.lora_alpha = 3;
  cfg.use_rslora = true;
  cfg.target_modules = {"v_proj", "down_proj"};
  cfg.lora_dropout = 0.0;  // every evaluation must see the same function
  PeftSetup s = apply_peft(cfg, *model, 5);
  randomize_b(s, 6, 0.2);
  const Batch batch = small_batch(model->config().vocab_size);
  model->forward(batch).loss.backward();
  auto loss = [&]() {
    NoGradGuard ng;
    return model->forward(batch).loss.item();
  };
  const double eps = 1e-6;
  int checked = 0;
  for (const auto& [name, t] : s.trainable_parameters(*model)) {
    const std::vector<double> g = t.grad().to_f64();
    for (int64_t i = 0; i < t.numel(); i += std::max<int64_t>(1, t.numel() / 5)) {
      Tensor e = t.detach().flatten().narrow(0, i, 1);
      const double v = e.item();
      e.fill_(v + eps);
      const double lp = loss();
      e.fill_(v - eps);
      const double lm = loss();
      e.fill_(v);
      const double fd = (lp - lm) / (2 * eps);
      EXPECT_NEAR(g[i], fd, 1e-7 + 1e-5 * std::fabs(fd)) << name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GE(checked, 40);
}

TEST(LoraModel, DropoutOnlyWhileTraining) {
  auto model = load_fixture("llama_gqa");
  PeftConfig cfg;
  cfg.lora_dropout = 0.3;
  PeftSetup s = apply_peft(cfg, *model, 8);
  randomize_b(s, 9, 0.5);
  const Batch batch = small_batch(model->config().vocab_size);
  ForwardOptions opt;
  opt.need_logits = true;
  opt.need_loss = false;
  NoGradGuard ng;
  s.set_training(false);
  const uint64_t off0 = s.runtime->dropout_gen->offset();
  const std::vector<double> eval1 = model->forward(batch, opt).logits.to_f64();
  const std::vector<double> eval2 = model->forward(batch, opt).logits.to_f64();
  EXPECT_EQ(eval1, eval2);
  EXPECT_EQ(s.runtime->dropout_gen->offset(), off0);
  s.set_training(true);
  const std::vector<double> train1 = model->forward(batch, opt).logits.to_f64();
  const std::vector<double> train2 = model->forward(batch, opt).logits.to_f64();
  EXPECT_NE(train1, eval1);
  EXPECT_NE(train1, train2);  // a fresh mask per forward
  // 2 layers x (q, v): each draws T x hidden values.
  const uint64_t per_forward = 4 * ((15 * 64 + 3) / 4);
  EXPECT_EQ(s.runtime->dropout_gen->offset(), off0 + 2 * per_forward);
  s.set_adapters_enabled(false);
  Tensor plain = model->forward(batch, opt).logits;
  remove_peft(*model);
  EXPECT_EQ(plain.to_f64(), model->forward(batch, opt).logits.to_f64());
}

TEST(LoraModel, GradientCheckpointingReplaysTheDropoutMasks) {
  auto model = load_fixture("llama_gqa");
  PeftConfig cfg;
  cfg.lora_dropout = 0.2;
  cfg.target_modules = {"all-linear"};
  PeftSetup s = apply_peft(cfg, *model, 10);
  randomize_b(s, 11, 0.3);
  const Batch batch = small_batch(model->config().vocab_size);
  auto grads = [&](bool checkpointing) {
    s.runtime->dropout_gen->set_offset(1000);
    ForwardOptions opt;
    opt.gradient_checkpointing = checkpointing;
    model->forward(batch, opt).loss.backward();
    std::vector<std::vector<double>> out;
    for (auto& [name, t] : s.trainable_parameters(*model)) {
      out.push_back(t.grad().to_f64());
      t.zero_grad();
    }
    return std::make_pair(out, s.runtime->dropout_gen->offset());
  };
  const auto [plain, off_plain] = grads(false);
  const auto [ckpt, off_ckpt] = grads(true);
  EXPECT_EQ(off_plain, off_ckpt);
  ASSERT_EQ(plain.size(), ckpt.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    Tensor a = Tensor::from_vector(ckpt[i], {static_cast<int64_t>(ckpt[i].size())});
    Tensor e = Tensor::from_vector(plain[i], {static_cast<int64_t>(plain[i].size())});
    EXPECT_TRUE(testing::all_close(a, e, 1e-7, 1e-5)) << i;
  }
}

// A stand-in for a quantized weight: the dense weight behind the LinearBase interface.
class DenseAsBase final : public LinearBase {
 public:
  explicit DenseAsBase(Tensor w) : w_(std::move(w)) {}
  Tensor forward(const Tensor& x, const Tensor& bias) const override {
    return kernels::linear(x, w_, bias);
  }
  Tensor dequantize(DType dtype) const override { return w_.to(dtype); }
  int64_t storage_bytes() const override { return static_cast<int64_t>(w_.nbytes()); }
  std::string kind() const override { return "dense-test"; }

 private:
  Tensor w_;
};

TEST(LoraModel, WorksOnAQuantizedBase) {
  auto model = load_fixture("llama_gqa");
  PeftConfig cfg;
  cfg.target_modules = {"o_proj", "up_proj"};
  cfg.lora_dropout = 0.0;
  PeftSetup s = apply_peft(cfg, *model, 12);
  randomize_b(s, 13);
  const Batch batch = small_batch(model->config().vocab_size);
  ForwardOptions opt;
  opt.need_logits = true;
  const ForwardResult dense = model->forward(batch, opt);
  dense.loss.backward();
  std::vector<std::vector<double>> dense_grads;
  for (auto& [name, t] : s.trainable_parameters(*model)) {
    dense_grads.push_back(t.grad().to_f64());
    t.zero_grad();
  }
  for (LinearModule* m : model->linear_modules()) {
    if (m->name == "lm_head") continue;
    m->base = std::make_shared<DenseAsBase>(m->weight);
    m->weight = Tensor();
  }
  const ForwardResult quant = model->forward(batch, opt);
  EXPECT_EQ(quant.logits.to_f64(), dense.logits.to_f64());
  quant.loss.backward();
  size_t i = 0;
  for (auto& [name, t] : s.trainable_parameters(*model))
    EXPECT_EQ(t.grad().to_f64(), dense_grads[i++]) << name;
}

TEST(LoraModel, DeltaWeightIsScaledBA) {
  auto runtime = std::make_shared<LoraRuntime>();
  LoraAdapter a("m", 5, 3, 2, 6, false, 0.0, Device::cpu(), DType::kF64, runtime);
  Generator g(1);
  a.reset_parameters(g);
  normal_(a.lora_B(), g);
  Tensor expect = ops::scale(ops::matmul(a.lora_B(), a.lora_A()), 3.0);
  EXPECT_TRUE(testing::all_close(a.delta_weight(DType::kF64), expect, 1e-15, 1e-15));
  // x (W + delta)^T equals the adapted forward.
  Tensor w = testing::randn({3, 5}, DType::kF64, 2);
  Tensor x = testing::randn({4, 5}, DType::kF64, 3);
  Tensor merged = kernels::linear(x, ops::add(w, a.delta_weight(DType::kF64)));
  EXPECT_TRUE(testing::all_close(a.forward(x, kernels::linear(x, w)), merged, 1e-12, 1e-12));
}

TEST(LoraModel, RejectsBadTargets) {
  auto model = load_fixture("llama_gqa");
  PeftConfig cfg;
  cfg.target_modules = {"q_prj"};
  try {
    apply_peft(cfg, *model, 1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("'q_prj' matches no linear layer"), std::string::npos)
        << e.what();
  }
  cfg.target_modules = {"lm_head"};
  EXPECT_THROW(apply_peft(cfg, *model, 1), Error);
  cfg.target_modules = {"all-linear", "q_proj"};
  EXPECT_THROW(apply_peft(cfg, *model, 1), Error);
  cfg.target_modules = {};
  cfg.lora_dropout = 1.0;
  EXPECT_THROW(apply_peft(cfg, *model, 1), Error);
}

// all-linear is every linear layer but the output head, as PEFT resolves it.
TEST(LoraModel, AllLinearSkipsTheHead) {
  auto model = load_fixture("llama_gqa");
  PeftConfig cfg;
  cfg.target_modules = {"all-linear"};
  PeftSetup s = apply_peft(cfg, *model, 1);
  EXPECT_EQ(s.adapters.size(), 14u);
  for (const auto& a : s.adapters) EXPECT_NE(a->module_name(), "lm_head");
  EXPECT_EQ(s.config_target_modules(),
            (std::vector<std::string>{"down_proj", "gate_proj", "k_proj", "o_proj", "q_proj",
                                      "up_proj", "v_proj"}));
}

}  // namespace
}  // namespace leantune
