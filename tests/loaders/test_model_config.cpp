// config.json -> ModelConfig on the real Qwen2.5-0.5B-Instruct and Llama-3.2-1B-Instruct
// files, the benchmark configs (parameter counts as published for each model), transformers'
// defaults, rope scaling variants, the written-back form, and the errors for bad configs.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "engine/check.h"
#include "loaders/fs_util.h"
#include "loaders/model_config.h"
#include "testing/testing.h"

namespace leantune {
namespace {

using nlohmann::json;

ModelConfig parse(const std::string& text) {
  return ModelConfig::from_json(json::parse(text), "test/config.json");
}

std::string input_error(const std::string& text) {
  try {
    parse(text);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput) << e.what();
    EXPECT_NE(std::string(e.what()).find("test/config.json"), std::string::npos) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "accepted: " << text;
  return "";
}

const char* kMinimalLlama =
    R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100})";

TEST(ModelConfig, Qwen25HalfBillion) {
  const ModelConfig c = ModelConfig::load(testing::fixture_path("configs/qwen2.5-0.5b.json"));
  EXPECT_EQ(c.architecture, "Qwen2ForCausalLM");
  EXPECT_EQ(c.model_type, "qwen2");
  EXPECT_EQ(c.hidden_size, 896);
  EXPECT_EQ(c.intermediate_size, 4864);
  EXPECT_EQ(c.num_hidden_layers, 24);
  EXPECT_EQ(c.num_attention_heads, 14);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.max_position_embeddings, 32768);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.initializer_range, 0.02);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.rope.head_dim, 64);
  EXPECT_EQ(c.rope.scaling_type, "");
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_FALSE(c.o_proj_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_EQ(c.bos_token_id, 151643);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{151645}));
  EXPECT_FALSE(c.pad_token_id.has_value());
  EXPECT_EQ(c.torch_dtype, DType::kBF16);
  // Published size of Qwen2.5-0.5B: 494,032,768 parameters.
  EXPECT_EQ(c.num_parameters(), 494032768);
  EXPECT_EQ(c.raw["sliding_window"], 32768);
}

TEST(ModelConfig, Llama32OneBillionWithLlama3Rope) {
  const std::string dir = testing::temp_dir("llama");
  std::filesystem::copy_file(testing::fixture_path("configs/llama3.2-1b.json"),
                             dir + "/config.json");
  const ModelConfig c = ModelConfig::load(dir);  // a folder holding config.json
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.num_hidden_layers, 16);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope.theta, 500000.0);
  EXPECT_EQ(c.rope.scaling_type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope.factor, 32.0);
  EXPECT_DOUBLE_EQ(c.rope.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 8192);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.o_proj_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  EXPECT_EQ(c.torch_dtype, DType::kBF16);
  EXPECT_EQ(c.num_parameters(), 1235814400);  // published: 1.24B
  const std::string s = c.summary();
  for (const char* part : {"LlamaForCausalLM", "16 layers", "hidden 2048", "llama3 scaling",
                           "tied embeddings", "1235814400 parameters", "bfloat16"}) {
    EXPECT_NE(s.find(part), std::string::npos) << part << " in " << s;
  }
}

struct BenchConfig {
  const char* file;
  const char* architecture;
  int64_t parameters;  // the published parameter count of the model
};

class ModelConfigBench : public ::testing::TestWithParam<BenchConfig> {};

TEST_P(ModelConfigBench, ParameterCountMatchesThePublishedModel) {
  const auto& p = GetParam();
  const ModelConfig c = ModelConfig::load(std::string(LT_SOURCE_DIR) + "/bench/configs/" + p.file);
  EXPECT_EQ(c.architecture, p.architecture);
  EXPECT_EQ(c.num_parameters(), p.parameters);
}

