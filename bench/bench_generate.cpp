// Generation benchmark for the online trainers (CPU, or CUDA when a device is present): the
// same prompts through models/generate.h once as one batch and once one prompt at a time, on a
// randomly initialised model of a given shape, greedy, with eos disabled so that every prompt
// produces exactly --new_tokens tokens. Prints one JSON object: generated tokens per second of
// each way, the speed-up, the KV-cache bytes of the batched call, and whether both ways gave the
// same tokens (they must).
//
//   OMP_NUM_THREADS=2 build/bench/bench_generate [--config bench/configs/qwen2.5-0.5b.json]
//       [--layers 2] [--prompts 16] [--prompt_len 64] [--new_tokens 32] [--device cpu|cuda]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "loaders/model_config.h"
#include "models/decoder.h"
#include "models/generate.h"

int main(int argc, char** argv) {
  using namespace leantune;
  const char* root = std::getenv("LEANTUNE_ROOT");
  std::string config = std::string(root ? root : ".") + "/bench/configs/qwen2.5-0.5b.json";
  std::string device_name = cuda_available() ? "cuda" : "cpu";
  int64_t layers = 2, prompts = 16, prompt_len = 64, new_tokens = 32;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--config")
      config = v;
    else if (k == "--layers")
      layers = std::stoll(v);
    else if (k == "--prompts")
      prompts = std::stoll(v);
    else if (k == "--prompt_len")
      prompt_len = std::stoll(v);
    else if (k == "--new_tokens")
      new_tokens = std::stoll(v);
    else if (k == "--device")
      device_name = v;
    else {
      std::fprintf(stderr, "bench_generate: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (prompts < 1 || prompt_len < 1 || new_tokens < 1 || layers < 1) {
    std::fprintf(
        stderr,
        "bench_generate: --prompts, --prompt_len, --new_tokens and --layers must be positive\n");
    return 2;
  }
  try {
    ModelConfig cfg = ModelConfig::load(config);
    cfg.num_hidden_layers = layers;
    const Device device = Device::parse(device_name);
    DecoderModel model(cfg, device, DType::kF32);
    model.init_random(1);
    NoGradGuard ng;
    std::vector<std::vector<int32_t>> ps;
    for (int64_t p = 0; p < prompts; ++p) {
      std::vector<int32_t> ids;
      // Lengths vary around prompt_len, as real prompts do.
      const int64_t n = prompt_len - (p % 4) * prompt_len / 8;
      for (int64_t t = 0; t < std::max<int64_t>(1, n); ++t)
        ids.push_back(static_cast<int32_t>((t * 7919 + p * 104729 + 17) % cfg.vocab_size));
      ps.push_back(std::move(ids));
    }
    GenerationConfig g;
    g.max_new_tokens = new_tokens;
    g.eos_token_ids = {-1};  // no stop: every prompt makes new_tokens tokens
    auto t0 = std::chrono::steady_clock::now();
    const GenerationResult batched = generate(model, ps, g);
    const double batched_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    t0 = std::chrono::steady_clock::now();
    bool same = true;
    for (int64_t p = 0; p < prompts; ++p) {
      const GenerationResult one = generate(model, {ps[static_cast<size_t>(p)]}, g);
      same = same && one.tokens[0] == batched.tokens[static_cast<size_t>(p)];
    }
    const double single_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double tokens = static_cast<double>(prompts * new_tokens);
    const nlohmann::json out = {{"config", config},
                                {"layers", layers},
                                {"hidden_size", cfg.hidden_size},
                                {"vocab_size", cfg.vocab_size},
                                {"device", device.str()},
                                {"prompts", prompts},
                                {"prompt_len", prompt_len},
                                {"new_tokens", new_tokens},
                                {"batched_tokens_per_s", tokens / batched_s},
                                {"one_at_a_time_tokens_per_s", tokens / single_s},
                                {"speedup", single_s / batched_s},
                                {"kv_cache_bytes", batched.kv_cache_bytes},
                                {"same_tokens", same}};
    std::printf("%s\n", out.dump(2).c_str());
    return same ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_generate: %s\n", e.what());
    return 2;
  }
}
