// Tokenised training examples: SFT examples with loss masks, preference pairs, unpaired and
// prompt-only examples, built from a JSONL dataset with TRL's semantics, with every truncation
// and drop counted.
//
// SFT (SFTTrainer._prepare_dataset):
//   text               text (+ eos text unless it already ends with it) -> encode(add_special=on)
//   prompt_completion  prompt ids = encode(prompt); ids = encode(prompt + completion + eos unless
//                      the completion ends with it); the completion starts at the common prefix
//                      of the two (TRL's common_prefix_length; a shorter prefix is counted in
//                      prompt_mismatch). completion_mask = 0 on the prompt, 1 after.
//   conversational     encode_chat(messages); prompt_completion: prompt ids = encode_chat(prompt,
//                      add_generation_prompt) and ids = encode_chat(prompt + completion).
//   tokenized          input_ids with its completion_mask / assistant_masks / labels.
//   loss mask          1 where the label is the token: completion_mask when completion_only_loss
//                      applies (data_config.h), AND the assistant mask when assistant_only_loss,
//                      AND (tokenized "labels") label != -100. Labels = ids where mask, else -100.
//   truncation         without packing and with max_length > 0: ids and mask are sliced together
//                      ([:L] keep_start, [-L:] keep_end). With packing nothing is cut here: the
//                      packer cuts (bfd counts its overflow).
//   drop               an example with no trainable token is dropped and counted. Without
//                      packing, trainable means mask = 1 at a position >= 1: the label of a
//                      sequence's first position never reaches the loss (causal shift), so an
//                      example trainable only there would feed a zero-label batch to the loss
//                      (stricter than TRL's "any label" filter). With packing TRL filters nothing;
//                      we drop only examples whose mask is all 0 in what the packer keeps (the
//                      first max_length tokens for bfd), so a 1-token document still packs.
//
// Preference (TRL's older DPOTrainer.tokenize_row + concatenated_forward):
//   conversational     prompt text = render(prompt, add_generation_prompt); chosen text =
//                      render(prompt + chosen) minus the common prefix with the prompt text
//                      (likewise rejected; TRL's apply_chat_template). Then plain text below.
//   ids                prompt = encode(prompt, no special tokens); chosen/rejected =
//                      encode(text, no special tokens) + eos id.
//   truncation         prompt keeps its last max_prompt_length tokens, completions their first
//                      max_completion_length; then prompt+completion is cut to max_length by
//                      truncation_mode (build_preference_sequence). A pair whose chosen or rejected
//                      sequence is left without a completion token at a position >= 1 is dropped.
// Reward pairs (RewardTrainer._prepare_dataset): each side tokenized whole. Standard:
//   encode(prompt + chosen + eos text unless chosen already ends with it, add_special_tokens=on);
//   conversational: encode_chat(prompt + chosen messages) (no eos added). Implicit-prompt rows
//   are not split (chosen and rejected hold their prompt). No truncation: a pair whose chosen or
//   rejected sequence exceeds max_length is dropped and counted (TRL's filter). "margin" is read
//   when the data has it.
// Unpaired (KTO) examples follow the same rules with one completion and its label. Prompt-only
// examples keep the prompt text and its ids (encode_chat with the generation prompt, or
// encode without special tokens); prompts are not truncated (GRPO).
//
// API
//   SftData load_sft_data(path, encoder*, cfg)         encoder may be null for tokenized data
//   bool tokenize_sft_record(record, format, encoder*, cfg, &ids, &mask, &stats)
//   PreferenceData load_preference_data(source, encoder, cfg); RewardData load_reward_data(...)
//   UnpairedData load_unpaired_data(source, encoder, cfg); PromptData load_prompt_data(...)
//   (source: a JSONL file, or rows in memory named like one, loaders/jsonl.h)
//   build_preference_sequence(prompt, completion, max_length, mode, &ids, &completion_mask)
//   DataStats::summary()   one line: kept/dropped/truncated counts and bad lines
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "loaders/data_config.h"
#include "loaders/dataset.h"
#include "loaders/text_encoder.h"

namespace leantune {

// Examples as flat columns (ids and loss mask share offsets), so that millions of examples cost
// five bytes per token and one offset each.
class TokenizedDataset {
 public:
  // cut = tokens truncation removed from this example (reported with the batches it lands in).
  void add(std::span<const int32_t> ids, std::span<const uint8_t> mask, int64_t line,
           int64_t cut = 0);
  void reserve(int64_t examples, int64_t tokens);

  int64_t size() const { return static_cast<int64_t>(lines_.size()); }
  int64_t length(int64_t i) const { return offsets_[i + 1] - offsets_[i]; }
  std::span<const int32_t> ids(int64_t i) const {
    return {ids_.data() + offsets_[i], static_cast<size_t>(length(i))};
  }
  std::span<const uint8_t> mask(int64_t i) const {
    return {mask_.data() + offsets_[i], static_cast<size_t>(length(i))};
  }
  int64_t line(int64_t i) const { return lines_[i]; }
  int64_t cut(int64_t i) const { return cuts_[i]; }
  int64_t total_tokens() const { return offsets_.back(); }
  std::vector<int64_t> lengths() const;