INSTANTIATE_TEST_SUITE_P(
    Configs, ModelConfigBench,
    ::testing::Values(BenchConfig{"qwen2.5-0.5b.json", "Qwen2ForCausalLM", 494032768},
                      BenchConfig{"qwen2.5-1.5b.json", "Qwen2ForCausalLM", 1543714304},
                      BenchConfig{"qwen2.5-7b.json", "Qwen2ForCausalLM", 7615616512},
                      BenchConfig{"llama3-8b.json", "LlamaForCausalLM", 8030261248},
                      // Real config.json files of each family, written from the published ones.
                      BenchConfig{"qwen3-8b.json", "Qwen3ForCausalLM", 8190735360},
                      BenchConfig{"mistral-7b-v0.3.json", "MistralForCausalLM", 7248023552},
                      BenchConfig{"phi-4.json", "Phi3ForCausalLM", 14659507200},
                      BenchConfig{"phi-3-mini-128k.json", "Phi3ForCausalLM", 3821079552},
                      BenchConfig{"gemma-3-1b.json", "Gemma3ForCausalLM", 999885952}),
    [](const auto& info) {
      std::string n = info.param.file;
      for (char& ch : n) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return n;
    });

// The families' own keys and transformers' defaults for them, in the files' legacy and
// transformers 5 forms.
TEST(ModelConfig, FamilyOptions) {
  const ModelConfig q = parse(
      R"({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
          "num_hidden_layers": 3, "num_attention_heads": 4, "vocab_size": 10,
          "use_sliding_window": true, "sliding_window": 8, "max_window_layers": 2})");
  EXPECT_EQ(q.head_dim, 128);  // Qwen3Config's default, not 64 / 4
  EXPECT_TRUE(q.qk_norm);
  EXPECT_FALSE(q.attention_bias);
  EXPECT_EQ(q.window_of(0), 0);
  EXPECT_EQ(q.window_of(2), 8);
  const ModelConfig m = parse(
      R"({"architectures": ["MistralForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
          "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 10})");
  EXPECT_EQ(m.window_of(1), 4096);  // MistralConfig's default when the key is absent
  EXPECT_EQ(m.max_position_embeddings, 131072);
  const ModelConfig p =
      ModelConfig::load(std::string(LT_SOURCE_DIR) + "/bench/configs/phi-3-mini-128k.json");
  EXPECT_TRUE(p.fused_qkv && p.fused_gate_up);
  EXPECT_EQ(p.rope.scaling_type, "longrope");
  EXPECT_EQ(p.rope.original_max_position_embeddings, 4096);
  EXPECT_EQ(p.rope.long_factor.size(), 48u);
  EXPECT_NEAR(p.rope.attention_factor, std::sqrt(1 + std::log(32.0) / std::log(4096.0)), 1e-12);
  EXPECT_FALSE(p.rope.long_for(4095));
  EXPECT_TRUE(p.rope.long_for(4096));
  EXPECT_EQ(p.window_of(0), 262144);
  // Written back, the longrope lists survive as the file had them.
  EXPECT_EQ(ModelConfig::from_json(p.to_json(), "x").rope.long_factor, p.rope.long_factor);
  const ModelConfig g =
      ModelConfig::load(std::string(LT_SOURCE_DIR) + "/bench/configs/gemma-3-1b.json");
  EXPECT_TRUE(g.norm_unit_offset && g.sandwich_norms && g.scale_embeddings && g.qk_norm);
  EXPECT_EQ(g.mlp_activation, MlpActivation::kGeluTanh);
  EXPECT_DOUBLE_EQ(g.attention_scale, 1.0 / 16.0);
  EXPECT_EQ(g.window_of(0), 512);
  EXPECT_EQ(g.window_of(5), 0);  // every sixth layer is global
  EXPECT_DOUBLE_EQ(g.rope_of(0).theta, 10000.0);
  EXPECT_DOUBLE_EQ(g.rope_of(5).theta, 1e6);
  EXPECT_EQ(g.eos_token_ids, (std::vector<int64_t>{1, 106}));
  const char* bad_phi = R"({"architectures": ["Phi3ForCausalLM"], "hidden_size": 64,
      "intermediate_size": 96, "num_hidden_layers": 1, "num_attention_heads": 4,
      "vocab_size": 10, "resid_pdrop": 0.1})";
  EXPECT_NE(input_error(bad_phi).find("key 'resid_pdrop' must be 0"), std::string::npos);
  const char* bad_act = R"({"architectures": ["Gemma3ForCausalLM"], "hidden_size": 64,
      "intermediate_size": 96, "num_hidden_layers": 1, "num_attention_heads": 4,
      "vocab_size": 10, "hidden_activation": "gelu"})";
  EXPECT_NE(input_error(bad_act).find("key 'hidden_activation' must be \"gelu_pytorch_tanh\""),
            std::string::npos);
}

