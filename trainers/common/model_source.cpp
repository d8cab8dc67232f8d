// The model and dataset options every trainer declares (see model_source.h).
#include "trainers/common/model_source.h"

#include <utility>

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
            "and once at the end");
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
