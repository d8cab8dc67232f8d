// trainer_bin lengths --dataset F.jsonl --tokenizer DIR [--chat_template NAME] [--plot F.svg]
//                     [--per_device_train_batch_size B] [--seed S]
// Tokenises a dataset as SFT would (no truncation) and prints: percentiles of the example
// lengths, a log2 text histogram, for each candidate max_length the fraction of examples kept
// whole and of tokens kept, a recommended max_length, and the efficiency that padded batches,
// padding-free batches and bfd / bfd_split / wrapped packing would reach at it (definitions in
// loaders/length_stats.h). --plot writes an SVG histogram. A tokenized dataset needs no
// tokenizer. Bad input: exit 2 with one line naming the file (and line).
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/tool_options.h"
#include "engine/check.h"
#include "loaders/examples.h"
#include "loaders/fs_util.h"
#include "loaders/length_stats.h"
#include "loaders/option_table.h"
#include "loaders/text_encoder.h"
#include "loaders/tokenizer.h"
#include "trainers/common/data_options.h"

namespace leantune {
namespace {

struct LengthsArguments : DataToolArguments {
  std::string plot;
  int64_t per_device_train_batch_size = 8;
  int64_t seed = 42;
  DataConfig data;  // the dataset group (dataset_text_field, completion_only_loss, ...)
};

const OptionTable<LengthsArguments>& lengths_table() {
  using L = LengthsArguments;
  static const OptionTable<L> t =
      OptionTable<L>()
          .base(data_tool_table())
          .text("plot", &L::plot, "write an SVG histogram to this path")
          .integer("per_device_train_batch_size", &L::per_device_train_batch_size,
                   "batch size for the padded-efficiency estimate", 1)
          .integer("seed", &L::seed, "shuffle seed for the padded-efficiency estimate", 0)
          .nested(&L::data, dataset_table());
  return t;
}

int run_lengths(const std::vector<std::string>& args) {
  Options o("lengths");
  LengthsArguments a;
  if (!parse_tool_options(lengths_table(), o, args, a)) return 0;
  const std::string& dataset = a.dataset;
  LT_CHECK_INPUT(!dataset.empty(), "lengths: --dataset F.jsonl is required");
  const std::string& plot = a.plot;

  DataConfig cfg = a.data;
  cfg.max_length = 0;  // measure whole examples
  validate_data_config(cfg);
  const std::unique_ptr<TextEncoder> encoder = tokenizer_option_encoder(a);
  // The plot path is checked before the (possibly long) tokenisation so a bad path fails fast;
  // it is written at the end, whole or not at all, and never over an input.
  if (!plot.empty())
    check_output_file(
        plot, "plot",
        {{dataset, "--dataset"}, {a.tokenizer, "--tokenizer"}, chat_template_input(a)});

  const SftData data = load_sft_data(dataset, encoder.get(), cfg);
  const std::vector<int64_t> lengths = data.examples.lengths();
  const LengthSummary s = summarize_lengths(lengths);

  std::printf("%s\n", data.stats.summary().c_str());
  std::printf("format: %s\n\n", data.format.name().c_str());
  std::printf(
      "lengths (tokens per example): p50 %lld  p90 %lld  p95 %lld  p99 %lld  max %lld"
      "  (min %lld, mean %.1f)\n\n",
      static_cast<long long>(s.p50), static_cast<long long>(s.p90), static_cast<long long>(s.p95),
      static_cast<long long>(s.p99), static_cast<long long>(s.max), static_cast<long long>(s.min),
      s.mean);
  std::printf("histogram:\n%s\n", text_histogram(lengths).c_str());

  std::printf("%-12s %-18s %15s %13s\n", "max_length", "", "examples_whole", "tokens_kept");
  for (const CandidateRow& r : candidate_table(lengths)) {
    std::printf("%-12lld %-18s %14.2f%% %12.2f%%\n", static_cast<long long>(r.max_length),
                r.label.c_str(), 100.0 * r.examples_kept, 100.0 * r.tokens_kept);
  }
  const int64_t rec = recommend_max_length(lengths);
  std::printf(
      "\nrecommended max_length: %lld (smallest candidate keeping >= 99%% of the examples "
      "whole, rounded up to a multiple of 64)\n\n",
      static_cast<long long>(rec));

  const int64_t bs = a.per_device_train_batch_size;
  std::printf("efficiency at max_length %lld (real tokens / processed tokens; batch size %lld):\n",
              static_cast<long long>(rec), static_cast<long long>(bs));
  std::printf("  %-13s %10s %12s %10s\n", "strategy", "efficiency", "tokens_kept", "rows");
  for (const StrategyEfficiency& e :
       strategy_efficiencies(lengths, rec, bs, static_cast<uint64_t>(a.seed))) {
    std::printf("  %-13s %9.2f%% %11.2f%% %10lld %s\n", e.name.c_str(), 100.0 * e.efficiency,
                100.0 * e.tokens_kept, static_cast<long long>(e.rows),
                e.name == "padded" || e.name == "padding_free" ? "micro-batches" : "bins");
  }

  if (!plot.empty()) {
    write_text_atomic(plot, svg_histogram(lengths, dataset, rec));
    std::printf("\nwrote %s\n", plot.c_str());
  }
  return 0;
}

}  // namespace

int cmd_lengths(const std::vector<std::string>& args) { return run_lengths(args); }

}  // namespace leantune
