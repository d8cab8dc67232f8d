// The model and dataset options every trainer declares (see model_source.h).
#include "trainers/common/model_source.h"

#include <algorithm>
#include <filesystem>
#include <utility>
#include <vector>

#include "engine/check.h"
#include "loaders/hub_cache.h"

namespace leantune {

OptionTable<ModelSource> model_source_table(std::string model_help, std::string dataset_help) {
  return OptionTable<ModelSource>()
      .text("model_name_or_path", &ModelSource::model_name_or_path, std::move(model_help))
      .text("model_revision", &ModelSource::model_revision,
            "the branch, tag or commit of a Hub ID in model_name_or_path (looked up in the local "
            "Hugging Face cache; nothing is downloaded)")
      .text("dataset", &ModelSource::dataset, std::move(dataset_help))
      .alias("dataset_name", "dataset")
      .text("eval_dataset", &ModelSource::eval_dataset,
            "evaluation data, in the training data's format: evaluated as eval_strategy says "
            "and once at the end")
      .text("dataset_train_split", &ModelSource::dataset_train_split,
            "the split of a dataset folder to train on (its <split>.jsonl or <split>-*.jsonl)")
      .text("dataset_test_split", &ModelSource::dataset_test_split,
            "the split of a dataset folder evaluated under an eval_strategy when no eval_dataset "
            "is given");
}

const OptionTable<ScoredSequences>& scored_sequences_table() {
  using S = ScoredSequences;
  static const OptionTable<S> t =
      OptionTable<S>()
          .integer_or_none("max_length", &S::max_length,
                           "cut prompt + completion to this many tokens; none = no limit", 1)
          // kto: TRL's collator keeps the start of a too-long sequence (KTOConfig has no option).
          .text("truncation_mode", &S::truncation_mode, "which end of a too-long sequence is kept",
                {"keep_start", "keep_end"})
          .flag("use_liger_loss", &S::use_liger_loss,
                "chunked LM head for the log-probabilities: the [tokens x vocab] logits never "
                "exist (off: full logits; leantune's option, not in TRL 1.16)");
  return t;
}

namespace {
namespace fs = std::filesystem;

bool jsonl(const fs::path& p) { return fs::is_regular_file(p) && p.extension() == ".jsonl"; }
}  // namespace

std::string dataset_split_file(const std::string& path, const std::string& split,
                               const char* option, bool required) {
  if (path.empty() || !fs::is_directory(path)) return path;
  std::vector<std::string> matches, all;
  for (const fs::path& dir : {fs::path(path), fs::path(path) / "data"}) {
    if (!fs::is_directory(dir)) continue;
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir))
      if (jsonl(e.path())) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) {
      const std::string name = f.filename().string();
      all.push_back(f.string());
      if (name == split + ".jsonl" || name.rfind(split + "-", 0) == 0)
        matches.push_back(f.string());
    }
  }
  if (matches.empty() && split == "train" && all.size() == 1) return all[0];
  std::string listed;
  for (const std::string& f : all) listed += (listed.empty() ? "" : ", ") + f;
  LT_CHECK_INPUT(matches.size() <= 1, "option --", option, " ", path, ": split '", split,
                 "' is in ", matches.size(),
                 " files; leantune reads one JSONL file per split (concatenate them)");
  if (matches.empty()) {
    LT_CHECK_INPUT(!required, "option --", option, " ", path, ": no JSONL file of split '", split,
                   "' (", split, ".jsonl or ", split, "-*.jsonl, also under data/); it holds ",
                   all.empty() ? std::string("no .jsonl file") : listed);
    return "";
  }
  return matches[0];
}

std::string train_data_path(const ModelSource& s) {
  return dataset_split_file(s.dataset, s.dataset_train_split, "dataset");
}

std::string eval_data_path(const ModelSource& s, const std::string& eval_strategy) {
  if (!s.eval_dataset.empty())
    return dataset_split_file(s.eval_dataset, s.dataset_test_split, "eval_dataset");
  if (eval_strategy == "no" || s.dataset.empty() || !fs::is_directory(s.dataset)) return "";
  return dataset_split_file(s.dataset, s.dataset_test_split, "dataset", false);
}

std::string model_folder(const ModelSource& s) {
  return resolve_model_path(s.model_name_or_path, "model_name_or_path", s.model_revision);
}

ModelSource model_source(const Options& o) {
  static const OptionTable<ModelSource> names = model_source_table("", "");
  return names.read(o);
}

void check_tokenizer_fits(int64_t tokenizer_vocab, const std::string& tokenizer_dir,
                          int64_t model_vocab, const std::string& model_dir) {
  LT_CHECK_INPUT(tokenizer_vocab <= model_vocab, tokenizer_dir, "/tokenizer.json has ",
                 tokenizer_vocab, " tokens but ", model_dir, "/config.json has vocab_size ",
                 model_vocab,
                 ": the tokenizer belongs to another model; use the tokenizer files that came "
                 "with the model");
}

}  // namespace leantune
