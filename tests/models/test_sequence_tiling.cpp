// Sequence tiling (models/sequence_tiling.h, engine/tiled.h) on small decoders (CPU, f32): the
// tiled layers give the untiled loss and gradients, for full training, LoRA (with dropout: the
// same masks) and QLoRA, with and without gradient checkpointing and activation offloading, on
// a Llama (SwiGLU), a Gemma 3 (GeGLU, sandwich and q/k norms, soft-caps, sliding windows) and a
// Phi-3 (fused qkv and gate_up, longrope, partial rotary). What must match how:
//   - the loss and every gradient outside the tiled regions (embedding, final norm, LM head):
//     bit for bit (the blocks compute each row as the untiled kernels do);
//   - a weight gradient of the tiled regions (projections, norm weights, LoRA A and B): the
//     blocks' sums in another order: max |difference| <= 1e-6 x max |gradient| per tensor.
// Also: a parameter's gradient reaches its accumulator once per backward (an optimizer in
// backward sees it complete), and tiling lowers the activation peak of a long sequence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/offload.h"
#include "engine/rng.h"
#include "engine/tiled.h"
#include "kernels/cross_entropy.h"
#include "loaders/fs_util.h"
#include "loaders/model_config.h"
#include "models/decoder.h"
#include "models/peft_io.h"
#include "models/quantize_model.h"
#include "testing/testing.h"