TEST(ModelConfig, TransformersDefaults) {
  const ModelConfig c = parse(kMinimalLlama);
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.rope.head_dim, 16);
  EXPECT_DOUBLE_EQ(c.rope.theta, 10000.0);
  EXPECT_EQ(c.rope.scaling_type, "");
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.initializer_range, 0.02);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.torch_dtype, DType::kF32);
  EXPECT_TRUE(c.eos_token_ids.empty());
  EXPECT_FALSE(c.bos_token_id.has_value());
  // embed + head (untied) + 2 layers of (q,k,v,o = 4*64*64, mlp = 3*64*128, 2 norms) + norm.
  EXPECT_EQ(c.num_parameters(), 2 * 100 * 64 + 2 * (4 * 64 * 64 + 3 * 64 * 128 + 2 * 64) + 64);

  const ModelConfig q = parse(
      R"({"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
          "vocab_size": 10, "rope_scaling": null, "head_dim": null, "dtype": "float16"})");
  EXPECT_EQ(q.architecture, "Qwen2ForCausalLM");
  EXPECT_EQ(q.max_position_embeddings, 32768);
  EXPECT_EQ(q.head_dim, 16);
  EXPECT_EQ(q.torch_dtype, DType::kF16);
  // q/k/v biases (64 + 32 + 32), no o_proj or mlp bias.
  const int64_t layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128 + 2 * 64 + 64 + 32 + 32;
  EXPECT_EQ(q.num_parameters(), 2 * 10 * 64 + layer + 64);
}

TEST(ModelConfig, LlamaBiasesAndExplicitHeadDim) {
  const ModelConfig c = parse(
      R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
          "head_dim": 48, "vocab_size": 10, "attention_bias": true, "mlp_bias": true,
          "tie_word_embeddings": true, "pad_token_id": 0, "eos_token_id": 2})");
  EXPECT_EQ(c.head_dim, 48);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_TRUE(c.o_proj_bias);
  EXPECT_TRUE(c.mlp_bias);
  EXPECT_EQ(c.pad_token_id, 0);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{2}));
  const int64_t q = 96, kv = 48;
  const int64_t layer = 64 * q + 2 * 64 * kv + q * 64 + 3 * 64 * 128 + 2 * 64  // weights
                        + q + 2 * kv + 64                                      // attention bias
                        + 2 * 128 + 64;                                        // mlp bias
  EXPECT_EQ(c.num_parameters(), 10 * 64 + layer + 64);
  EXPECT_EQ(c.to_json()["head_dim"], 48);
}

TEST(ModelConfig, RopeScalingVariants) {
  auto with = [](const std::string& extra) {
    std::string s = kMinimalLlama;
    s.insert(s.rfind('}'), ", " + extra);
    return parse(s);
  };
  const ModelConfig lin = with(R"("rope_scaling": {"type": "linear", "factor": 2.0})");
  EXPECT_EQ(lin.rope.scaling_type, "linear");
  EXPECT_DOUBLE_EQ(lin.rope.factor, 2.0);
  const ModelConfig def = with(R"("rope_scaling": {"rope_type": "default"}, "rope_theta": 5e5)");
  EXPECT_EQ(def.rope.scaling_type, "");
  EXPECT_DOUBLE_EQ(def.rope.theta, 5e5);
  // Newer transformers files keep theta and the scaling together in rope_parameters.
  const ModelConfig params = with(
      R"("rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192})");
  EXPECT_EQ(params.rope.scaling_type, "llama3");
  EXPECT_DOUBLE_EQ(params.rope.theta, 500000.0);
  EXPECT_DOUBLE_EQ(params.rope.factor, 8.0);
  EXPECT_EQ(params.to_json()["rope_parameters"]["rope_theta"], 500000.0);
  EXPECT_FALSE(params.to_json().contains("rope_scaling"));
}

