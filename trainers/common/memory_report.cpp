// The end-of-run memory report every trainer prints (trainer_bin and the public API): the peak
// allocated and reserved bytes with the phase of the peak, peak RSS, the bytes by allocator tag
// at the peak and at their own peaks, ZeRO-3's gathered units, the planning estimate beside the
// measured peak, and one line per enabled technique with what it saved (Trainer::memory_report
// builds the JSON this formats).
#include "trainers/common/memory_report.h"

#include <cstdarg>
#include <cstdio>
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
  if (s.contains("padding_free")) {
    out += strf("    padding-free batches: %lld pad tokens never computed\n",
                static_cast<long long>(s["padding_free"].value("pad_tokens_avoided", int64_t{0})));
  }
  if (s.contains("chunked_loss")) {
    const auto& c = s["chunked_loss"];
    out += strf(
        "    chunked linear cross-entropy: [%lld x %lld] logits never materialised "
        "(%s with their gradient)\n",
        static_cast<long long>(c.value("largest_micro_batch_tokens", int64_t{0})),
        static_cast<long long>(c.value("vocab_size", int64_t{0})),
        format_bytes(c.value("logits_bytes_not_materialised", int64_t{0})).c_str());
  }
  if (s.contains("activation_offloading")) {
    const auto& a = s["activation_offloading"];
    out += strf(
        "    activation offloading: up to %s of saved activations per micro-batch held "
        "in pinned host memory instead of the device (%lld tensors moved in all)\n",
        format_bytes(a.value("bytes_offloaded_per_micro_batch_max", int64_t{0})).c_str(),
        static_cast<long long>(a.value("tensors_offloaded", int64_t{0})));
  }
  if (s.contains("generation")) {
    const auto& g = s["generation"];
    auto b = [&](const char* key) { return format_bytes(g.value(key, int64_t{0})); };
    out += strf(
        "    in-process generation from the trained weights (no second model copy, no "
        "weight sync): KV-cache pool %s (%lld blocks of %lld tokens, %lld used at "
        "most)\n",
        b("kv_cache_pool_bytes").c_str(),
        static_cast<long long>(g.value("kv_cache_blocks", int64_t{0})),
        static_cast<long long>(g.value("kv_block_size", int64_t{0})),
        static_cast<long long>(g.value("kv_blocks_peak_used", int64_t{0})));
    out += strf(
        "    generation phase peak %s allocated, %s reserved; optimizer phase peak %s "
        "allocated, %s reserved\n",
        b("generation_phase_peak_allocated").c_str(), b("generation_phase_peak_reserved").c_str(),
        b("optimizer_phase_peak_allocated").c_str(), b("optimizer_phase_peak_reserved").c_str());
    if (g.value("sleep_mode", false))
      out += strf(
          "    sleep mode: %s given back after each generation phase (the pool and "
          "cached blocks), made again for the next\n",
          b("sleep_released_bytes").c_str());
    else
      out += strf(
          "    sleep mode off: the pool (%s) is held through the optimizer phase "
          "(--vllm_enable_sleep_mode frees it)\n",
          b("kv_cache_pool_bytes").c_str());
  }
  if (s.contains("gradient_checkpointing"))
    out +=
        "    gradient checkpointing: only decoder-layer inputs kept between forward and backward\n";
  if (s.contains("sequence_tiling")) {
    const auto& t = s["sequence_tiling"];
    out += strf(
        "    sequence tiling: decoder layers in blocks of %lld tokens (--tiled_mlp): no "
        "[%lld x %lld] MLP intermediate exists whole (%s of gate, up and activation "
        "per layer never allocated)\n",
        static_cast<long long>(t.value("chunk_tokens", int64_t{0})),
        static_cast<long long>(t.value("largest_micro_batch_tokens", int64_t{0})),
        static_cast<long long>(t.value("intermediate_size", int64_t{0})),
        format_bytes(t.value("mlp_bytes_not_materialised", int64_t{0})).c_str());
  }
  if (s.contains("streaming_load")) {
    const auto& l = s["streaming_load"];
    out += strf(
        "    streaming weight loading: safetensors read tensor by tensor, each file's "
        "pages released once copied or quantized (host holds one tensor of at most %s, "
        "not the %s of weights)\n",
        format_bytes(l.value("largest_tensor_bytes", int64_t{0})).c_str(),
        format_bytes(l.value("weight_bytes", int64_t{0})).c_str());
  }
  if (s.contains("quantized_base")) {
    const auto& q = s["quantized_base"];
    out += strf("    quantized base (%s): %lld frozen linear weights in %s instead of %s\n",
                q.value("kind", "").c_str(), static_cast<long long>(q.value("modules", int64_t{0})),
                format_bytes(q.value("quantized_bytes", int64_t{0})).c_str(),
                format_bytes(q.value("dense_bytes", int64_t{0})).c_str());
  }
  if (s.contains("peft")) {
    const auto& p = s["peft"];
    out += strf(
        "    LoRA: %lld of %lld parameters trained; %s of gradients and optimizer state "
        "never allocated\n",
        static_cast<long long>(p.value("trainable_parameters", int64_t{0})),
        static_cast<long long>(p.value("total_parameters", int64_t{0})),
        format_bytes(p.value("grad_and_optimizer_bytes_avoided", int64_t{0})).c_str());
  }
  return out;
}

}  // namespace leantune