namespace leantune {
namespace {

enum class Train { kFull, kLora, kQlora };

struct Setup {
  std::string fixture;
  Train train;
};

// The fixture's family at shapes where every block's products take OpenBLAS's regular kernels
// (its small-matrix kernels, for M x N x K <= 1e6, sum in another order than the large ones).
ModelConfig scaled_config(const std::string& fixture) {
  nlohmann::json j =
      read_json_file(testing::fixture_path("models/" + fixture + "/model/config.json"));
  j["hidden_size"] = 256;
  j["intermediate_size"] = 512;
  j["head_dim"] = 64;
  j["max_position_embeddings"] = 1024;
  if (j.contains("query_pre_attn_scalar")) j["query_pre_attn_scalar"] = 64;
  if (j.contains("rope_parameters") && j["rope_parameters"].contains("short_factor")) {
    // Longrope: a factor per rotated pair (partial_rotary_factor x head_dim / 2).
    const auto pairs = static_cast<size_t>(64 * j.value("partial_rotary_factor", 1.0) / 2);
    std::vector<double> s(pairs), l(pairs);
    for (size_t i = 0; i < pairs; ++i) {
      s[i] = 1.0 + 0.05 * static_cast<double>(i);
      l[i] = 1.5 + 0.1 * static_cast<double>(i);
    }
    j["rope_parameters"]["short_factor"] = s;
    j["rope_parameters"]["long_factor"] = l;
    j["rope_parameters"]["original_max_position_embeddings"] = 64;
    j["original_max_position_embeddings"] = 64;
  }
  return ModelConfig::from_json(j, fixture);
}

std::shared_ptr<DecoderModel> make_model(const Setup& s) {
  const ModelConfig cfg = scaled_config(s.fixture);
  auto m = std::make_shared<DecoderModel>(cfg, Device::cpu(), DType::kF32);
  m->init_random(7);
  if (s.train == Train::kQlora) {
    QuantConfig q;
    q.load_in_4bit = true;
    q.compute_dtype = DType::kF32;
    quantize_model(*m, q);
  }
  m->set_requires_grad(true);
  return m;
}

PeftSetup make_peft(DecoderModel& m) {
  PeftConfig p;
  p.r = 16;
  p.lora_alpha = 32;
  p.lora_dropout = 0.1;  // tiled blocks draw the untiled masks
  p.target_modules = {"all-linear"};
  PeftSetup setup = apply_peft(p, m, 5);
  // B starts at zero: give it values so that A's gradient is not zero.
  Generator gen(3);
  NoGradGuard ng;
  for (const auto& a : setup.adapters) normal_(a->lora_B(), gen, 0.0, 0.05);
  return setup;
}

// Three sequences of 250, 350 and 90 tokens: 690 rows, not a multiple of the blocks.
Batch make_batch(int64_t vocab, const std::vector<int64_t>& lengths = {250, 350, 90}) {
  Generator gen(11);
  std::vector<int64_t> ids, pos, labels;
  std::vector<int32_t> cu = {0};
  int64_t longest = 0;
  for (int64_t len : lengths) {
    for (int64_t i = 0; i < len; ++i) {
      const auto id = static_cast<int64_t>(gen.next_below(static_cast<uint64_t>(vocab)));
      ids.push_back(id);
      pos.push_back(i);
      labels.push_back(i % 7 == 3 ? kernels::kIgnoreIndex : id);
    }
    cu.push_back(cu.back() + static_cast<int32_t>(len));
    longest = std::max(longest, len);
  }
  const auto t = static_cast<int64_t>(ids.size());
  Batch b;
  b.input_ids = Tensor::from_vector(ids, {t});
  b.position_ids = Tensor::from_vector(pos, {t});
  b.labels = Tensor::from_vector(labels, {t});
  b.cu_seqlens = Tensor::from_vector(cu, {static_cast<int64_t>(cu.size())});
  b.max_seqlen = longest;
  return b;
}

struct Step {
  double loss = 0;
  std::map<std::string, std::vector<float>> grads;
  int64_t activation_peak = 0;
};

Step run_step(DecoderModel& m, const std::vector<std::pair<std::string, Tensor>>& params,
              const Batch& b, int64_t chunk, bool ckpt, bool offload) {
  for (auto [name, p] : params) p.zero_grad();
  m.set_sequence_tiling({chunk > 0 ? TilingMode::kOn : TilingMode::kOff, chunk});
  Allocator& alloc = allocator(Device::cpu());
  alloc.reset_peak_stats();
  const int64_t before = alloc.stats().tag(MemTag::kActivation).current;
  Step r;
  {
    std::optional<ActivationOffloader> off;
    if (offload) off.emplace();
    ForwardOptions fo;
    fo.gradient_checkpointing = ckpt;
    Tensor loss = m.forward(b, fo).loss;
    r.loss = loss.item();
    loss.backward();
  }
  r.activation_peak = alloc.stats().tag(MemTag::kActivation).peak - before;
  for (const auto& [name, p] : params)
    if (p.grad().defined()) r.grads[name] = p.grad().to_f32();
  return r;
}

bool in_tiled_region(const std::string& name) {
  return name.find("model.layers.") != std::string::npos;
}

// ||a - b|| / ||b|| over one tensor.
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, n = 0;
  for (size_t j = 0; j < a.size(); ++j) {
    const double e = static_cast<double>(a[j]) - b[j];
    d += e * e;
    n += static_cast<double>(b[j]) * b[j];
  }
  return n > 0 ? std::sqrt(d / n) : std::sqrt(d);
}

// exact: the loss and the gradients outside the tiled regions bit for bit (every product of the
// blocks takes the whole's kernels); else within 1e-6 like the region's weights.
void expect_matches(const Step& tiled, const Step& plain, bool exact, const std::string& what) {
  if (exact)
    EXPECT_EQ(tiled.loss, plain.loss) << what;
  else
    EXPECT_LE(std::abs(tiled.loss - plain.loss), 1e-6 * std::abs(plain.loss)) << what;
  ASSERT_EQ(tiled.grads.size(), plain.grads.size()) << what;
  for (const auto& [name, ge] : plain.grads) {
    const auto it = tiled.grads.find(name);
    ASSERT_NE(it, tiled.grads.end()) << what << ": no gradient for " << name;
    const std::vector<float>& g = it->second;
    ASSERT_EQ(g.size(), ge.size()) << name;
    double norm = 0;
    for (float v : ge) norm += static_cast<double>(v) * v;
    EXPECT_GT(norm, 0.0) << what << ": " << name << " has a zero gradient";
    if (exact && !in_tiled_region(name))
      EXPECT_EQ(std::memcmp(g.data(), ge.data(), g.size() * sizeof(float)), 0)
          << what << ": " << name << " is not bit-identical";
    else
      EXPECT_LE(relative_error(g, ge), 1e-6) << what << ": " << name;
  }
}

std::string setup_name(const Setup& s) {
  return s.fixture + (s.train == Train::kFull   ? "_full"
                      : s.train == Train::kLora ? "_lora"
                                                : "_qlora");
}

class SequenceTiling : public ::testing::TestWithParam<Setup> {};

TEST_P(SequenceTiling, LossAndGradientsEqualTheUntiledLayers) {
  std::shared_ptr<DecoderModel> m = make_model(GetParam());
  std::optional<PeftSetup> peft;
  if (GetParam().train != Train::kFull) peft = make_peft(*m);
  const auto params = peft ? peft->trainable_parameters(*m) : m->named_parameters();
  const Batch b = make_batch(m->config().vocab_size);
  for (bool ckpt : {false, true}) {
    for (bool offload : {false, true}) {
      // Every combination on the Llama; the other families with both or neither.
      if (GetParam().fixture != "llama_gqa" && ckpt != offload) continue;
      const std::string what = std::string("checkpointing ") + (ckpt ? "on" : "off") +
                               ", offloading " + (offload ? "on" : "off");
      // Dropout draws the same masks on every step only from the same generator offset.
      if (peft) peft->runtime->dropout_gen->set_offset(0);
      const Step plain = run_step(*m, params, b, 0, ckpt, offload);
      // Blocks of 128 rows (the last of 50), and of 200 (the last of 90) for one family.
      for (int64_t chunk : {int64_t{128}, int64_t{200}}) {
        if (chunk == 200 && GetParam().fixture != "llama_gqa") continue;
        if (peft) peft->runtime->dropout_gen->set_offset(0);
        const Step tiled = run_step(*m, params, b, chunk, ckpt, offload);
        expect_matches(tiled, plain, GetParam().train == Train::kFull,
                       what + ", chunk " + std::to_string(chunk));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Families, SequenceTiling,
    ::testing::Values(Setup{"llama_gqa", Train::kFull}, Setup{"llama_gqa", Train::kLora},
                      Setup{"llama_gqa", Train::kQlora}, Setup{"gemma3", Train::kFull},
                      Setup{"gemma3", Train::kLora}, Setup{"phi3", Train::kFull},
                      Setup{"phi3", Train::kLora}, Setup{"qwen3", Train::kFull}),
    [](const ::testing::TestParamInfo<Setup>& i) { return setup_name(i.param); });

// Observers that take a leaf's gradient as complete when it arrives (an optimizer in backward,
// a gradient reducer) see each parameter once, holding the sum over the blocks.
class CountLeafGrads final : public BackwardObserver {
 public:
  void after_node(Node& n) override {
    if (auto* acc = dynamic_cast<AccumulateGrad*>(&n)) ++seen[acc->leaf()];
  }
  std::map<const TensorImpl*, int> seen;
};

TEST(SequenceTilingEngine, EachParameterGradientArrivesOnce) {
  std::shared_ptr<DecoderModel> m = make_model({"llama_gqa", Train::kFull});
  const Batch b = make_batch(m->config().vocab_size, {300});
  for (bool ckpt : {false, true}) {
    CountLeafGrads count;
    add_backward_observer(&count);
    run_step(*m, m->named_parameters(), b, 128, ckpt, false);
    remove_backward_observer(&count);
    for (const auto& [name, p] : m->named_parameters())
      EXPECT_EQ(count.seen[p.impl()], 1) << name << ", checkpointing " << ckpt;
  }
}

TEST(SequenceTilingEngine, TilingLowersTheActivationPeakOfALongSequence) {
  std::shared_ptr<DecoderModel> m = make_model({"llama_gqa", Train::kFull});
  const Batch b = make_batch(m->config().vocab_size, {1200, 800});
  for (bool ckpt : {false, true}) {
    const Step plain = run_step(*m, m->named_parameters(), b, 0, ckpt, false);
    const Step tiled = run_step(*m, m->named_parameters(), b, 256, ckpt, false);
    EXPECT_EQ(tiled.loss, plain.loss);
    // The MLP's [T, 512] gate, up and activation (and their gradients) never exist whole.
    EXPECT_LT(tiled.activation_peak, plain.activation_peak * 0.8)
        << "checkpointing " << ckpt << ": " << tiled.activation_peak << " vs "
        << plain.activation_peak;
  }
}

// The attention hints a batch gives: its longest sequence (b.max_seqlen when set) and the rows
// its host cu_seqlens cover (attention on the CPU checks the latter against cu_seqlens).
TEST(SeqHints, LongestAndCoveredRowsOfTheHostsCuSeqlens) {
  Batch b;
  b.cu_seqlens = Tensor::from_vector(std::vector<int32_t>{0, 3, 8, 9}, {4});
  SeqHints h = seq_hints(b);
  EXPECT_EQ(h.longest, 5);
  EXPECT_EQ(h.total, 9);
  b.max_seqlen = 7;
  h = seq_hints(b);
  EXPECT_EQ(h.longest, 7);
  EXPECT_EQ(h.total, 9);
  const SeqHints bare(4);
  EXPECT_EQ(bare.longest, 4);
  EXPECT_EQ(bare.total, 0);
}

}  // namespace
}  // namespace leantune