 private:
  std::vector<int32_t> ids_;
  std::vector<uint8_t> mask_;
  std::vector<int64_t> offsets_{0};
  std::vector<int64_t> lines_;
  std::vector<int64_t> cuts_;
};

struct DataStats {
  std::string path;
  std::string format;  // DatasetFormat::name()
  int64_t lines = 0;   // lines read, blank ones included
  int64_t blank_lines = 0;
  BadLineCounts bad_lines;   // skipped lines (skip_bad_lines)
  int64_t records = 0;       // valid lines
  int64_t examples = 0;      // examples kept
  int64_t tokens = 0;        // tokens kept (after truncation)
  int64_t label_tokens = 0;  // kept tokens whose label reaches the loss (position >= 1)
  int64_t truncated_examples = 0;
  int64_t truncated_tokens = 0;  // tokens cut away from kept examples
  int64_t empty_examples = 0;    // no token at all (empty input_ids, or tokenized to nothing)
  int64_t dropped_examples = 0;  // no trainable token left
  int64_t dropped_tokens = 0;    // all tokens of dropped examples (before truncation)
  int64_t prompt_mismatch = 0;   // tokenized prompt not a prefix of prompt + completion

  // Reward pairs dropped as longer than max_length (TRL's filter), and their tokens.
  int64_t too_long_examples = 0;
  int64_t too_long_tokens = 0;
  // One line: "data.jsonl: 980 examples, 123456 tokens kept; 12 truncated (3456 tokens cut);
  // 3 empty dropped; 8 dropped with no trainable token (901 tokens); no bad lines".
  std::string summary() const;
};

struct SftData {
  TokenizedDataset examples;
  DatasetFormat format;
  DataStats stats;
  bool completion_only_loss = false;  // as resolved for this data
};

// Tokenises one record (SFT kinds only). Fills ids and mask (untruncated) and returns true;
// throws Error(kInput) for a record kind SFT cannot use. stats gets prompt_mismatch.
void tokenize_sft_record(const Record& record, const DatasetFormat& format,
                         const TextEncoder* encoder, const DataConfig& cfg,
                         std::vector<int32_t>* ids, std::vector<uint8_t>* mask, DataStats* stats);

// Loads, tokenises, truncates and filters a whole JSONL file (streamed). encoder may be null
// only for tokenized data. Throws Error(kInput) on bad lines (unless skip_bad_lines), on a
// format SFT cannot use, and when no example is left.
// `source`: a JSONL file or rows in memory (loaders/jsonl.h).
SftData load_sft_data(const JsonlSource& source, const TextEncoder* encoder, const DataConfig& cfg);

// What the loaders of preference, unpaired and prompt-only data return: the examples kept, the
// file's format (detected on its first record) and the counts.
template <typename Example>
struct LoadedExamples {
  std::vector<Example> examples;
  DatasetFormat format;
  DataStats stats;
};

struct PreferenceExample {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> chosen_ids;  // completion only, eos included, after max_completion_length
  std::vector<int32_t> rejected_ids;
  int64_t line = 0;
};

using PreferenceData = LoadedExamples<PreferenceExample>;

struct RewardPair {
  std::vector<int32_t> chosen_ids;  // whole sequence (prompt included)
  std::vector<int32_t> rejected_ids;
  double margin = 0;  // 0 without a margin column
  int64_t line = 0;
};

struct RewardData {
  std::vector<RewardPair> pairs;
  DatasetFormat format;  // format.has_margin: the margin column is used
  DataStats stats;
};

struct UnpairedExample {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> completion_ids;
  bool label = false;
  int64_t line = 0;
};

using UnpairedData = LoadedExamples<UnpairedExample>;

struct PromptExample {
  TextField prompt;  // as read (text or messages), for reward functions
  std::vector<int32_t> prompt_ids;
  int64_t line = 0;
};

using PromptData = LoadedExamples<PromptExample>;

// prompt + completion cut to max_length (0 = none) by mode; completion_mask 0 on the prompt.
void build_preference_sequence(std::span<const int32_t> prompt, std::span<const int32_t> completion,
                               int64_t max_length, TruncationMode mode, std::vector<int32_t>* ids,
                               std::vector<uint8_t>* completion_mask);

PreferenceData load_preference_data(const JsonlSource& source, const TextEncoder& encoder,
                                    const DataConfig& cfg);
// One side of a reward pair (or any prompt + completion scored by a reward model) as
// RewardTrainer tokenizes it (see "Reward pairs" above); prompt may be empty.
std::vector<int32_t> reward_sequence_ids(const TextField& prompt, const TextField& completion,
                                         bool conversational, const TextEncoder& encoder);
// cfg: max_length (0 = none), skip_bad_lines, dataset_text_field.
RewardData load_reward_data(const JsonlSource& source, const TextEncoder& encoder,
                            const DataConfig& cfg);
UnpairedData load_unpaired_data(const JsonlSource& source, const TextEncoder& encoder,
                                const DataConfig& cfg);
PromptData load_prompt_data(const JsonlSource& source, const TextEncoder& encoder,
                            const DataConfig& cfg);

}  // namespace leantune
