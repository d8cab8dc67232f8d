// Trainable tokens (models/trainable_tokens.h): after AdamW steps on a causal-LM loss only the
// listed embedding rows (and, tied, head rows) change, every other row stays bit-identical, the
// frozen matrix itself is untouched, and optimizer state exists for the delta only; the forward
// reads delta rows exactly; gradients match central differences in f64 (embedding and tied-head
// paths); bad index lists are rejected by name.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/optim.h"
#include "kernels/embedding.h"
#include "models/decoder.h"
#include "models/peft_io.h"
#include "models/trainable_tokens.h"
#include "testing/testing.h"

namespace leantune {
namespace {

const std::vector<int64_t> kTokens = {5, 6, 7, 120, 201};

std::unique_ptr<DecoderModel> load_fixture(const std::string& name, DType dt = DType::kF32) {
  return DecoderModel::load(testing::fixture_path("models/" + name + "/model"), Device::cpu(), dt);
}

// Two sequences in which every listed token occurs (one of them three times).
Batch token_batch() {
  std::vector<int64_t> ids = {1, 5, 40, 6, 77, 7, 120, 9, 201, 5, 33, 12, 5, 90, 201, 64};
  std::vector<int64_t> pos;
  for (int64_t i = 0; i < 9; ++i) pos.push_back(i);
  for (int64_t i = 0; i < 7; ++i) pos.push_back(i);
  Batch b;
  b.input_ids = Tensor::from_vector(ids, {16});
  b.labels = Tensor::from_vector(ids, {16});
  b.position_ids = Tensor::from_vector(pos, {16});
  b.cu_seqlens = Tensor::from_vector(std::vector<int32_t>{0, 9, 16}, {3});
  b.max_seqlen = 9;
  return b;
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  Tensor c = t.contiguous();
  std::vector<uint8_t> out(c.nbytes());
  std::memcpy(out.data(), c.data_ptr(), out.size());
  return out;
}

std::vector<uint8_t> row_bytes(const Tensor& w, int64_t row) {
  return bytes_of(w.narrow(0, row, 1));
}

class TrainableTokensTraining : public ::testing::TestWithParam<std::string> {};

TEST_P(TrainableTokensTraining, OnlyListedRowsChange) {
  auto model = load_fixture(GetParam());
  const Tensor embed_before = model->embed_tokens().clone(MemTag::kOther);
  const std::vector<uint8_t> frozen_bytes = bytes_of(embed_before);
  const Tensor head_before = model->lm_head_weight().clone(MemTag::kOther);
  PeftConfig cfg;
  cfg.target_modules = {"q_proj"};
  cfg.trainable_token_indices = kTokens;
  PeftSetup s = apply_peft(cfg, *model, 3);
  ASSERT_NE(s.tokens, nullptr);
  EXPECT_EQ(s.tokens->delta().shape(), (Shape{5, model->config().hidden_size}));

  std::vector<AdamW::Param> params;
  for (const auto& [name, t] : s.trainable_parameters(*model)) params.push_back({name, t, true});
  AdamW opt(params, AdamWConfig{1e-2, 0.9, 0.999, 1e-8, 0.1});
  const Batch batch = token_batch();
  for (int step = 0; step < 4; ++step) {
    model->forward(batch).loss.backward();
    opt.step(1e-2);
    for (auto& p : params) p.tensor.zero_grad();
  }

  // The frozen matrix is untouched, byte for byte, and got no gradient.
  EXPECT_EQ(bytes_of(model->embed_tokens()), frozen_bytes);
  EXPECT_FALSE(model->embed_tokens().grad().defined());
  // The matrix the model now uses: listed rows changed, all others bit-identical.
  const Tensor merged = s.tokens->merged(model->embed_tokens());
  for (int64_t v = 0; v < model->config().vocab_size; ++v) {
    const bool listed = std::find(kTokens.begin(), kTokens.end(), v) != kTokens.end();
    if (listed)
      EXPECT_NE(row_bytes(merged, v), row_bytes(embed_before, v)) << "token " << v;
    else
      ASSERT_EQ(row_bytes(merged, v), row_bytes(embed_before, v)) << "token " << v;
  }
  for (const auto& [name, t] : merged_parameters(s, *model, DType::kF32)) {
    if (name == "model.embed_tokens.weight") {
      EXPECT_EQ(bytes_of(t), bytes_of(merged));
    }
  }
  // The head: tied, it follows the embedding; untied, it is untouched.
  {
    NoGradGuard ng;
    const Tensor head = model->lm_head_weight();
    if (model->tied())
      EXPECT_EQ(bytes_of(head), bytes_of(merged));
    else
      EXPECT_EQ(bytes_of(head), bytes_of(head_before));
  }
  // Optimizer state: only for the trainable tensors; the token part is [5, H].
  int64_t state_elems = 0, expected_elems = 0;
  bool saw_delta = false;
  for (const auto& [name, t] : opt.state_tensors()) {
    EXPECT_EQ(name.find("model.embed_tokens.weight"), std::string::npos) << name;
    state_elems += t.numel();
    if (name == std::string(kTrainableTokensKey) + ".exp_avg") {
      EXPECT_EQ(t.shape(), s.tokens->delta().shape());
      saw_delta = true;
    }
  }
  for (const auto& [name, t] : s.trainable_parameters(*model)) expected_elems += 2 * t.numel();
  EXPECT_TRUE(saw_delta);
  EXPECT_EQ(state_elems, expected_elems);
}

INSTANTIATE_TEST_SUITE_P(Models, TrainableTokensTraining,
                         ::testing::Values("qwen2_tied", "llama_gqa"));

TEST(TrainableTokens, ForwardReadsDeltaRowsExactly) {
  auto model = load_fixture("qwen2_tied");
  auto tokens = std::make_shared<TrainableTokens>(*model, std::vector<int64_t>{7, 3, 4, 200});
  {
    NoGradGuard ng;
    Generator g(1);
    normal_(tokens->delta(), g);
  }
  const Tensor w = model->embed_tokens();
  Tensor ids = Tensor::from_vector(std::vector<int64_t>{3, 8, 200, 3, 0, 4, 7, 255}, {8});
  Tensor y = tokens->embed(w, ids);
  const std::vector<int64_t> row = {1, -1, 3, 1, -1, 2, 0, -1};  // delta row or -1
  const std::vector<int64_t> id = ids.to_i64();
  for (int64_t t = 0; t < 8; ++t) {
    const std::vector<uint8_t> expect =
        row[t] >= 0 ? row_bytes(tokens->delta(), row[t]) : row_bytes(w, id[t]);
    EXPECT_EQ(row_bytes(y, t), expect) << "position " << t;
  }
  Tensor m = tokens->matrix(w);
  EXPECT_EQ(row_bytes(m, 200), row_bytes(tokens->delta(), 3));
  EXPECT_EQ(row_bytes(m, 5), row_bytes(w, 5));
  // No listed id in the batch: the plain lookup.
  Tensor plain_ids = Tensor::from_vector(std::vector<int64_t>{1, 2}, {2});
  EXPECT_EQ(bytes_of(tokens->embed(w, plain_ids)), bytes_of(kernels::embedding(w, plain_ids)));
  tokens->set_enabled(false);
  EXPECT_EQ(bytes_of(tokens->embed(w, ids)), bytes_of(kernels::embedding(w, ids)));
}

// d loss / d delta against central differences in f64, through the embedding and (tied) the
// head.
class TrainableTokensGradient : public ::testing::TestWithParam<std::string> {};

TEST_P(TrainableTokensGradient, MatchesFiniteDifferencesF64) {
  auto model = load_fixture(GetParam(), DType::kF64);
  PeftConfig cfg;
  cfg.target_modules = {"v_proj"};
  cfg.lora_dropout = 0.0;  // every evaluation must see the same function
  cfg.trainable_token_indices = kTokens;
  PeftSetup s = apply_peft(cfg, *model, 4);
  const Batch batch = token_batch();
  model->forward(batch).loss.backward();
  const Tensor delta = s.tokens->delta();
  const std::vector<double> g = delta.grad().to_f64();
  auto loss = [&]() {
    NoGradGuard ng;
    return model->forward(batch).loss.item();
  };
  const double eps = 1e-6;
  const int64_t h = delta.size(1);
  for (int64_t j = 0; j < delta.size(0); ++j)
    for (int64_t c : {int64_t{0}, h / 2, h - 1}) {
      Tensor e = delta.detach().narrow(0, j, 1).narrow(1, c, 1);
      const double v = e.item();
      e.fill_(v + eps);
      const double lp = loss();
      e.fill_(v - eps);
      const double lm = loss();
      e.fill_(v);
      const double fd = (lp - lm) / (2 * eps);
      EXPECT_NEAR(g[j * h + c], fd, 1e-8 + 1e-5 * std::fabs(fd)) << "row " << j << " col " << c;
    }
}

INSTANTIATE_TEST_SUITE_P(Models, TrainableTokensGradient,
                         ::testing::Values("qwen2_tied", "llama_gqa"));

TEST(TrainableTokens, RejectsBadIndexLists) {
  auto model = load_fixture("llama_gqa");
  try {
    TrainableTokens t(*model, {3, 4, 3});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("token 3 is listed twice"), std::string::npos);
  }
  EXPECT_THROW(TrainableTokens(*model, {256}), Error);
  EXPECT_THROW(TrainableTokens(*model, {-1}), Error);
  PeftConfig cfg;
  cfg.trainable_token_indices = {4};
  cfg.modules_to_save = {"embed_tokens"};
  EXPECT_THROW(apply_peft(cfg, *model, 1), Error);
}

}  // namespace
}  // namespace leantune
