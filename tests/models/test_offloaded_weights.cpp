// A model whose decoder layers live in pinned host memory (models/offloaded_weights.h): its hidden
// states are the dense model's bit for bit (the same weights and kernels), with and without
// prefetching, forward after forward; at most two layers are on the device at once; the device
// holds the outer unit only between forwards (plus the prefetched first layer); the host copies
// hold every layer; a layer used twice in a nest is copied once. The GPU tier runs the same on
// cuda:0 (the prefetch then overlaps on the copy stream).
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "engine/allocator.h"
#include "engine/autograd.h"
#include "loaders/model_config.h"
#include "models/decoder.h"
#include "models/offloaded_weights.h"
#include "models/quantize_model.h"
#include "testing/testing.h"

namespace leantune {
namespace {

// A 3-layer Llama-style model with odd sizes, saved by this test.
std::string tiny_model_dir() {
  const std::string dir = testing::temp_dir("offloaded_weights_model");
  std::ofstream(dir + "/config.json") << R"({"architectures": ["LlamaForCausalLM"],
      "model_type": "llama", "hidden_size": 40, "intermediate_size": 71, "num_hidden_layers": 3,
      "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
      "rope_theta": 10000.0, "rms_norm_eps": 1e-05, "vocab_size": 229,
      "tie_word_embeddings": false, "torch_dtype": "float32"})";
  DecoderModel m(ModelConfig::load(dir), Device::cpu(), DType::kF32);
  m.init_random(11);
  m.save(dir, DType::kF32);
  return dir;
}

constexpr double kRound = 512;

int64_t param_bytes_on(Device dev) { return allocator(dev).stats().tag(MemTag::kParam).current; }

void check_offloaded(Device dev, DType dtype) {
  const std::string dir = tiny_model_dir();
  NoGradGuard ng;
  const std::vector<int64_t> ids = {5, 9, 200, 3, 17, 88, 1, 2, 3, 4, 5};
  const Tensor x = Tensor::from_vector(ids, {11}).to(dev);
  const Tensor pos = Tensor::from_vector<int64_t>({0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4}, {11}).to(dev);
  const Tensor cu = Tensor::from_vector<int32_t>({0, 6, 11}, {3}).to(dev);
  const std::vector<double> want = [&] {
    auto dense = DecoderModel::load(dir, dev, dtype);
    return dense->hidden_states(x, pos, cu, 6, false).to_f64();
  }();
  for (bool prefetch : {true, false}) {
    SCOPED_TRACE(prefetch ? "prefetch" : "no prefetch");
    const int64_t before = param_bytes_on(dev);
    const int64_t pinned_before = pinned_allocator().stats().tag(MemTag::kParam).current;
    OffloadedModel om = load_offloaded(dir, dev, dtype, prefetch);
    const OffloadedWeightsStats& st = om.weights->stats();
    // Every layer's bytes are in pinned memory; the device holds the outer unit only.
    // The allocators round each block up (at most kRound bytes): 9 tensors per layer, 3 outer.
    EXPECT_NEAR(pinned_allocator().stats().tag(MemTag::kParam).current - pinned_before,
                st.host_bytes, 27.0 * kRound);
    const int64_t outer = (229 * 40 * 2 + 40) * static_cast<int64_t>(dtype_size(dtype));
    EXPECT_NEAR(param_bytes_on(dev) - before, outer, 3.0 * kRound);
    EXPECT_EQ(st.host_bytes, 3 * st.layer_bytes_max);
    for (int pass = 0; pass < 3; ++pass)
      EXPECT_EQ(om.model->hidden_states(x, pos, cu, 6, false).to_f64(), want) << "pass " << pass;
    EXPECT_EQ(st.resident_peak, (prefetch ? 2 : 1) * st.layer_bytes_max);
    EXPECT_EQ(st.bytes_copied, (prefetch ? 10 : 9) * st.layer_bytes_max);  // 9 uses, + 1 ahead
    EXPECT_EQ(st.layers_prefetched, prefetch ? 8 : 0);  // all but the very first use
    // Between forwards: the outer unit, and the first layer when it was prefetched.
    EXPECT_NEAR(param_bytes_on(dev) - before, outer + (prefetch ? st.layer_bytes_max : 0),
                12.0 * kRound);
    // A nested use of a layer copies nothing more.
    const int64_t copied = st.bytes_copied;
    om.weights->acquire(1);
    om.weights->acquire(1);
    om.weights->release(1);
    om.weights->release(1);
    EXPECT_EQ(st.bytes_copied - copied, (prefetch ? 2 : 1) * st.layer_bytes_max);
    EXPECT_THROW(om.weights->release(1), Error);
  }
}

