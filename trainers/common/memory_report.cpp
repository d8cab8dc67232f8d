// The end-of-run memory report every trainer prints (trainer_bin and the public API): the peak
// allocated and reserved bytes with the phase of the peak, peak RSS, the bytes by allocator tag
// at the peak and at their own peaks, ZeRO-3's gathered units, the planning estimate beside the
// measured peak, and one line per enabled technique with what it saved (Trainer::memory_report
// builds the JSON this formats).
#include "trainers/common/memory_report.h"

#include <cstdarg>
#include <cstdio>
#include <string_view>
#include <utility>

#include "engine/allocator.h"
#include "models/ref_model.h"

namespace leantune {

namespace {

// printf into a std::string, whatever its length.
[[gnu::format(printf, 1, 2)]] std::string strf(const char* fmt, ...) {
  va_list a, b;
  va_start(a, fmt);
  va_copy(b, a);
  const int n = std::vsnprintf(nullptr, 0, fmt, a);
  va_end(a);
  std::string out(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, fmt, b);
  va_end(b);
  return out;
}

// `tmpl` with each {key} replaced by the integer j[key], {bytes:key} by it in binary units and
// {text:key} by the string j[key] (absent keys: 0 or empty), for the technique lines.
std::string fill(std::string_view tmpl, const nlohmann::json& j) {
  std::string out;
  for (size_t i = 0; i < tmpl.size();) {
    const size_t open = tmpl.find('{', i);
    if (open == std::string_view::npos) {
      out += tmpl.substr(i);
      break;
    }
    const size_t close = tmpl.find('}', open);
    out += tmpl.substr(i, open - i);
    std::string key(tmpl.substr(open + 1, close - open - 1));
    if (key.rfind("text:", 0) == 0) {
      out += j.value(key.substr(5), std::string());
    } else if (key.rfind("bytes:", 0) == 0) {
      out += format_bytes(j.value(key.substr(6), int64_t{0}));
    } else {
      out += std::to_string(j.value(key, int64_t{0}));
    }
    i = close + 1;
  }
  return out;
}

}  // namespace

std::string format_memory_report(const nlohmann::json& r) {
  std::string out;
  const std::string phase = r.value("phase_at_peak", "");
  out += strf("memory report (%s): peak allocated %s%s%s, peak reserved %s\n",
              r.value("device", "?").c_str(),
              format_bytes(r.value("peak_allocated", int64_t{0})).c_str(),
              phase.empty() ? "" : " during ", phase.c_str(),
              format_bytes(r.value("peak_reserved", int64_t{0})).c_str());
  if (r.contains("blas")) out += "  " + r["blas"].get<std::string>() + "\n";
  if (r.value("peak_rss", int64_t{0}) > 0) {
    out += strf(
        "  peak RSS %s (the process's resident memory: the host allocator's segments "
        "on the CPU, plus code, BLAS buffers, tokenizer and data)\n",
        format_bytes(r.value("peak_rss", int64_t{0})).c_str());
  }
  out += strf("  %-18s %12s %12s\n", "by tag", "at the peak", "own peak");
  const std::pair<const char*, const char*> cats[] = {
      {"param", "params"},           {"grad", "grads"},          {"optimizer", "optimizer states"},
      {"activation", "activations"}, {"workspace", "workspace"}, {"kv_cache", "kv cache"},
      {"comm", "communication"},     {"other", "other"}};
  for (const auto& [tag, label] : cats) {
    const int64_t v = r["peak_by_tag"].value(tag, int64_t{0});
    const int64_t at =
        r.contains("at_peak_by_tag") ? r["at_peak_by_tag"].value(tag, int64_t{0}) : v;
    out += strf("  %-18s %12s %12s\n", label, format_bytes(at).c_str(), format_bytes(v).c_str());
  }
  if (r.contains("distributed")) {
    const auto& d = r["distributed"];
    out += strf(
        "  data parallel: %d ranks (%s, zero_stage %d%s), per update %.1f ms: compute "
        "%.1f ms, communication %.1f ms, exposed %.1f ms\n",
        d["world_size"].get<int>(), d["backend"].get<std::string>().c_str(),
        d["zero_stage"].get<int>(),
        d.contains("cp_size") ? (", cp_size " + std::to_string(d["cp_size"].get<int>()) +
                                 " (ring attention counted as compute)")
                                    .c_str()
                              : "",
        1e3 * d["step_seconds"].get<double>(), 1e3 * d["compute_seconds"].get<double>(),
        1e3 * d["comm_seconds"].get<double>(), 1e3 * d["exposed_comm_seconds"].get<double>());
    if (d.contains("zero3")) {
      const auto& z = d["zero3"];
      out += strf(
          "  zero_stage 3: this rank's parameter slices %s (%lld B), whole small "
          "parameters %s (%lld B), gathered units at most %s (%lld B), %lld units "
          "prefetched (%lld unused)\n",
          format_bytes(z["shard_bytes"].get<int64_t>()).c_str(),
          static_cast<long long>(z["shard_bytes"].get<int64_t>()),
          format_bytes(z["persistent_bytes"].get<int64_t>()).c_str(),
          static_cast<long long>(z["persistent_bytes"].get<int64_t>()),
          format_bytes(z["peak_gathered_bytes"].get<int64_t>()).c_str(),
          static_cast<long long>(z["peak_gathered_bytes"].get<int64_t>()),
          static_cast<long long>(z["prefetched_units"].get<int64_t>()),
          static_cast<long long>(z["prefetched_unused"].get<int64_t>()));
    }
  }
  const auto& s = r["savings"];
  if (s.contains("estimate")) {
    const auto& e = s["estimate"];
    auto rel = [](int64_t est, int64_t measured) {
      return measured > 0
                 ? 100.0 * static_cast<double>(est - measured) / static_cast<double>(measured)
                 : 0.0;
    };
    const int64_t est = e.value("peak", int64_t{0});
    out +=
        strf("  estimated peak %s during %s (%s) (trainer_bin estimate): %+.1f%% of measured\n",
             format_bytes(est).c_str(), e.value("peak_phase", "").c_str(),
             e.value("peak_detail", "").c_str(), rel(est, r.value("peak_allocated", int64_t{0})));
    const int64_t est_rss = e.value("rss_peak", int64_t{0});
    if (est_rss > 0 && r.value("peak_rss", int64_t{0}) > 0) {
      out += strf("  estimated peak RSS %s (%s outside the allocator): %+.1f%% of measured\n",
                  format_bytes(est_rss).c_str(),
                  format_bytes(e.value("outside_allocator", int64_t{0})).c_str(),
                  rel(est_rss, r.value("peak_rss", int64_t{0})));
    }
  }
  if (s.size() > (s.contains("estimate") ? 1u : 0u)) out += "  saved by the enabled techniques:\n";
  if (s.contains("reference_model")) out += format_reference_memory(s["reference_model"]);
  // One line (or two) per technique, in this order, filled from its JSON object by name.
  static const std::pair<const char*, const char*> kLines[] = {
      {"padding_free",
       "    padding-free batches: {pad_tokens_avoided} pad tokens never computed\n"},
      {"chunked_loss",
       "    chunked linear cross-entropy: [{largest_micro_batch_tokens} x {vocab_size}] logits "
       "never materialised ({bytes:logits_bytes_not_materialised} with their gradient)\n"},
      {"chunked_divergence",
       "    chunked divergence (distill): the student's and the teacher's "
       "[{largest_micro_batch_tokens} x {vocab_size}] logits never materialised "
       "({bytes:logits_bytes_not_materialised} in f32 with the student's gradient)\n"},
      {"teacher_offload",
       "    teacher offloaded layer by layer: {bytes:host_bytes} of its {layers} layers in pinned "
       "host memory, at most {bytes:resident_peak} of them on the device at once "
       "({layers_prefetched} layers prefetched, {layers_copied_now} copied when needed)\n"},
      {"activation_offloading",
       "    activation offloading: up to {bytes:bytes_offloaded_per_micro_batch_max} of saved "
       "activations per micro-batch held in pinned host memory instead of the device "
       "({tensors_offloaded} tensors moved in all)\n"},
      {"generation",
       "    in-process generation from the trained weights (no second model copy, no weight "
       "sync): KV-cache pool {bytes:kv_cache_pool_bytes} ({kv_cache_blocks} blocks of "
       "{kv_block_size} tokens, {kv_blocks_peak_used} used at most)\n"
       "    generation phase peak {bytes:generation_phase_peak_allocated} allocated, "
       "{bytes:generation_phase_peak_reserved} reserved; optimizer phase peak "
       "{bytes:optimizer_phase_peak_allocated} allocated, {bytes:optimizer_phase_peak_reserved} "
       "reserved\n{text:sleep_line}"},
      {"gradient_checkpointing",
       "    gradient checkpointing: only decoder-layer inputs kept between forward and "
       "backward\n"},
      {"sequence_tiling",
       "    sequence tiling: decoder layers in blocks of {chunk_tokens} tokens (--tiled_mlp): no "
       "[{largest_micro_batch_tokens} x {intermediate_size}] MLP intermediate exists whole "
       "({bytes:mlp_bytes_not_materialised} of gate, up and activation per layer never "
       "allocated)\n"},
      {"streaming_load",
       "    streaming weight loading: safetensors read tensor by tensor, each file's pages "
       "released once copied or quantized (host holds one tensor of at most "
       "{bytes:largest_tensor_bytes}, not the {bytes:weight_bytes} of weights)\n"},
      {"quantized_base",
       "    quantized base ({text:kind}): {modules} frozen linear weights in "
       "{bytes:quantized_bytes} instead of {bytes:dense_bytes}\n"},
      {"peft",
       "    LoRA: {trainable_parameters} of {total_parameters} parameters trained; "
       "{bytes:grad_and_optimizer_bytes_avoided} of gradients and optimizer state never "
       "allocated\n"}};
  for (const auto& [key, tmpl] : kLines) {
    if (!s.contains(key)) continue;
    nlohmann::json j = s[key];
    if (std::string_view(key) == "generation")
      j["sleep_line"] =
          fill(j.value("sleep_mode", false)
                   ? "    sleep mode: {bytes:sleep_released_bytes} given back after each "
                     "generation phase (the pool and cached blocks), made again for the next\n"
                   : "    sleep mode off: the pool ({bytes:kv_cache_pool_bytes}) is held through "
                     "the optimizer phase (--vllm_enable_sleep_mode frees it)\n",
               j);
    out += fill(tmpl, j);
  }
  return out;
}

}  // namespace leantune
