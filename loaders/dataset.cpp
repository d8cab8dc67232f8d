// JSONL dataset formats and per-line validation (see dataset.h for the contract).
#include "loaders/dataset.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/check.h"
#include "engine/enum_names.h"

namespace leantune {

using nlohmann::json;

const char* dataset_kind_name(DatasetKind kind) {
  static constexpr const char* kNames[] = {"language_modeling",   "prompt_only",
                                           "prompt_completion",   "preference",
                                           "unpaired_preference", "tokenized"};
  static_assert(std::size(kNames) == static_cast<size_t>(DatasetKind::kTokenized) + 1);
  return enum_name(kind, kNames, "unknown");
}

std::string DatasetFormat::name() const {
  std::string s = dataset_kind_name(kind);
  if (kind == DatasetKind::kTokenized) {
    s += " (input_ids";
    if (has_completion_mask) s += ", completion_mask";
    if (has_assistant_masks) s += ", assistant_masks";
    if (has_labels) s += ", labels";
    return s + ")";
  }
  std::vector<std::string> notes;
  if (conversational) notes.push_back("conversational");
  if (implicit_prompt) notes.push_back("implicit prompt");
  if (has_margin) notes.push_back("margin");
  if (kind == DatasetKind::kLanguageModeling && text_field != "text" && text_field != "messages") {
    notes.push_back("text field '" + text_field + "'");
  }
  if (!notes.empty()) {
    s += " (";
    for (size_t i = 0; i < notes.size(); ++i) s += (i ? ", " : "") + notes[i];
    s += ")";
  }
  return s;
}

namespace {

// TRL's is_conversational: a list whose first element is an object with "role".
bool looks_conversational(const json& v) {
  return v.is_array() && !v.empty() && v[0].is_object() && v[0].contains("role");
}

std::string keys_of(const json& obj) {
  std::string s = "{";
  size_t n = 0;
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (n == 8) {
      s += ", ...";
      break;
    }
    s += (n++ ? ", " : "") + it.key();
  }
  return s + "}";
}

struct Fail {
  BadLineKind kind;
  std::string message;
};

[[noreturn]] void fail(BadLineKind kind, std::string message) {
  throw Fail{kind, std::move(message)};
}

const json& require(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end()) fail(BadLineKind::kMissingKey, std::string("missing key '") + key + "'");
  return *it;
}

void read_messages(const json& v, const std::string& key, std::vector<Message>* out) {
  if (!v.is_array()) {
    fail(BadLineKind::kWrongType, "'" + key + "' must be a list of messages, got " + v.type_name());
  }
  out->clear();
  out->reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const json& m = v[i];
    const std::string at = key + "[" + std::to_string(i) + "]";
    if (!m.is_object()) {
      fail(BadLineKind::kWrongType, "'" + at + "' must be a message object, got " + m.type_name());
    }
    auto role = m.find("role");
    if (role == m.end()) fail(BadLineKind::kMissingKey, "missing key 'role' in '" + at + "'");
    if (!role->is_string()) {
      fail(BadLineKind::kWrongType, "'" + at + ".role' must be a string, got " + role->type_name());
    }
    auto content = m.find("content");
    if (content == m.end()) fail(BadLineKind::kMissingKey, "missing key 'content' in '" + at + "'");
    if (!content->is_string()) {
      fail(BadLineKind::kWrongType,
           "'" + at + ".content' must be a string, got " + content->type_name());
    }
    out->push_back({role->get<std::string>(), content->get<std::string>()});
  }
}

// Reads a string or a message list according to the dataset's style.
void read_field(const json& obj, const std::string& key, bool conversational, bool allow_empty,
                TextField* out) {
  auto it = obj.find(key);
  if (it == obj.end()) fail(BadLineKind::kMissingKey, "missing key '" + key + "'");
  const json& v = *it;
  if (conversational) {
    if (v.is_string()) {
      fail(BadLineKind::kWrongType,
           "'" + key + "' is a string but the dataset is conversational (message lists)");
    }
    read_messages(v, key, &out->messages);
    out->text.clear();
    if (!allow_empty && out->messages.empty()) {
      fail(BadLineKind::kEmptyText, "'" + key + "' is an empty message list");
    }
  } else {
    if (!v.is_string()) {
      fail(BadLineKind::kWrongType, "'" + key + "' must be a string, got " +
                                        (looks_conversational(v) ? std::string("a message list")
                                                                 : std::string(v.type_name())));
    }
    out->text = v.get<std::string>();
    out->messages.clear();
    if (!allow_empty && out->text.empty()) {
      fail(BadLineKind::kEmptyText, "'" + key + "' is empty");
    }
  }
}

