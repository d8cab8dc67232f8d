// trainer_bin pack --dataset F.jsonl [--tokenizer DIR] --max_length L
//                  [--packing_strategy bfd|bfd_split|wrapped] --out OUT.jsonl
// Packs a dataset offline exactly as training would (loaders/pack.h, TRL's pack_dataset) and
// writes one JSON line per bin, in bin order:
//   bfd, bfd_split  {"input_ids": [...], "seq_lengths": [...]}   one length per packed sequence
//   wrapped         {"input_ids": [...]}                          a bin is one sequence (TRL)
// plus "labels" ([...], -100 where no loss) on every line when some token of the dataset is
// masked (completion_only_loss, assistant_only_loss or masks in a tokenized dataset).
// A tokenized {"input_ids"} dataset needs no tokenizer. OUT is never an input (the dataset, the
// tokenizer folder), and is written to a temporary file renamed on success (output_path.h), so
// an interrupted run leaves no partial file under OUT. A summary goes to stdout.
// Bad input: exit 2 with one line naming the file (and line).
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/tool_options.h"
#include "engine/check.h"
#include "loaders/examples.h"
#include "loaders/fs_util.h"
#include "loaders/option_table.h"
#include "loaders/pack.h"
#include "loaders/text_encoder.h"
#include "loaders/tokenizer.h"
#include "trainers/common/data_options.h"
#include "trainers/common/output_path.h"

namespace leantune {
namespace {

void write_ints(std::string* out, const char* key, const int32_t* v, size_t n, bool first) {
  if (!first) out->append(",");
  out->append("\"").append(key).append("\":[");
  char buf[16];
  for (size_t i = 0; i < n; ++i) {
    const int len = std::snprintf(buf, sizeof(buf), i ? ",%d" : "%d", v[i]);
    out->append(buf, static_cast<size_t>(len));
  }
  out->append("]");
}

struct PackArguments : DataToolArguments {
  int64_t max_length = 0;  // required: is_set checks the user gave it
  std::string out;
  DataConfig data;  // the dataset group (dataset_text_field, completion_only_loss, ...)
};

const OptionTable<PackArguments>& pack_table() {
  using P = PackArguments;
  static const OptionTable<P> t =
      OptionTable<P>()
          .base(data_tool_table())
          .integer("max_length", &P::max_length, "bin size in tokens", 1)
          .nested(&P::data, packing_table())
          .text("out", &P::out, "output JSONL path")
          .nested(&P::data, dataset_table());
  return t;
}

int run_pack(const std::vector<std::string>& args) {
  Options o("pack");
  PackArguments a;
  if (!parse_tool_options(pack_table(), o, args, a)) return 0;
  const std::string& dataset = a.dataset;
  const std::string& out_path = a.out;
  LT_CHECK_INPUT(!dataset.empty(), "pack: --dataset F.jsonl is required");
  LT_CHECK_INPUT(!out_path.empty(), "pack: --out OUT.jsonl is required");
  LT_CHECK_INPUT(o.is_set("max_length"), "pack: --max_length L is required");
  check_output_file(out_path, "out",
                    {{dataset, "--dataset"}, {a.tokenizer, "--tokenizer"}, chat_template_input(a)});

  DataConfig cfg = a.data;
  cfg.max_length = a.max_length;
  cfg.packing = true;
  validate_data_config(cfg);

  const std::unique_ptr<TextEncoder> encoder = tokenizer_option_encoder(a);
  const SftData data = load_sft_data(dataset, encoder.get(), cfg);
  const TokenizedDataset& ex = data.examples;
  const Packing packing =
      pack_lengths(ex.lengths(), cfg.max_length, parse_packing_strategy(cfg.packing_strategy),
                   cfg.packing_window);
  bool any_masked = false;
  for (int64_t i = 0; i < ex.size() && !any_masked; ++i) {
    for (uint8_t m : ex.mask(i)) {
      if (!m) {
        any_masked = true;
        break;
      }
    }
  }

  // Written to a temporary file renamed on success: an interrupted run or a full disk leaves no
  // partial file under OUT.
  write_file_atomic(out_path, [&](std::FILE* f) {
    std::string line;
    std::vector<int32_t> ids, labels;
    for (int64_t b = 0; b < packing.num_bins(); ++b) {
      ids.clear();
      labels.clear();
      for (const Segment& s : packing.bin(b)) {
        const auto src =
            ex.ids(s.item).subspan(static_cast<size_t>(s.begin), static_cast<size_t>(s.length));
        const auto mask =
            ex.mask(s.item).subspan(static_cast<size_t>(s.begin), static_cast<size_t>(s.length));
        for (size_t k = 0; k < src.size(); ++k) {
          ids.push_back(src[k]);
          labels.push_back(mask[k] ? src[k] : -100);
        }
      }
      line = "{";
      write_ints(&line, "input_ids", ids.data(), ids.size(), true);
      if (!packing.bin_is_one_sequence()) {
        const std::vector<int32_t> lens = packing.seq_lengths(b);
        write_ints(&line, "seq_lengths", lens.data(), lens.size(), false);
      }
      if (any_masked) write_ints(&line, "labels", labels.data(), labels.size(), false);
      line += "}\n";
      write_bytes(f, line.data(), line.size(), out_path);
    }
  });

  std::printf("%s\n", data.stats.summary().c_str());
  // Empty examples stay zero-length items for the packing windows; the packer drops them.
  const int64_t packed_examples = ex.size() - packing.empty_items;
  std::printf(
      "packed %lld examples with %s (max_length %lld) into %lld bins: efficiency %.4f, "
      "%lld tokens dropped (%lld examples truncated), %lld fragments from %lld split examples "
      "-> %s\n",
      static_cast<long long>(packed_examples), packing_strategy_name(packing.strategy),
      static_cast<long long>(packing.max_length), static_cast<long long>(packing.num_bins()),
      packing.efficiency(), static_cast<long long>(packing.dropped_tokens),
      static_cast<long long>(packing.truncated_items),
      static_cast<long long>(packing.strategy == PackingStrategy::kBfdSplit
                                 ? static_cast<int64_t>(packing.segments.size()) - packed_examples +
                                       packing.split_items
                                 : 0),
      static_cast<long long>(packing.split_items), out_path.c_str());
  return 0;
}

}  // namespace

int cmd_pack(const std::vector<std::string>& args) { return run_pack(args); }

}  // namespace leantune
