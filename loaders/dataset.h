// JSONL datasets in TRL's formats: detection, per-line validation and typed records.
//
// Contract: the format is detected from the first valid line and every later line must have the
// same format: a file has one schema (check_row_format). A line that lacks a key of the format is
// a missing_key line; a line whose keys make another format (a "margin" or an explicit "prompt"
// only from row 2 on, a "label" beside prompt+completion, ...) is a format_mismatch line naming
// the key and the first line's format, never read as the first line's format with the key
// dropped. Other bad lines: wrong_type / empty_text / out_of_range, see jsonl.h for the others. A
// bad line throws Error(kInput) "file:line: what" unless skip_bad_lines is set, in which case it is
// skipped and counted per category. Reading is streamed: one Record at a time.
//
// Formats (TRL names; "conversational" = values are lists of {"role","content"} messages):
//   language_modeling     {"text"} (key renamed by dataset_text_field) or {"messages":[...]}
//   prompt_only           {"prompt"}
//   prompt_completion     {"prompt","completion"}  both strings or both message lists
//   preference            {"prompt","chosen","rejected"}; implicit prompt {"chosen","rejected"}:
//                         the prompt is extracted as TRL's extract_prompt does (see below)
//   unpaired_preference   {"prompt","completion","label": bool}
//   tokenized             {"input_ids":[int...]} with optional "completion_mask" /
//   "assistant_masks"
//                         (0/1 lists of the same length) and optional "labels" (each label -100
//                         or equal to its input id; other labels are rejected)
// Preference rows may carry a "margin" number (RewardTrainer's optional column): when the first
// line has one, every line must (a finite number). Keys outside the format are ignored. Detection
// order: input_ids, messages, the text field, chosen+rejected, prompt+completion(+label), prompt.
//
// Empty text: "" for text/prompt-only prompt/completion/chosen/rejected, or an empty message list.
// A prompt may be empty in prompt_completion/preference/unpaired data. Empty input_ids are valid:
// such a row, like any example that tokenizes to nothing, is dropped and counted by the SFT
// loader (loaders/examples.h DataStats::empty_examples), as TRL's packing drops it.
//
// Implicit prompt (TRL extract_prompt, reproduced): idx = the first index where chosen and
// rejected differ (characters for strings, whole messages for lists); if they never differ
// within the shorter length, idx = min_length - 1 (TRL's loop leaves it there). For strings, a
// space just before idx moves to the completions (idx -= 1, only when idx >= 1). prompt =
// chosen[:idx]. If "prompt" is present but its style (string vs messages) differs from chosen's,
// it is ignored and the prompt extracted, as maybe_extract_prompt does.
//
// API
//   DatasetReader reader(path, options);  while (reader.next(&record)) ...
//   reader.format(), reader.bad_lines(), reader.lines_read()
//   DatasetFormat detect_format(const nlohmann::json& first_line, text_field)  (throws kInput)
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "loaders/jsonl.h"

namespace leantune {

enum class DatasetKind {
  kLanguageModeling,
  kPromptOnly,
  kPromptCompletion,
  kPreference,
  kUnpairedPreference,
  kTokenized,
};
const char* dataset_kind_name(DatasetKind kind);

struct DatasetFormat {
  DatasetKind kind = DatasetKind::kLanguageModeling;
  bool conversational = false;
  bool implicit_prompt = false;      // preference without a usable "prompt" key
  bool has_completion_mask = false;  // tokenized only
  bool has_assistant_masks = false;  // tokenized only
  bool has_labels = false;           // tokenized only
  bool has_margin = false;           // preference with a "margin" number (RewardTrainer's column)
  std::string text_field = "text";   // language_modeling: the key read ("messages" when that)
  // "prompt_completion (conversational)", "tokenized (input_ids, completion_mask)", ...
  std::string name() const;
};

struct Message {
  std::string role;
  std::string content;
  bool operator==(const Message& o) const { return role == o.role && content == o.content; }
};

// A string or a message list, as the dataset's style says.
struct TextField {
  std::string text;
  std::vector<Message> messages;
  bool operator==(const TextField& o) const { return text == o.text && messages == o.messages; }
};

struct Record {
  int64_t line = 0;  // 1-based line in the file
  TextField text;    // language_modeling: the text field, or "messages"
  TextField prompt;
  TextField completion;  // prompt_completion and unpaired_preference
  TextField chosen;
  TextField rejected;
  bool label = false;                    // unpaired_preference
  double margin = 0;                     // preference with has_margin
  std::vector<int32_t> input_ids;        // tokenized
  std::vector<uint8_t> completion_mask;  // tokenized, when present
  std::vector<uint8_t> assistant_masks;  // tokenized, when present
  std::vector<uint8_t> label_mask;       // tokenized with "labels": 1 where label != -100
};

struct DatasetReaderOptions {
  std::string dataset_text_field = "text";
  bool skip_bad_lines = false;
  // > 0: tokenized ids must be < vocab_size (else out_of_range).
  int64_t vocab_size = 0;
  // Implicit-prompt preference rows: extract the shared prompt (DPO, KTO), or leave chosen and
  // rejected whole with an empty prompt (RewardTrainer tokenizes each whole).
  bool extract_implicit_prompt = true;
};

// Detects the format of one parsed line; throws Error(kInput) naming the keys when none fits.
DatasetFormat detect_format(const nlohmann::json& obj, const std::string& text_field);

// " (dataset format, from line N: <name>)": what a bad line's message ends with, so that it names
// the format the file's first row set.
std::string format_note(const DatasetFormat& format, int64_t format_line);

// The one-schema check of every JSONL loader: a row against the file's format, detected on line
// `format_line` (text_field: the dataset_text_field option). A key of the format missing from the
// row is missing_key ("missing key 'completion'"); a key the row has that makes it another format
// is format_mismatch, naming the key and the file's format. nullopt when the keys agree (values
// are checked by the reader).
std::optional<LineProblem> check_row_format(const DatasetFormat& format, int64_t format_line,
                                            const nlohmann::json& row,
                                            const std::string& text_field);

// TRL's extract_prompt on two strings or two message lists (see the header comment).
void extract_prompt(TextField* chosen, TextField* rejected, TextField* prompt, bool conversational);

class DatasetReader {
 public:
  DatasetReader(JsonlSource source, DatasetReaderOptions options = {});

  // Reads the next valid record; false at end of file. Throws Error(kInput) on a bad line
  // unless skip_bad_lines, and at the end when the file held no valid line at all.
  bool next(Record* record);

  // Valid once next() returned true at least once.
  const DatasetFormat& format() const { return *format_; }
  bool has_format() const { return format_.has_value(); }
  const BadLineCounts& bad_lines() const { return bad_lines_; }
  int64_t records_read() const { return records_; }
  int64_t lines_read() const { return reader_.line_number(); }
  int64_t blank_lines() const { return reader_.blank_lines(); }
  const std::string& path() const { return reader_.path(); }

 private:
  bool convert(const nlohmann::json& obj, Record* record, LineProblem* problem);
  void bad_line(const LineProblem& problem);

  JsonlReader reader_;
  DatasetReaderOptions options_;
  std::optional<DatasetFormat> format_;
  int64_t format_line_ = 0;  // the line format_ was detected on
  BadLineCounts bad_lines_;
  int64_t records_ = 0;
  nlohmann::json obj_;
};

}  // namespace leantune