TEST(ModelConfig, WrittenBackAndReloadedUnchanged) {
  const ModelConfig c = ModelConfig::load(testing::fixture_path("configs/llama3.2-1b.json"));
  const std::string dir = testing::temp_dir("save");
  c.save(dir);
  const ModelConfig r = ModelConfig::load(dir + "/config.json");
  EXPECT_EQ(r.to_json(), c.to_json());
  EXPECT_EQ(r.num_parameters(), c.num_parameters());
  EXPECT_EQ(r.eos_token_ids, c.eos_token_ids);
  EXPECT_EQ(r.rope.scaling_type, "llama3");
  EXPECT_DOUBLE_EQ(r.rope.factor, 32.0);
  // Keys leantune does not model survive; the written file is transformers-shaped.
  const json j = read_json_file(dir + "/config.json");
  EXPECT_EQ(j["pretraining_tp"], 1);
  EXPECT_EQ(j["hidden_act"], "silu");
  EXPECT_EQ(j["torch_dtype"], "bfloat16");
  EXPECT_EQ(j["eos_token_id"], json::array({128001, 128008, 128009}));
  EXPECT_EQ(j["rope_scaling"]["rope_type"], "llama3");

  ModelConfig changed = c;
  changed.vocab_size = 128300;
  changed.torch_dtype = DType::kF32;
  changed.save(dir);
  const ModelConfig r2 = ModelConfig::load(dir);
  EXPECT_EQ(r2.vocab_size, 128300);
  EXPECT_EQ(r2.torch_dtype, DType::kF32);

  const ModelConfig q = ModelConfig::load(testing::fixture_path("configs/qwen2.5-0.5b.json"));
  const json qj = q.to_json();
  EXPECT_EQ(qj["eos_token_id"], 151645);
  EXPECT_FALSE(qj.contains("attention_bias"));
  EXPECT_TRUE(qj["rope_scaling"].is_null());
  EXPECT_EQ(ModelConfig::from_json(qj, "x").num_parameters(), 494032768);
}

TEST(ModelConfig, BadConfigsNameFileAndKey) {
  struct Case {
    const char* json;
    const char* expect;
  };
  const Case cases[] = {
      {R"({"architectures": ["GPT2LMHeadModel"], "hidden_size": 8})",
       "unsupported architecture 'GPT2LMHeadModel' (supported: LlamaForCausalLM"},
      {R"({"hidden_size": 8})", "key 'architectures' is missing"},
      {R"({"model_type": "gpt2"})", "model_type 'gpt2' is not one this engine runs"},
      {R"({"architectures": "LlamaForCausalLM"})", "key 'architectures' must be"},
      {R"({"architectures": ["LlamaForCausalLM"], "model_type": "qwen2"})",
       "key 'model_type' is 'qwen2'"},
      {R"({"architectures": ["LlamaForCausalLM"], "intermediate_size": 1,
           "num_hidden_layers": 1, "num_attention_heads": 1, "vocab_size": 1})",
       "key 'hidden_size' is missing"},
      {R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 8, "intermediate_size": 1,
           "num_hidden_layers": 1, "num_attention_heads": 1})",
       "key 'vocab_size' is missing"},
      {R"({"architectures": ["LlamaForCausalLM"], "hidden_size": "8", "intermediate_size": 1,
           "num_hidden_layers": 1, "num_attention_heads": 1, "vocab_size": 1})",
       "key 'hidden_size' must be an integer"},
      {R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 8.5, "intermediate_size": 1,
           "num_hidden_layers": 1, "num_attention_heads": 1, "vocab_size": 1})",
       "key 'hidden_size' must be an integer"},
      {R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 0, "intermediate_size": 1,
           "num_hidden_layers": 1, "num_attention_heads": 1, "vocab_size": 1})",
       "key 'hidden_size' must be a positive integer"},
      {R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 12, "intermediate_size": 1,
           "num_hidden_layers": 1, "num_attention_heads": 8, "vocab_size": 1})",
       "not divisible by num_attention_heads"},
      {R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 16, "intermediate_size": 1,
           "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 3,
           "vocab_size": 1})",
       "key 'num_key_value_heads' (3) must divide"},
      {R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 12, "intermediate_size": 1,
           "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 1})",
       "key 'head_dim' must be even"},
      {R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 16, "intermediate_size": 1,
           "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 1,
           "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})",
       "key 'rope_scaling.rope_type' is 'yarn', which is not supported"},
      {R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 16, "intermediate_size": 1,
           "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 1,
           "rope_scaling": {"rope_type": "llama3", "factor": 4.0}})",
       "key 'rope_scaling.low_freq_factor' is missing"},
      {R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 16, "intermediate_size": 1,
           "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 1,
           "rope_scaling": "linear"})",
       "key 'rope_scaling' must be an object"},
      {R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 16, "intermediate_size": 1,
           "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 1,
           "eos_token_id": "</s>"})",
       "key 'eos_token_id' must be an integer"},
      {R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 16, "intermediate_size": 1,
           "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 1,
           "torch_dtype": "int8"})",
       "key 'torch_dtype' is 'int8'"},
      {R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 16, "intermediate_size": 1,
           "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 1,
           "tie_word_embeddings": 1})",
       "key 'tie_word_embeddings' must be true or false"},
      {R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 16, "intermediate_size": 1,
           "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 1,
           "rms_norm_eps": -1})",
       "key 'rms_norm_eps' must be positive"},
      {R"([1, 2])", "not a JSON object"},
  };
  for (const auto& c : cases) {
    const std::string msg = input_error(c.json);
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.json << "\n -> " << msg;
  }
}

