// Streaming weight loading and saving (CPU), measured on the process's resident memory: a model
// of 566 MB in f32 is loaded into the CPU allocator (its tensors stay there, as on a device) and
// the peak RSS grows by the model once plus at most its largest tensor and a small margin. Before
// streaming, the file's mapped pages stayed resident beside the allocator's copy until the load
// ended: twice the model. Saving converts and copies one tensor at a time, so the peak grows by
// at most the largest converted tensor. The file is written by this test with plain writes (no
// allocator blocks, which would stay cached and hide the load's growth), and each TEST runs in a
// process of its own (gtest_discover_tests), so the peak measured is the load's.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loaders/model_config.h"
#include "models/decoder.h"
#include "models/quantize_model.h"
#include "testing/testing.h"

namespace leantune {
namespace {

constexpr int64_t kHidden = 1024, kInter = 2816, kLayers = 6, kVocab = 32000;

// A field of /proc/self/status in bytes (VmRSS, VmHWM, RssFile, ...).
int64_t status_bytes(const std::string& field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  return -1;
}

// Starts a new peak (VmHWM := VmRSS); false where the kernel does not allow it.
bool reset_peak() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

struct Written {
  std::string dir;
  int64_t bytes = 0, largest = 0;
};

// An untied Llama (1024 x 2816, 6 layers, 32k vocabulary: 141M parameters) as one f32 safetensors
// file, its values a small pattern, written through a 1 MiB buffer.
Written write_model() {
  Written w;
  w.dir = testing::temp_dir("streaming_model");
  const nlohmann::json cfg = {{"architectures", {"LlamaForCausalLM"}},
                              {"model_type", "llama"},
                              {"hidden_size", kHidden},
                              {"intermediate_size", kInter},
                              {"num_hidden_layers", kLayers},
                              {"num_attention_heads", 8},
                              {"num_key_value_heads", 8},
                              {"max_position_embeddings", 2048},
                              {"rms_norm_eps", 1e-5},
                              {"tie_word_embeddings", false},
                              {"vocab_size", kVocab},
                              {"torch_dtype", "float32"}};
  std::ofstream(w.dir + "/config.json") << cfg.dump(2);
  std::vector<std::pair<std::string, std::vector<int64_t>>> tensors = {
      {"model.embed_tokens.weight", {kVocab, kHidden}},
      {"model.norm.weight", {kHidden}},
      {"lm_head.weight", {kVocab, kHidden}}};
  for (int64_t l = 0; l < kLayers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const char* n : {"q_proj", "k_proj", "v_proj", "o_proj"})
      tensors.push_back({p + "self_attn." + n + ".weight", {kHidden, kHidden}});
    tensors.push_back({p + "mlp.gate_proj.weight", {kInter, kHidden}});
    tensors.push_back({p + "mlp.up_proj.weight", {kInter, kHidden}});
    tensors.push_back({p + "mlp.down_proj.weight", {kHidden, kInter}});
    tensors.push_back({p + "input_layernorm.weight", {kHidden}});
    tensors.push_back({p + "post_attention_layernorm.weight", {kHidden}});
  }
  nlohmann::json header = nlohmann::json::object();
  int64_t offset = 0;
  for (const auto& [name, shape] : tensors) {
    int64_t n = 4;
    for (int64_t d : shape) n *= d;
    header[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
    w.largest = std::max(w.largest, n);
  }
  w.bytes = offset;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::FILE* f = std::fopen((w.dir + "/model.safetensors").c_str(), "wb");
  LT_CHECK(f != nullptr, "cannot write the test model");
  uint64_t len = text.size();
  std::fwrite(&len, 8, 1, f);
  std::fwrite(text.data(), 1, text.size(), f);
  std::vector<float> buf(1 << 18);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = 0.01f * static_cast<float>(i % 97) - 0.48f;
  for (int64_t left = offset; left > 0;) {
    const int64_t n = std::min<int64_t>(left, static_cast<int64_t>(buf.size() * 4));
    std::fwrite(buf.data(), 1, static_cast<size_t>(n), f);
    left -= n;
  }
  std::fclose(f);
  return w;
}

constexpr int64_t kMargin = int64_t{64} << 20;

TEST(StreamingLoad, PeakRssGrowsByTheModelOnceNotTwice) {
  const Written w = write_model();
  ASSERT_TRUE(reset_peak()) << "/proc/self/clear_refs refused";
  const int64_t before = status_bytes("VmRSS"), file_before = status_bytes("RssFile");
  std::unique_ptr<DecoderModel> m = DecoderModel::load(w.dir, Device::cpu(), DType::kF32);
  const int64_t growth = status_bytes("VmHWM") - before;
  const int64_t file_after = status_bytes("RssFile");
  std::printf(
      "model %.1f MiB (largest tensor %.1f MiB): peak RSS grew by %.1f MiB, file pages "
      "resident after loading %.1f MiB\n",
      w.bytes / 1048576.0, w.largest / 1048576.0, growth / 1048576.0,
      (file_after - file_before) / 1048576.0);
  EXPECT_EQ(m->embed_tokens().to_f32()[5], 0.01f * 5 - 0.48f);  // the first tensor in the file
  // The allocator's copy is resident (the measurement sees the model) ...
  EXPECT_GE(growth, w.bytes * 9 / 10);
  // ... and the file's pages never were on top of it.
  EXPECT_LE(growth, w.bytes + w.largest + kMargin);
  EXPECT_LE(file_after - file_before, kMargin);
}

TEST(StreamingLoad, QuantizedLoadHoldsOneDenseWeightAtATime) {
  const Written w = write_model();
  QuantConfig q;
  q.load_in_4bit = true;
  q.compute_dtype = DType::kF32;
  ASSERT_TRUE(reset_peak());
  const int64_t before = status_bytes("VmRSS");
  QuantizeReport report;
  std::shared_ptr<DecoderModel> m = load_quantized(w.dir, Device::cpu(), DType::kF32, q, &report);
  const int64_t growth = status_bytes("VmHWM") - before;
  // Kept: embedding, head and norms dense, the projections in NF4.
  const int64_t kept = w.bytes - report.dense_bytes + report.quantized_bytes;
  std::printf("quantized model %.1f MiB kept: peak RSS grew by %.1f MiB\n", kept / 1048576.0,
              growth / 1048576.0);
  EXPECT_GE(growth, kept * 9 / 10);
  EXPECT_LE(growth, kept + w.largest + kMargin);
}

TEST(StreamingLoad, SavingHoldsOneConvertedTensorAtATime) {
  const Written w = write_model();
  std::unique_ptr<DecoderModel> m = DecoderModel::load(w.dir, Device::cpu(), DType::kF32);
  ASSERT_TRUE(reset_peak());
  const int64_t before = status_bytes("VmRSS");
  const std::string out = testing::temp_dir("streaming_saved");
  m->save(out, DType::kBF16);
  const int64_t growth = status_bytes("VmHWM") - before;
  std::printf("saving in bf16 (%.1f MiB written): peak RSS grew by %.1f MiB\n",
              w.bytes / 2 / 1048576.0, growth / 1048576.0);
  // One bf16 tensor (the largest is half its f32 size) and the writer's buffers.
  EXPECT_LE(growth, w.largest / 2 + kMargin);
  std::unique_ptr<DecoderModel> back = DecoderModel::load(out, Device::cpu(), DType::kF32);
  EXPECT_NEAR(back->layer(0).q_proj.weight.to_f32()[7], m->layer(0).q_proj.weight.to_f32()[7],
              4e-3);
}

}  // namespace
}  // namespace leantune
