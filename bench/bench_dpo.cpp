// DPO step benchmark (CPU, or CUDA when a device is present): one preference pair (prompt + chosen,
// prompt + rejected, each max_length tokens) through a randomly initialised model of a given shape,
// the policy's forward, TRL's sigmoid loss and backward, with the chunked LM head (use_liger_loss)
// and with full logits. The reference log-probabilities are taken as precomputed (zeros): this
// measures the policy's step, which is where the two paths differ. Prints one JSON object: seconds
// and the allocator's peak above the weights (total and by tag) for each path, and under "figures"
// the flat numbers bench/gpu_suite.sh collects.
//
//   OMP_NUM_THREADS=2 build/bench/bench_dpo [--config bench/configs/qwen2.5-0.5b.json] [--device
//   cpu|cuda]
//       [--max_length 2048] [--prompt 1024] [--layers N (default: the config's)] [--chunk 1024]
//       [--paths chunked,full] [--gradient_checkpointing true]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/allocator.h"
#include "kernels/cross_entropy.h"
#include "loaders/model_config.h"
#include "models/decoder.h"
#include "models/ref_model.h"
#include "trainers/dpo/preference_loss.h"

namespace {

using namespace leantune;

Batch pair_batch(int64_t max_length, int64_t prompt, int64_t vocab) {
  std::vector<int64_t> ids, pos, labels;
  std::vector<int32_t> cu{0};
  for (int side = 0; side < 2; ++side) {
    for (int64_t t = 0; t < max_length; ++t) {
      const int64_t id = (t * 7919 + side * 104729 + 17) % vocab;
      ids.push_back(id);
      pos.push_back(t);
      labels.push_back(t < prompt ? kernels::kIgnoreIndex : id);
    }
    cu.push_back(cu.back() + static_cast<int32_t>(max_length));
  }
  const int64_t n = static_cast<int64_t>(ids.size());
  Batch b;
  b.input_ids = Tensor::from_vector(ids, {n});
  b.position_ids = Tensor::from_vector(pos, {n});
  b.labels = Tensor::from_vector(labels, {n});
  b.cu_seqlens = Tensor::from_vector(cu, {3});
  b.max_seqlen = max_length;
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  // From the repository root, or LEANTUNE_ROOT (bench/gpu_suite.sh sets it).
  const char* root = std::getenv("LEANTUNE_ROOT");
  std::string config = std::string(root ? root : ".") + "/bench/configs/qwen2.5-0.5b.json";
  std::string device_name = cuda_available() ? "cuda" : "cpu";
  int64_t max_length = 2048, prompt = 1024, layers = -1, chunk = 1024;
  bool checkpointing = false;
  std::string paths = "chunked,full";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--config")
      config = v;
    else if (k == "--max_length")
      max_length = std::stoll(v);
    else if (k == "--prompt")
      prompt = std::stoll(v);
    else if (k == "--layers")
      layers = std::stoll(v);
    else if (k == "--chunk")
      chunk = std::stoll(v);
    else if (k == "--paths")
      paths = v;
    else if (k == "--device")
      device_name = v;
    else if (k == "--gradient_checkpointing")
      checkpointing = v == "true";
    else {
      std::fprintf(stderr, "bench_dpo: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  ModelConfig cfg = ModelConfig::load(config);
  const int64_t config_layers = cfg.num_hidden_layers;
  if (layers >= 0) cfg.num_hidden_layers = layers;
  const Device device = Device::parse(device_name);
  DecoderModel model(cfg, device, DType::kF32);
  model.init_random(1);
  model.set_requires_grad(true);
  Allocator& a = allocator(device);
  const Batch b = pair_batch(max_length, prompt, cfg.vocab_size);
  nlohmann::json out = {{"config", config},
                        {"layers", cfg.num_hidden_layers},
                        {"config_layers", config_layers},
                        {"hidden_size", cfg.hidden_size},
                        {"vocab_size", cfg.vocab_size},
                        {"max_length", max_length},
                        {"prompt_tokens", prompt},
                        {"tokens", b.num_tokens()},
                        {"scored_tokens", 2 * (max_length - prompt)},
                        {"dtype", "f32"},
                        {"gradient_checkpointing", checkpointing},
                        {"device", device.str()},
                        {"reference", "precomputed (zeros)"}};
  for (const std::string path : {"chunked", "full"}) {
    if (paths.find(path) == std::string::npos) continue;
    for (auto& [name, p] : model.named_parameters()) p.zero_grad();
    a.empty_cache();
    const int64_t base = a.stats().allocated.current;
    a.reset_peak_stats();
    const auto t0 = std::chrono::steady_clock::now();
    SequenceLogpsOptions o;
    o.fused = path == "chunked";
    o.chunk_tokens = chunk;
    o.gradient_checkpointing = checkpointing;
    double loss = 0;
    {
      kernels::SequenceLogprobs r = sequence_logps(model, b, o);
      const std::vector<double> lp = r.logps.to_f64();
      PreferencePairs pp;
      pp.chosen_logps = {lp[0]};
      pp.rejected_logps = {lp[1]};
      pp.ref_chosen_logps = pp.ref_rejected_logps = {0.0};
      pp.chosen_tokens = {r.tokens[0]};
      pp.rejected_tokens = {r.tokens[1]};
      const PreferenceLossResult res = preference_loss(PreferenceLossConfig{}, pp);
      loss = res.loss;
      r.logps.backward(
          Tensor::from_doubles({res.dchosen[0], res.drejected[0]}, {2}, r.logps.dtype()));
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const AllocatorStats st = a.stats();
    nlohmann::json tags = nlohmann::json::object();
    for (int i = 0; i < kNumMemTags; ++i)
      tags[mem_tag_name(static_cast<MemTag>(i))] = st.by_tag[i].peak;
    out[path] = {{"seconds", secs},
                 {"loss", loss},
                 {"peak_above_weights", st.allocated.peak - base},
                 {"peak_by_tag", tags}};
    out["figures"]["dpo_" + path + "_seconds"] = secs;
    out["figures"]["dpo_" + path + "_peak_above_weights_bytes"] = st.allocated.peak - base;
    std::fprintf(stderr, "%s: %.1f s, peak above weights %s\n", path.c_str(), secs,
                 format_bytes(st.allocated.peak - base).c_str());
  }
  std::printf("%s\n", out.dump(1).c_str());
  return 0;
}