// Shape keys past their limits are refused naming the key and the limit; at the limits every
// derived size (num_parameters) still fits in 64 bits.
TEST(ModelConfig, ShapeKeysHaveUpperLimits) {
  const std::pair<const char*, const char*> cases[] = {
      {R"("num_hidden_layers": 1000000000)",
       "key 'num_hidden_layers' is 1000000000, more than the 16384"},
      {R"("hidden_size": 2097152, "head_dim": 64)", "key 'hidden_size' is 2097152, more than the"},
      {R"("intermediate_size": 8388608)", "key 'intermediate_size' is 8388608, more than the"},
      {R"("max_position_embeddings": 1099511627776)",
       "key 'max_position_embeddings' is 1099511627776, more than the 16777216"},
      {R"("num_attention_heads": 8192, "num_key_value_heads": 8192, "head_dim": 64)",
       "key 'num_attention_heads' is 8192, more than the 4096"},
  };
  for (const auto& [keys, expect] : cases) {
    // The case's keys replace the minimal config's.
    json j = json::parse(kMinimalLlama);
    const json overrides = json::parse(std::string("{") + keys + "}");
    for (const auto& [k, v] : overrides.items()) j[k] = v;
    try {
      ModelConfig::from_json(j, "test/config.json");
      ADD_FAILURE() << "accepted: " << j.dump();
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInput);
      EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
    }
  }
  json big = json::parse(kMinimalLlama);
  big["num_hidden_layers"] = 16384;
  big["hidden_size"] = 1 << 20;
  big["intermediate_size"] = 1 << 22;
  big["num_attention_heads"] = 4096;
  big["head_dim"] = 4096;
  big["vocab_size"] = INT32_MAX;
  const ModelConfig c = ModelConfig::from_json(big, "test/config.json");
  EXPECT_GT(c.num_parameters(), int64_t{1} << 60);
}

TEST(ModelConfig, FileErrorsNameThePath) {
  const std::string dir = testing::temp_dir("bad");
  try {
    ModelConfig::load(dir);
    ADD_FAILURE() << "folder without config.json accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find(dir + "/config.json"), std::string::npos) << e.what();
  }
  write_text_atomic(dir + "/config.json", R"({"hidden_size": 1, "hidden_size": 2})");
  try {
    ModelConfig::load(dir);
    ADD_FAILURE() << "duplicate key accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("duplicate key 'hidden_size'"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace leantune
