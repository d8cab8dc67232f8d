// Generation benchmark for the online trainers (CPU, or CUDA when a device is present): the
// same prompts through models/generate.h once as one batch and once one prompt at a time, on a
// randomly initialised model of a given shape, greedy, with eos disabled so that every prompt
// produces exactly --new_tokens tokens. With --num_generations G each prompt is asked G times (as
// the online trainers ask), sampled (--temperature, default 1 then, else greedy): the batched
// call prefills each prompt once
// and its completions share the prompt's KV blocks. Prints one JSON object: generated tokens per
// second of each way, the speed-up, the KV-cache pool of the batched call beside what separate
// copies of every prompt would take, and whether both ways gave the same tokens (they must).
//
//   OMP_NUM_THREADS=2 build/bench/bench_generate [--config bench/configs/qwen2.5-0.5b.json]
//       [--layers 2] [--prompts 16] [--prompt_len 64] [--new_tokens 32] [--num_generations 1]
//       [--temperature T] [--device cpu|cuda]
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
  int64_t layers = 2, prompts = 16, prompt_len = 64, new_tokens = 32, generations = 1;
  double temperature = -1;  // unset: greedy for one generation per prompt, else 1
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
    else if (k == "--num_generations")
      generations = std::atoll(v.c_str());
    else if (k == "--temperature")
      temperature = std::atof(v.c_str());
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
        "bench_generate: --prompts, --prompt_len, --new_tokens, --num_generations and --layers "
        "must be positive\n");
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
    if (temperature < 0) temperature = generations > 1 ? 1.0 : 0.0;
    // Each prompt G times in a row, as the online trainers lay out a generation batch.
    std::vector<std::vector<int32_t>> asked;
    for (const auto& p : ps)
      for (int64_t k = 0; k < generations; ++k) asked.push_back(p);
    ps = std::move(asked);
    prompts = static_cast<int64_t>(ps.size());
    GenerationConfig g;
    g.max_new_tokens = new_tokens;
    g.eos_token_ids = {-1};  // no stop: every prompt makes new_tokens tokens
    g.temperature = temperature;
    auto t0 = std::chrono::steady_clock::now();
    const GenerationResult batched = generate(model, ps, g);
    const double batched_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    t0 = std::chrono::steady_clock::now();
    bool same = true;
    for (int64_t p = 0; p < prompts; ++p) {
      GenerationConfig gp = g;
      gp.first_sequence = p;  // the stream the batched call gave it
      const GenerationResult one = generate(model, {ps[static_cast<size_t>(p)]}, gp);
      same = same && one.tokens[0] == batched.tokens[static_cast<size_t>(p)];
    }
    const double single_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double tokens = static_cast<double>(prompts * new_tokens);
    // The pool separate copies of every prompt would need (no prefix sharing).
    int64_t unshared_blocks = 0;
    for (const auto& p : ps)
      unshared_blocks += kv_blocks_for_prompt(static_cast<int64_t>(p.size()), 1, new_tokens, 16);
    const int64_t unshared =
        batched.kv_cache_bytes / kv_blocks_for_call(ps, new_tokens, 16) * unshared_blocks;
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
                                {"num_generations", generations},
                                {"temperature", temperature},
                                {"kv_cache_bytes", batched.kv_cache_bytes},
                                {"kv_cache_bytes_unshared", unshared},
                                {"same_tokens", same}};
    std::printf("%s\n", out.dump(2).c_str());
    return same ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_generate: %s\n", e.what());
    return 2;
  }
}
