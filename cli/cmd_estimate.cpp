// trainer_bin estimate --model_name_or_path PATH [the sft options] [--budget_gib G]
// (trainer_bin estimate dpo|kto|reward|grpo|rloo|online_dpo ...: those trainers' estimates.)
// Predicts the peak device memory of an sft run by category before anything is allocated
// (trainers/estimate/estimate.h). PATH is an HF model folder or a bare config.json (a shape without
// weights, for planning); no PATH: the built-in demo model. With --budget_gib, also lists the
// option changes that bring the run under the budget, and the smallest power-of-two --cp_size
// (context parallelism) that fits max_length. With --max_context --budget_gib G: the longest
// max_length that fits G GiB with the given options, and the options that would raise it
// (trainers/estimate/max_context.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "engine/checked_int.h"
#include "loaders/option_table.h"
#include "loaders/tokenizer.h"
#include "trainers/common/metrics.h"
#include "trainers/common/trainer.h"
#include "trainers/common/trainer_spec.h"
#include "trainers/estimate/estimate.h"
#include "trainers/estimate/max_context.h"
#include "trainers/estimate/step_cost.h"
#include "trainers/sft/sft.h"

namespace leantune {
namespace {

namespace fs = std::filesystem;

// The dataset sft would read: the given one, or the demo's when no model is given.
std::string setup_dataset(const std::string& dataset, const std::string& model_path) {
  if (!dataset.empty()) return dataset;
  const fs::path demo = fs::path(model_path).parent_path() / "stories.jsonl";
  return fs::exists(demo) ? demo.string() : "";
}

void print_estimate(const MemoryEstimate& e) {
  std::printf("  %-22s %12s\n", "params", format_bytes(e.params).c_str());
  std::printf("  %-22s %12s\n", "grads", format_bytes(e.grads).c_str());
  std::printf("  %-22s %12s\n", "optimizer states", format_bytes(e.optimizer).c_str());
  if (e.optimizer_host > 0)
    std::printf("  %-22s %12s  (host memory, not in the peak)\n", "optimizer on the host",
                format_bytes(e.optimizer_host).c_str());
  std::printf("  %-22s %12s\n", "activations", format_bytes(e.activations).c_str());
  std::printf("  %-22s %12s\n", "loss (held)", format_bytes(e.loss).c_str());
  std::printf("  %-22s %12s\n", "workspace at peak", format_bytes(e.workspace).c_str());
  std::printf("  %-22s %12s  (during %s, %s)\n", "peak", format_bytes(e.peak).c_str(),
              e.peak_phase.c_str(), e.peak_detail.c_str());
  std::printf("outside the allocator (host):\n");
  std::printf("  %-22s %12s\n", "code, tokenizer, data",
              format_bytes(e.outside_allocator - e.blas_buffers).c_str());
  std::printf("  %-22s %12s\n", "BLAS buffers", format_bytes(e.blas_buffers).c_str());
  if (e.offloaded_host > 0)
    std::printf("  %-22s %12s\n", "offloaded activations", format_bytes(e.offloaded_host).c_str());
  if (e.loading_rss > 0)
    std::printf("  %-22s %12s  (streaming load: one tensor's host copy at a time)\n",
                "while loading", format_bytes(e.loading_rss).c_str());
  std::printf("  %-22s %12s\n", "peak RSS", format_bytes(e.rss_peak).c_str());
}

// Bytes of a budget in GiB; beyond 8 EiB every estimate fits (and the cast would overflow).
int64_t budget_bytes(double gib) {
  return gib >= 8.0 * 1024 * 1024 * 1024 ? INT64_MAX
                                         : static_cast<int64_t>(gib * 1024.0 * 1024.0 * 1024.0);
}

// estimate --max_context: the longest max_length under the budget, its estimate, and the option
// changes that would lengthen it.
int print_max_context(const EstimateConfig& cfg, double budget, int64_t batch,
                      const std::string& path, const ModelConfig& model, const Device& device) {
  LT_CHECK_INPUT(budget > 0, "option max_context: needs --budget_gib above 0 (got ", budget,
                 "): the device memory to fit");
  const int64_t limit = budget_bytes(budget);
  const ContextFit fit = max_context(cfg, batch, limit);
  auto describe = [](const ContextFit& f) {
    std::string s = std::to_string(f.max_length) + " tokens" + (f.capped ? " or more" : "");
    if (f.max_length > 0)
      s += " (peak " + format_bytes(f.peak) +
           (f.tiling_chunk > 0 ? ", tiled in blocks of " + std::to_string(f.tiling_chunk) + ")"
                               : ", untiled)");
    return s;
  };
  std::printf(
      "max context for %s (%s) on %s, %s, %lld sequence%s per micro-batch (cp_size %lld), "
      "within %.2f GiB:\n  max_length %s\n",
      path.c_str(), model.architecture.c_str(), device.str().c_str(), dtype_name(cfg.dtype),
      static_cast<long long>(batch), batch == 1 ? "" : "s", static_cast<long long>(cfg.cp_size),
      budget, describe(fit).c_str());
  if (fit.max_length > 0) {
    std::printf("estimate at that length:\n");
    print_estimate(estimate_memory(with_sequence_length(cfg, batch, fit.max_length)));
  }
  const std::vector<ContextOption> raise = context_raising_options(cfg, batch, limit, fit);
  std::printf("options that would raise it:\n");
  for (const ContextOption& r : raise)
    std::printf("  %-60s max_length %s\n", r.what.c_str(), describe(r.fit).c_str());
  if (raise.empty())
    std::printf("  none of offloading, checkpointing, tiling, QLoRA, smaller chunks\n");
  return 0;
}

// Host memory resident before training: this process's own code and libraries (measured now:
// the same binary runs sft), the tokenizer (measured by loading it), and the dataset (its file
// size twice over: the text while it is read, and the token ids).
int64_t resident_before_training(const std::string& model_path, const std::string& dataset) {
  const int64_t base = process_rss_bytes(false);
  int64_t tokenizer = 0;
  const fs::path dir =
      fs::is_directory(model_path) ? fs::path(model_path) : fs::path(model_path).parent_path();
  if (fs::exists(dir / "tokenizer.json")) {
    try {
      auto tok = Tokenizer::load(dir.string());
      tokenizer = std::max<int64_t>(0, process_rss_bytes(false) - base);
    } catch (const Error&) {
      tokenizer = 0;  // sft reports a broken tokenizer itself
    }
  }
  std::error_code ec;
  const auto data = dataset.empty() ? 0 : fs::file_size(dataset, ec);
  return base + tokenizer + (ec ? 0 : 2 * static_cast<int64_t>(data));
}

// estimate's own options, after sft's.
struct EstimateToolArguments : EstimateRanks {
  double budget_gib = 0.0;
  bool max_context = false;
};

const OptionTable<EstimateToolArguments>& estimate_tool_table() {
  using E = EstimateToolArguments;
  static const OptionTable<E> t =
      OptionTable<E>()
          .real("budget_gib", &E::budget_gib, "device memory available (GiB); 0 = no budget check",
                0.0)
          .flag("max_context", &E::max_context,
                "print the longest max_length whose peak fits --budget_gib (one sequence per "
                "micro-batch unless --per_device_train_batch_size is given) and the options that "
                "would raise it")
          // Shared with the other estimates (estimate.h).
          .base(world_size_table());
  return t;
}

int run_estimate_command(const std::vector<std::string>& args) {
  // trainer_bin estimate <algorithm> ...: that algorithm's estimate (its TrainerSpec).
  if (!args.empty())
    if (const TrainerSpec* spec = find_trainer_spec(args[0]); spec && spec->estimate)
      return spec->estimate({args.begin() + 1, args.end()});
  Options o = sft_options("estimate");
  estimate_tool_table().declare(o);
  const std::optional<EstimateTarget> t = parse_estimate_target(o, args);
  if (!t) return 0;
  const EstimateToolArguments a = estimate_tool_table().read(o);
  const std::string& path = t->path;
  const ModelConfig& model = t->model;
  const Device& device = t->device;
  EstimateConfig cfg = estimate_config_from_options(o, model, device.is_cpu());
  // Context parallelism: the world is at least the cp group (one data shard by default).
  cfg.world_size = o.is_set("world_size") ? a.world_size : cfg.cp_size;
  LT_CHECK_INPUT(cfg.world_size % cfg.cp_size == 0, "option cp_size ", cfg.cp_size,
                 ": the world size ", cfg.world_size, " must be a multiple of it");
  cfg.resident_before_training =
      resident_before_training(path, setup_dataset(train_data_path(model_source(o)), path));
  if (a.max_context) {
    const int64_t batch = o.is_set("per_device_train_batch_size")
                              ? training_table().read(o).per_device_train_batch_size
                              : 1;
    return print_max_context(cfg, a.budget_gib, batch, path, model, device);
  }
  const MemoryEstimate e = estimate_memory(cfg);
  std::printf(
      "estimate for %s (%s, %lld parameters, %lld trainable) on %s, %s, %lld tokens per "
      "micro-batch (%lld per rank, cp_size %lld), per rank of %lld (zero_stage %lld):\n",
      path.c_str(), model.architecture.c_str(), static_cast<long long>(e.total_parameters),
      static_cast<long long>(e.trainable_parameters), device.str().c_str(), dtype_name(cfg.dtype),
      static_cast<long long>(cfg.micro_batch_tokens), static_cast<long long>(rank_tokens(cfg)),
      static_cast<long long>(cfg.cp_size), static_cast<long long>(cfg.world_size),
      static_cast<long long>(cfg.zero_stage));
  print_estimate(e);
  const double budget = a.budget_gib;
  if (budget <= 0) return 0;
  const int64_t limit = budget_bytes(budget);
  std::printf("budget %.2f GiB: %s\n", budget, e.peak <= limit ? "fits" : "does not fit");
  // Context parallelism: the smallest power of two that brings max_length under the budget
  // (the world grows to the cp group when it is smaller).
  {
    int64_t found = 0, found_peak = 0;
    for (int64_t n = 1; n <= 64 && found == 0; n *= 2) {
      EstimateConfig c = cfg;
      c.cp_size = n;
      c.world_size = cfg.world_size % n == 0 ? cfg.world_size : n;
      const int64_t peak = estimate_memory(c).peak;
      if (peak <= limit) found = n, found_peak = peak;
    }
    if (found > 0)
      std::printf(
          "context parallelism for %lld-token sequences: --cp_size %lld fits (peak %s per "
          "rank)\n",
          static_cast<long long>(cfg.max_seqlen), static_cast<long long>(found),
          format_bytes(found_peak).c_str());
    else
      std::printf("context parallelism for %lld-token sequences: no --cp_size up to 64 fits\n",
                  static_cast<long long>(cfg.max_seqlen));
  }
  if (e.peak <= limit) return 0;
  struct Variant {
    std::string what;
    EstimateConfig c;
  };
  std::vector<Variant> variants;
  auto with = [&](const std::string& what, auto change) {
    EstimateConfig c = cfg;
    change(c);
    variants.push_back({what, c});
  };
  with("--gradient_checkpointing", [](EstimateConfig& c) { c.gradient_checkpointing = true; });
  with("--activation_offloading", [](EstimateConfig& c) { c.activation_offloading = true; });
  with("--gradient_checkpointing --activation_offloading",
       [](EstimateConfig& c) { c.gradient_checkpointing = c.activation_offloading = true; });
  with("--use_peft", [](EstimateConfig& c) { c.use_peft = true; });
  with("--use_peft --gradient_checkpointing",
       [](EstimateConfig& c) { c.use_peft = c.gradient_checkpointing = true; });
  with("--use_peft --load_in_4bit --gradient_checkpointing",
       [](EstimateConfig& c) { c.use_peft = c.load_in_4bit = c.gradient_checkpointing = true; });
  with("--use_peft --load_in_4bit --gradient_checkpointing --activation_offloading",
       [](EstimateConfig& c) {
         c.use_peft = c.load_in_4bit = c.gradient_checkpointing = c.activation_offloading = true;
       });
  with("--optim adamw_8bit", [](EstimateConfig& c) { c.optim = "adamw_8bit"; });
  with("--optim adamw_8bit --gradient_checkpointing", [](EstimateConfig& c) {
    c.optim = "adamw_8bit";
    c.gradient_checkpointing = true;
  });
  if (cfg.gradient_accumulation_steps == 1) {
    with("--optim adamw_8bit --optimizer_in_backward --max_grad_norm 0 --gradient_checkpointing",
         [](EstimateConfig& c) {
           c.optim = "adamw_8bit";
           c.optimizer_in_backward = c.gradient_checkpointing = true;
         });
    with(
        "--optim paged_adamw_8bit --optimizer_in_backward --max_grad_norm 0 "
        "--gradient_checkpointing",
        [](EstimateConfig& c) {
          c.optim = "paged_adamw_8bit";
          c.optimizer_in_backward = c.gradient_checkpointing = true;
        });
    with(
        "--optim adamw_8bit --optimizer_in_backward --max_grad_norm 0 --gradient_checkpointing "
        "--offload_optimizer cpu",
        [](EstimateConfig& c) {
          c.optim = "adamw_8bit";
          c.optimizer_in_backward = c.gradient_checkpointing = c.offload_optimizer = true;
        });
  }
  with("--optim paged_adamw_8bit --gradient_checkpointing", [](EstimateConfig& c) {
    c.optim = "paged_adamw_8bit";
    c.gradient_checkpointing = true;
  });
  with("--offload_optimizer cpu --gradient_checkpointing",
       [](EstimateConfig& c) { c.offload_optimizer = c.gradient_checkpointing = true; });
  // Smaller micro-batches keep the update's examples only where the batch divides evenly.
  const int64_t batch = training_table().read(o).per_device_train_batch_size;
  for (int64_t div = 2; div <= batch; div *= 2) {
    if (batch % div != 0) break;
    with("--per_device_train_batch_size " + std::to_string(batch / div) +
             " --gradient_accumulation_steps " +
             std::to_string(cfg.gradient_accumulation_steps * div),
         [div](EstimateConfig& c) {
           c.micro_batch_tokens /= div;
           c.gradient_accumulation_steps *= div;
         });
  }
  struct Fit {
    const Variant* v;
    int64_t peak;
    StepCost cost;
  };
  const StepCost now = step_cost(cfg, e, cfg);
  std::vector<Fit> fits;
  for (const Variant& v : variants) {
    const MemoryEstimate ev = estimate_memory(v.c);
    if (ev.peak <= limit) fits.push_back({&v, ev.peak, step_cost(v.c, ev, cfg)});
  }
  // Fastest first: the modelled time, then the changes whose costs it leaves out last, then
  // the smaller peak.
  std::stable_sort(fits.begin(), fits.end(), [&](const Fit& a, const Fit& b) {
    // At the precision shown: LoRA's adapter FLOPs do not put it behind an equal change.
    const auto ta = std::lround(100 * a.cost.flops / now.flops),
               tb = std::lround(100 * b.cost.flops / now.flops);
    if (ta != tb) return ta < tb;
    if (a.cost.unmodelled.size() != b.cost.unmodelled.size())
      return a.cost.unmodelled.size() < b.cost.unmodelled.size();
    return a.peak < b.peak;
  });
  if (fits.empty()) {
    std::printf(
        "options that fit: none of the single changes tried; combine them or shorten "
        "max_length\n");
    return 0;
  }
  std::printf(
      "options that fit, fastest first (step time against the options given, from the FLOP "
      "count: %s; what the count leaves out is named):\n",
      kStepCostModel);
  for (const Fit& f : fits) {
    std::string extra;
    for (const std::string& u : f.cost.unmodelled) extra += (extra.empty() ? " + " : ", ") + u;
    std::printf("  %-80s peak %-10s time %.2fx%s\n", f.v->what.c_str(),
                format_bytes(f.peak).c_str(), f.cost.flops / now.flops, extra.c_str());
  }
  return 0;
}

// Every estimate computes its sizes in checked arithmetic (engine/checked_int.h): options whose
// memory passes 2^63 bytes are one line naming the numbers given, not a wrapped negative size.
int run_estimate(const std::vector<std::string>& args) {
  try {
    return run_estimate_command(args);
  } catch (const OverflowError&) {
    auto number = [](const std::string& v) {
      return !v.empty() && v.find_first_not_of("0123456789.eE+-") == std::string::npos;
    };
    std::string given;
    for (size_t i = 0; i < args.size(); ++i) {
      const std::string& a = args[i];
      if (a.rfind("--", 0) != 0) continue;
      const size_t eq = a.find('=');
      if (eq != std::string::npos && number(a.substr(eq + 1)))
        given += (given.empty() ? "" : ", ") + a.substr(2, eq - 2) + " " + a.substr(eq + 1);
      else if (eq == std::string::npos && i + 1 < args.size() && number(args[i + 1]))
        given += (given.empty() ? "" : ", ") + a.substr(2) + " " + args[i + 1];
    }
    LT_THROW(ErrorKind::kInput, "estimate: the memory of ",
             given.empty() ? std::string("this model's config") : "options " + given,
             " passes 2^63 bytes (8 EiB), where 64-bit sizes overflow; no device holds that much");
  }
}

}  // namespace

int cmd_estimate(const std::vector<std::string>& args) { return run_estimate(args); }

}  // namespace leantune