TEST(OffloadedWeights, SameHiddenStatesWithAtMostTwoLayersResident) {
  check_offloaded(Device::cpu(), DType::kF32);
}

TEST(OffloadedWeightsCuda, SameHiddenStatesWithAtMostTwoLayersResident) {
  LT_SKIP_WITHOUT_CUDA();
  check_offloaded(Device::cuda(0), DType::kBF16);
}

// Quantized layers offloaded: the hidden states of load_quantized's model, bit for bit; the host
// holds the stored form (about a quarter of f32 for NF4 with its quant state).
TEST(OffloadedWeights, QuantizedLayersMoveInTheirStoredForm) {
  const std::string dir = tiny_model_dir();
  NoGradGuard ng;
  const Tensor x = Tensor::from_vector<int64_t>({5, 9, 200, 3, 17, 88, 1}, {7});
  const Tensor pos = Tensor::from_vector<int64_t>({0, 1, 2, 3, 0, 1, 2}, {7});
  const Tensor cu = Tensor::from_vector<int32_t>({0, 4, 7}, {3});
  for (const bool nf4 : {true, false}) {
    SCOPED_TRACE(nf4 ? "nf4" : "int8");
    QuantConfig q;
    q.load_in_4bit = nf4;
    q.load_in_8bit = !nf4;
    q.compute_dtype = DType::kF32;
    const std::vector<double> want = load_quantized(dir, Device::cpu(), DType::kF32, q)
                                         ->hidden_states(x, pos, cu, 4, false)
                                         .to_f64();
    OffloadedModel om = load_offloaded(dir, Device::cpu(), DType::kF32, true, q);
    EXPECT_EQ(om.model->hidden_states(x, pos, cu, 4, false).to_f64(), want);
    EXPECT_EQ(om.model->hidden_states(x, pos, cu, 4, false).to_f64(), want);
    // Per layer: 7 projections of 40x40, 20x40 (twice), 40x40, 71x40 (twice), 40x71 quantized,
    // and two f32 norms of 40.
    const int64_t dense = (40 * 40 * 2 + 20 * 40 * 2 + 71 * 40 * 3) * 4 + 2 * 40 * 4;
    EXPECT_LT(om.weights->stats().layer_bytes_max, nf4 ? dense / 4 : dense / 2);
    EXPECT_EQ(om.weights->stats().resident_peak, 2 * om.weights->stats().layer_bytes_max);
  }
}

TEST(OffloadedWeights, MissingTensorsAreNamed) {
  const std::string dir = tiny_model_dir();
  const std::string bad = testing::temp_dir("offloaded_weights_bad");
  {
    DecoderModel m(ModelConfig::load(dir), Device::cpu(), DType::kF32);
    m.init_random(1);
    m.save(bad, DType::kF32);
  }
  std::ofstream(bad + "/config.json")
      << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 40,
      "intermediate_size": 71, "num_hidden_layers": 4, "num_attention_heads": 4,
      "num_key_value_heads": 2, "max_position_embeddings": 64, "rope_theta": 10000.0,
      "rms_norm_eps": 1e-05, "vocab_size": 229, "tie_word_embeddings": false})";
  try {
    load_offloaded(bad, Device::cpu(), DType::kF32);
    FAIL() << "a checkpoint without layer 3 loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.3."), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace leantune