template <typename T>
void read_int_list(const json& v, const char* key, int64_t lo, int64_t hi, std::vector<T>* out) {
  if (!v.is_array()) {
    fail(BadLineKind::kWrongType,
         std::string("'") + key + "' must be a list of integers, got " + v.type_name());
  }
  out->resize(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const json& e = v[i];
    if (!e.is_number_integer()) {
      fail(BadLineKind::kWrongType, std::string("'") + key + "[" + std::to_string(i) +
                                        "]' must be an integer, got " + e.type_name());
    }
    int64_t x;
    if (e.is_number_unsigned()) {
      const uint64_t u = e.get<uint64_t>();
      x = u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
              ? std::numeric_limits<int64_t>::max()
              : static_cast<int64_t>(u);
    } else {
      x = e.get<int64_t>();
    }
    if (x < lo || x > hi) {
      fail(BadLineKind::kOutOfRange, std::string("'") + key + "[" + std::to_string(i) +
                                         "]' = " + std::to_string(x) + " is outside [" +
                                         std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
    (*out)[i] = static_cast<T>(x);
  }
}

// Python's idx handling of extract_prompt, on a sequence of comparable elements.
template <typename Seq, typename IsSpace>
size_t extract_prompt_index(const Seq& a, const Seq& b, IsSpace is_space) {
  const size_t n = std::min(a.size(), b.size());
  if (n == 0) return 0;
  for (size_t idx = 0; idx < n; ++idx) {
    if (!(a[idx] == b[idx])) {
      if (idx >= 1 && is_space(a[idx - 1])) return idx - 1;
      return idx;
    }
  }
  return n - 1;
}

}  // namespace

void extract_prompt(TextField* chosen, TextField* rejected, TextField* prompt,
                    bool conversational) {
  if (conversational) {
    const size_t idx = extract_prompt_index(chosen->messages, rejected->messages,
                                            [](const Message&) { return false; });
    prompt->text.clear();
    prompt->messages.assign(chosen->messages.begin(), chosen->messages.begin() + idx);
    chosen->messages.erase(chosen->messages.begin(), chosen->messages.begin() + idx);
    rejected->messages.erase(rejected->messages.begin(), rejected->messages.begin() + idx);
  } else {
    const size_t idx =
        extract_prompt_index(chosen->text, rejected->text, [](char c) { return c == ' '; });
    prompt->messages.clear();
    prompt->text = chosen->text.substr(0, idx);
    chosen->text.erase(0, idx);
    rejected->text.erase(0, idx);
  }
}

namespace {
// detect_format, failing with Fail (a bad line) rather than Error.
DatasetFormat detect(const json& obj, const std::string& text_field) {
  DatasetFormat f;
  f.text_field = text_field;
  if (obj.contains("input_ids")) {
    f.kind = DatasetKind::kTokenized;
    f.has_completion_mask = obj.contains("completion_mask");
    f.has_assistant_masks = obj.contains("assistant_masks");
    f.has_labels = obj.contains("labels");
    return f;
  }
  if (obj.contains("messages")) {
    f.kind = DatasetKind::kLanguageModeling;
    f.conversational = true;
    f.text_field = "messages";
    return f;
  }
  if (obj.contains(text_field)) {
    f.kind = DatasetKind::kLanguageModeling;
    f.conversational = looks_conversational(obj[text_field]);
    return f;
  }
  if (obj.contains("chosen") && obj.contains("rejected")) {
    f.kind = DatasetKind::kPreference;
    f.conversational = looks_conversational(obj["chosen"]);
    auto p = obj.find("prompt");
    f.implicit_prompt = p == obj.end() || looks_conversational(*p) != f.conversational;
    f.has_margin = obj.contains("margin") && !obj["margin"].is_null();
    return f;
  }
  if (obj.contains("prompt") && obj.contains("completion")) {
    f.kind =
        obj.contains("label") ? DatasetKind::kUnpairedPreference : DatasetKind::kPromptCompletion;
    f.conversational =
        looks_conversational(obj["prompt"]) || looks_conversational(obj["completion"]);
    return f;
  }
  if (obj.contains("prompt")) {
    f.kind = DatasetKind::kPromptOnly;
    f.conversational = looks_conversational(obj["prompt"]);
    return f;
  }
  fail(BadLineKind::kMissingKey,
       "cannot detect the dataset format from keys " + keys_of(obj) + "; expected one of: '" +
           text_field +
           "', 'messages', 'prompt'+'completion', 'prompt'+'chosen'+'rejected', "
           "'chosen'+'rejected', 'prompt'+'completion'+'label', 'prompt', 'input_ids'");
}
}  // namespace

DatasetFormat detect_format(const json& obj, const std::string& text_field) {
  try {
    return detect(obj, text_field);
  } catch (const Fail& e) {
    LT_THROW(ErrorKind::kInput, e.message);
  }
}

namespace {
// The keys whose presence decides a format (detect_format), in detection order.
std::vector<std::string> format_keys(const DatasetFormat& f) {
  switch (f.kind) {
    case DatasetKind::kTokenized: {
      std::vector<std::string> k = {"input_ids"};
      if (f.has_completion_mask) k.push_back("completion_mask");
      if (f.has_assistant_masks) k.push_back("assistant_masks");
      if (f.has_labels) k.push_back("labels");
      return k;
    }
    case DatasetKind::kLanguageModeling:
      return {f.text_field};
    case DatasetKind::kPreference: {
      std::vector<std::string> k = {"chosen", "rejected"};
      if (!f.implicit_prompt) k.insert(k.begin(), "prompt");
      if (f.has_margin) k.push_back("margin");
      return k;
    }
    case DatasetKind::kUnpairedPreference:
      return {"prompt", "completion", "label"};
    case DatasetKind::kPromptCompletion:
      return {"prompt", "completion"};
    case DatasetKind::kPromptOnly:
      return {"prompt"};
  }
  return {};
}
}  // namespace

std::string format_note(const DatasetFormat& format, int64_t format_line) {
  return " (dataset format, from line " + std::to_string(format_line) + ": " + format.name() + ")";
}

std::optional<LineProblem> check_row_format(const DatasetFormat& format, int64_t format_line,
                                            const json& row, const std::string& text_field) {
  const std::vector<std::string> keys = format_keys(format);
  for (const std::string& k : keys) {
    if (!row.contains(k)) return LineProblem{BadLineKind::kMissingKey, "missing key '" + k + "'"};
  }
  std::vector<std::string> row_keys;
  try {
    row_keys = format_keys(detect(row, text_field));
  } catch (const Fail&) {
    return std::nullopt;  // every key of the format is there: the reader checks the values
  }
  for (const std::string& k : row_keys) {
    if (std::find(keys.begin(), keys.end(), k) != keys.end()) continue;
    return LineProblem{BadLineKind::kFormatMismatch,
                       "has key '" + k + "', which the dataset's format (" + format.name() +
                           ", from line " + std::to_string(format_line) +
                           ") does not use; a file has one schema: give '" + k +
                           "' on every row or on none"};
  }
  return std::nullopt;
}

DatasetReader::DatasetReader(JsonlSource source, DatasetReaderOptions options)
    : reader_(std::move(source)), options_(std::move(options)) {}

bool DatasetReader::convert(const json& obj, Record* r, LineProblem* problem) {
  try {
    if (!format_) {
      format_ = detect(obj, options_.dataset_text_field);
      format_line_ = reader_.line_number();
    } else if (auto p =
                   check_row_format(*format_, format_line_, obj, options_.dataset_text_field)) {
      fail(p->kind, std::move(p->message));
    }
    const DatasetFormat& f = *format_;
    const bool conv = f.conversational;
    r->line = reader_.line_number();
    switch (f.kind) {
      case DatasetKind::kLanguageModeling:
        read_field(obj, f.text_field, conv, false, &r->text);
        break;
      case DatasetKind::kPromptOnly:
        read_field(obj, "prompt", conv, false, &r->prompt);
        break;
      case DatasetKind::kPromptCompletion:
        read_field(obj, "prompt", conv, true, &r->prompt);
        read_field(obj, "completion", conv, false, &r->completion);
        break;
      case DatasetKind::kUnpairedPreference: {
        read_field(obj, "prompt", conv, true, &r->prompt);
        read_field(obj, "completion", conv, false, &r->completion);
        const json& label = require(obj, "label");
        if (!label.is_boolean()) {
          fail(BadLineKind::kWrongType,
               std::string("'label' must be a boolean, got ") + label.type_name());
        }
        r->label = label.get<bool>();
        break;
      }
      case DatasetKind::kPreference:
        read_field(obj, "chosen", conv, false, &r->chosen);
        read_field(obj, "rejected", conv, false, &r->rejected);
        if (f.has_margin) {
          const json& m = require(obj, "margin");
          if (!m.is_number() || !std::isfinite(m.get<double>()))
            fail(BadLineKind::kWrongType, std::string("'margin' must be a finite number, got ") +
                                              (m.is_number() ? m.dump() : m.type_name()));
          r->margin = m.get<double>();
        }
        if (f.implicit_prompt && !options_.extract_implicit_prompt) {
          r->prompt = TextField{};
        } else if (f.implicit_prompt) {
          extract_prompt(&r->chosen, &r->rejected, &r->prompt, conv);
          // The shared prefix is the prompt; a pair whose remaining turns do not begin with the
          // assistant's reply differed before it, i.e. had different prompts.
          const bool prompt_differs = conv ? r->prompt.messages.empty() ||
                                                 (!r->chosen.messages.empty() &&
                                                  r->chosen.messages.front().role != "assistant") ||
                                                 (!r->rejected.messages.empty() &&
                                                  r->rejected.messages.front().role != "assistant")
                                           : r->prompt.text.empty();
          if (prompt_differs) {
            fail(BadLineKind::kWrongType,
                 "implicit prompt: 'chosen' and 'rejected' do not share their prompt (they differ "
                 "before the reply); give the prompt as an explicit 'prompt' field");
          }
          const bool chosen_empty = conv ? r->chosen.messages.empty() : r->chosen.text.empty();
          const bool rejected_empty =
              conv ? r->rejected.messages.empty() : r->rejected.text.empty();
          if (chosen_empty || rejected_empty) {
            fail(BadLineKind::kEmptyText, std::string("'") +
                                              (chosen_empty ? "chosen" : "rejected") +
                                              "' is empty once the shared prompt is extracted");
          }
        } else {
          read_field(obj, "prompt", conv, true, &r->prompt);
        }
        break;
      case DatasetKind::kTokenized: {
        const int64_t hi =
            options_.vocab_size > 0 ? options_.vocab_size - 1 : std::numeric_limits<int32_t>::max();
        read_int_list(require(obj, "input_ids"), "input_ids", 0, hi, &r->input_ids);
        const size_t n = r->input_ids.size();
        auto read_mask = [&](const char* key, bool expected, std::vector<uint8_t>* out) {
          out->clear();
          auto it = obj.find(key);
          if (!expected) return;
          if (it == obj.end())
            fail(BadLineKind::kMissingKey, std::string("missing key '") + key + "'");
          read_int_list(*it, key, 0, 1, out);
          if (out->size() != n) {
            fail(BadLineKind::kWrongType, std::string("'") + key + "' has " +
                                              std::to_string(out->size()) +
                                              " values but 'input_ids' has " + std::to_string(n));
          }
        };
        read_mask("completion_mask", f.has_completion_mask, &r->completion_mask);
        read_mask("assistant_masks", f.has_assistant_masks, &r->assistant_masks);
        r->label_mask.clear();
        if (f.has_labels) {
          std::vector<int64_t> labels;
          read_int_list(require(obj, "labels"), "labels", -100, std::numeric_limits<int32_t>::max(),
                        &labels);
          if (labels.size() != n) {
            fail(BadLineKind::kWrongType, "'labels' has " + std::to_string(labels.size()) +
                                              " values but 'input_ids' has " + std::to_string(n));
          }
          r->label_mask.resize(n);
          for (size_t i = 0; i < n; ++i) {
            if (labels[i] != -100 && labels[i] != r->input_ids[i]) {
              fail(BadLineKind::kWrongType,
                   "'labels[" + std::to_string(i) + "]' = " + std::to_string(labels[i]) +
                       " is neither -100 nor input_ids[" + std::to_string(i) + "] = " +
                       std::to_string(r->input_ids[i]) + " (only such labels are supported)");
            }
            r->label_mask[i] = labels[i] != -100;
          }
        }
        break;
      }
    }
    return true;
  } catch (Fail& e) {
    problem->kind = e.kind;
    problem->message = std::move(e.message);
    return false;
  }
}

void DatasetReader::bad_line(const LineProblem& problem) {
  std::string msg = reader_.where() + problem.message;
  if (format_ && problem.kind != BadLineKind::kFormatMismatch)
    msg += format_note(*format_, format_line_);
  LT_CHECK_INPUT(options_.skip_bad_lines, msg, " [skip_bad_lines=true skips such lines]");
  bad_lines_.add(problem.kind, msg);
}

bool DatasetReader::next(Record* record) {
  std::string_view line;
  LineProblem problem;
  while (reader_.next_line(&line)) {
    if (!parse_json_line(line, &obj_, &problem) || !convert(obj_, record, &problem)) {
      bad_line(problem);
      continue;
    }
    ++records_;
    return true;
  }
  LT_CHECK_INPUT(records_ > 0, reader_.path(), ": no valid example in ", reader_.line_number(),
                 " lines", bad_lines_.total() > 0 ? " (" + bad_lines_.summary() + ")" : "");
  return false;
}

}  // namespace leantune
