// Tokenisation of dataset records into training examples (see examples.h for the semantics).
#include "loaders/examples.h"

#include <algorithm>

#include "engine/check.h"

namespace leantune {

void TokenizedDataset::add(std::span<const int32_t> ids, std::span<const uint8_t> mask,
                           int64_t line, int64_t cut) {
  LT_CHECK(ids.size() == mask.size(), "ids/mask size mismatch ", ids.size(), " vs ", mask.size());
  ids_.insert(ids_.end(), ids.begin(), ids.end());
  mask_.insert(mask_.end(), mask.begin(), mask.end());
  offsets_.push_back(static_cast<int64_t>(ids_.size()));
  lines_.push_back(line);
  cuts_.push_back(cut);
}

void TokenizedDataset::reserve(int64_t examples, int64_t tokens) {
  ids_.reserve(static_cast<size_t>(tokens));
  mask_.reserve(static_cast<size_t>(tokens));
  offsets_.reserve(static_cast<size_t>(examples + 1));
  lines_.reserve(static_cast<size_t>(examples));
  cuts_.reserve(static_cast<size_t>(examples));
}

std::vector<int64_t> TokenizedDataset::lengths() const {
  std::vector<int64_t> out(static_cast<size_t>(size()));
  for (int64_t i = 0; i < size(); ++i) out[static_cast<size_t>(i)] = length(i);
  return out;
}

std::string DataStats::summary() const {
  std::string s = path + ": " + std::to_string(examples) + " examples, " + std::to_string(tokens) +
                  " tokens kept";
  if (truncated_examples > 0) {
    s += "; " + std::to_string(truncated_examples) + " truncated (" +
         std::to_string(truncated_tokens) + " tokens cut)";
  }
  if (empty_examples > 0) s += "; " + std::to_string(empty_examples) + " empty dropped";
  if (dropped_examples > 0) {
    s += "; " + std::to_string(dropped_examples) + " dropped with no trainable token (" +
         std::to_string(dropped_tokens) + " tokens)";
  }
  if (prompt_mismatch > 0) {
    s +=
        "; " + std::to_string(prompt_mismatch) + " prompts not a token prefix of prompt+completion";
  }
  if (too_long_examples > 0) {
    s += "; " + std::to_string(too_long_examples) + " dropped longer than max_length (" +
         std::to_string(too_long_tokens) + " tokens)";
  }
  s += "; " + bad_lines.summary();
  return s;
}

namespace {

template <typename A>
size_t common_prefix(const A& a, const A& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

std::vector<Message> concat(const std::vector<Message>& a, const std::vector<Message>& b) {
  std::vector<Message> out = a;
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

// Trainable = some mask bit set at a position in [1, limit).
bool has_trainable(std::span<const uint8_t> mask, size_t limit) {
  limit = std::min(limit, mask.size());
  for (size_t i = 1; i < limit; ++i) {
    if (mask[i]) return true;
  }
  return false;
}

bool has_any(std::span<const uint8_t> mask, size_t limit) {
  limit = std::min(limit, mask.size());
  for (size_t i = 0; i < limit; ++i) {
    if (mask[i]) return true;
  }
  return false;
}

int64_t count_label_tokens(std::span<const uint8_t> mask) {
  int64_t n = 0;
  for (size_t i = 1; i < mask.size(); ++i) n += mask[i];
  return n;
}

// Turns an input error of the tokenizer/template into a bad line of the record.
class RecordGuard {
 public:
  RecordGuard(const std::string& path, bool skip, BadLineCounts* bad)
      : path_(path), skip_(skip), bad_(bad) {}
  template <typename F>
  bool run(int64_t line, F&& f) {
    try {
      f();
      return true;
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kInput) throw;
      const std::string msg = path_ + ":" + std::to_string(line) + ": " + e.what();
      LT_CHECK_INPUT(skip_, msg, " [skip_bad_lines=true skips such lines]");
      bad_->add(BadLineKind::kTokenizer, msg);
      return false;
    }
  }

 private:
  const std::string& path_;
  bool skip_;
  BadLineCounts* bad_;
};

void finish_stats(const DatasetReader& reader, const BadLineCounts& tokenizer_bad,
                  DataStats* stats) {
  stats->path = reader.path();
  if (reader.has_format()) stats->format = reader.format().name();
  stats->lines = reader.lines_read();
  stats->blank_lines = reader.blank_lines();
  stats->records = reader.records_read();
  stats->bad_lines = reader.bad_lines();
  stats->bad_lines.merge(tokenizer_bad);
}

// validate_data_config, then the truncation mode the config names.
TruncationMode validated_truncation_mode(const DataConfig& cfg) {
  validate_data_config(cfg);
  return parse_truncation_mode(cfg.truncation_mode);
}

DatasetReaderOptions reader_options(const DataConfig& cfg, const TextEncoder* encoder) {
  DatasetReaderOptions o;
  o.dataset_text_field = cfg.dataset_text_field;
  o.skip_bad_lines = cfg.skip_bad_lines;
  o.vocab_size = encoder != nullptr ? encoder->vocab_size() : 0;
  return o;
}

// The loop every loader shares: the file is read one record at a time (one schema per file,
// dataset.h); the first record's format goes to *format and to `check(format, line)` (which
// refuses a format the loader cannot use), then every record to `take(record, guard)`, whose
// tokenizer errors `guard` turns into bad lines. Bad lines are thrown, or counted into `stats`
// with skip_bad_lines. A file that leaves no example is an input error: "<path>: no <what>: ...".
template <typename Check, typename Take>
void read_records(const JsonlSource& source, const DatasetReaderOptions& options,
                  DatasetFormat* format, DataStats* stats, const char* what, Check&& check,
                  Take&& take) {
  DatasetReader reader(source, options);
  BadLineCounts tokenizer_bad;
  RecordGuard guard(reader.path(), options.skip_bad_lines, &tokenizer_bad);
  Record rec;
  bool first = true;
  while (reader.next(&rec)) {
    if (first) {
      *format = reader.format();
      check(*format, rec.line);
      first = false;
    }
    take(rec, guard);
  }
  finish_stats(reader, tokenizer_bad, stats);
  LT_CHECK_INPUT(stats->examples > 0, source.path, ": no ", what, ": ", stats->summary());
}

// An example dropped with its n tokens: nothing in it is left to train on.
void count_dropped(DataStats* st, int64_t n) {
  ++st->dropped_examples;
  st->dropped_tokens += n;
}

// An example kept with n tokens, after `cut` of its tokens were truncated away.
void count_kept(DataStats* st, int64_t n, int64_t cut) {
  if (cut > 0) {
    ++st->truncated_examples;
    st->truncated_tokens += cut;
  }
  ++st->examples;
  st->tokens += n;
}

void truncate_keep_last(std::vector<int32_t>* v, int64_t n, int64_t* cut) {
  if (n > 0 && static_cast<int64_t>(v->size()) > n) {
    *cut += static_cast<int64_t>(v->size()) - n;
    v->erase(v->begin(), v->end() - n);
  }
}

void truncate_keep_first(std::vector<int32_t>* v, int64_t n, int64_t* cut) {
  if (n > 0 && static_cast<int64_t>(v->size()) > n) {
    *cut += static_cast<int64_t>(v->size()) - n;
    v->resize(static_cast<size_t>(n));
  }
}

// A conversational prompt is followed by the generation prompt, so it cannot be empty or end
// with an assistant message.
void check_prompt_messages(const std::vector<Message>& prompt) {
  LT_CHECK_INPUT(!prompt.empty(), "the prompt is an empty message list");
  LT_CHECK_INPUT(prompt.back().role != "assistant",
                 "a prompt that ends with an assistant message (TRL's continue_final_message) "
                 "is not supported");
}

// Rendered prompt for a conversational prompt (TRL's apply_chat_template on "prompt").
std::string render_prompt(const TextEncoder& enc, const std::vector<Message>& prompt) {
  check_prompt_messages(prompt);
  return enc.render_chat(prompt, /*add_generation_prompt=*/true);
}

std::vector<int32_t> prompt_ids_of(const TextField& prompt, bool conversational,
                                   const TextEncoder& enc) {
  if (conversational) {
    check_prompt_messages(prompt.messages);
    return enc.encode_chat(prompt.messages, /*add_generation_prompt=*/true).ids;
  }
  return enc.encode(prompt.text, /*add_special_tokens=*/false);
}

// Prompt text and completion texts after the chat template (strings pass through). The prompt
// shrinks to its common prefix with each rendered prompt+completion in turn, as TRL does.
void completion_texts(const TextField& prompt, const std::vector<const TextField*>& completions,
                      bool conversational, const TextEncoder& enc, std::string* prompt_text,
                      std::vector<std::string>* texts) {
  texts->clear();
  if (!conversational) {
    *prompt_text = prompt.text;
    for (const TextField* c : completions) texts->push_back(c->text);
    return;
  }
  *prompt_text = render_prompt(enc, prompt.messages);
  for (const TextField* c : completions) {
    const std::string full = enc.render_chat(concat(prompt.messages, c->messages), false);
    prompt_text->resize(common_prefix(*prompt_text, full));
    texts->push_back(full.substr(prompt_text->size()));
  }
}

// where: "file:line" of the line the format was detected on.
void check_sft_format(const DatasetFormat& f, const TextEncoder* encoder, const DataConfig& cfg,
                      const std::string& where) {
  const bool sft_kind = f.kind == DatasetKind::kLanguageModeling ||
                        f.kind == DatasetKind::kPromptCompletion ||
                        f.kind == DatasetKind::kTokenized;
  LT_CHECK_INPUT(sft_kind, where, ": dataset format ", f.name(),
                 " cannot be used for SFT (expected '", cfg.dataset_text_field,
                 "', 'messages', 'prompt'+'completion' or 'input_ids')");
  LT_CHECK_INPUT(f.kind == DatasetKind::kTokenized || encoder != nullptr, where,
                 ": dataset format ", f.name(), " needs a tokenizer");
  LT_CHECK_INPUT(!cfg.assistant_only_loss || f.conversational ||
                     (f.kind == DatasetKind::kTokenized && f.has_assistant_masks),
                 where,
                 ": assistant_only_loss=true needs conversational data (message lists), "
                 "but the dataset format is ",
                 f.name());
  if (cfg.assistant_only_loss && f.conversational && encoder != nullptr) {
    const std::string why = encoder->assistant_mask_error();
    LT_CHECK_INPUT(why.empty(), why);
  }
}

void check_assistant_mask(const ChatIds& c) {
  LT_CHECK_INPUT(c.assistant_mask.size() == c.ids.size(),
                 "assistant_only_loss: the chat template gives no assistant mask for this "
                 "conversation (its {% generation %} training variant renders it differently)");
}

}  // namespace

void tokenize_sft_record(const Record& r, const DatasetFormat& f, const TextEncoder* enc,
                         const DataConfig& cfg, std::vector<int32_t>* ids,
                         std::vector<uint8_t>* mask, DataStats* stats) {
  const bool col = resolve_completion_only_loss(cfg, f);
  switch (f.kind) {
    case DatasetKind::kTokenized: {
      *ids = r.input_ids;
      mask->assign(ids->size(), 1);
      for (size_t i = 0; i < ids->size(); ++i) {
        if (col && f.has_completion_mask && !r.completion_mask[i]) (*mask)[i] = 0;
        if (f.has_assistant_masks && !r.assistant_masks[i]) (*mask)[i] = 0;
        if (f.has_labels && !r.label_mask[i]) (*mask)[i] = 0;
      }
      return;
    }
    case DatasetKind::kLanguageModeling: {
      LT_CHECK(enc != nullptr, "tokenize_sft_record: no encoder");
      if (f.conversational) {
        ChatIds c = enc->encode_chat(r.text.messages, /*add_generation_prompt=*/false);
        if (cfg.assistant_only_loss) check_assistant_mask(c);
        *ids = std::move(c.ids);
        if (cfg.assistant_only_loss) {
          *mask = std::move(c.assistant_mask);
        } else {
          mask->assign(ids->size(), 1);
        }
      } else {
        const std::string eos = enc->eos_token();
        *ids = r.text.text.ends_with(eos) ? enc->encode(r.text.text, true)
                                          : enc->encode(r.text.text + eos, true);
        mask->assign(ids->size(), 1);
      }
      return;
    }
    case DatasetKind::kPromptCompletion: {
      LT_CHECK(enc != nullptr, "tokenize_sft_record: no encoder");
      std::vector<int32_t> prompt_ids;
      std::vector<uint8_t> assistant;
      if (f.conversational) {
        prompt_ids = enc->encode_chat(r.prompt.messages, /*add_generation_prompt=*/true).ids;
        ChatIds full = enc->encode_chat(concat(r.prompt.messages, r.completion.messages), false);
        if (cfg.assistant_only_loss) check_assistant_mask(full);
        *ids = std::move(full.ids);
        assistant = std::move(full.assistant_mask);
      } else {
        const std::string eos = enc->eos_token();
        const std::string completion =
            r.completion.text.ends_with(eos) ? r.completion.text : r.completion.text + eos;
        prompt_ids = enc->encode(r.prompt.text, true);
        *ids = enc->encode(r.prompt.text + completion, true);
      }
      const size_t prompt_len = common_prefix(prompt_ids, *ids);
      if (prompt_len < prompt_ids.size() && stats != nullptr) ++stats->prompt_mismatch;
      mask->assign(ids->size(), 1);
      for (size_t i = 0; i < ids->size(); ++i) {
        if (col && i < prompt_len) (*mask)[i] = 0;
        if (cfg.assistant_only_loss && f.conversational && !assistant[i]) (*mask)[i] = 0;
      }
      return;
    }
    default:
      LT_THROW(ErrorKind::kInput, "dataset format ", f.name(), " cannot be used for SFT");
  }
}

SftData load_sft_data(const JsonlSource& source, const TextEncoder* encoder,
                      const DataConfig& cfg) {
  const std::string& path = source.path;
  const TruncationMode mode = validated_truncation_mode(cfg);
  const bool bfd_cut =
      cfg.packing && parse_packing_strategy(cfg.packing_strategy) == PackingStrategy::kBfd;
  const int64_t max_len = cfg.max_length;

  SftData out;
  DataStats& st = out.stats;
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  auto check = [&](const DatasetFormat& f, int64_t line) {
    check_sft_format(f, encoder, cfg, path + ":" + std::to_string(line));
    out.completion_only_loss = resolve_completion_only_loss(cfg, f);
  };
  auto take = [&](const Record& rec, RecordGuard& guard) {
    if (!guard.run(rec.line,
                   [&] { tokenize_sft_record(rec, out.format, encoder, cfg, &ids, &mask, &st); })) {
      return;
    }
    const int64_t n = static_cast<int64_t>(ids.size());
    if (n == 0) {
      // Dropped and counted. Packed, it stays a zero-length item that the packer skips, so that
      // packing windows hold the same rows as TRL's pack_dataset map batches.
      ++st.empty_examples;
      if (cfg.packing) out.examples.add({}, {}, rec.line, 0);
      return;
    }
    std::span<const int32_t> kept_ids(ids);
    std::span<const uint8_t> kept_mask(mask);
    int64_t cut = 0;
    if (!cfg.packing && max_len > 0 && n > max_len) {
      cut = n - max_len;
      const size_t from = mode == TruncationMode::kKeepStart ? 0 : static_cast<size_t>(cut);
      kept_ids = kept_ids.subspan(from, static_cast<size_t>(max_len));
      kept_mask = kept_mask.subspan(from, static_cast<size_t>(max_len));
    }
    // Packing: TRL does not filter, and a first position is only masked inside the bin, so
    // any mask bit in what the packer keeps counts. Otherwise the first position never trains.
    const bool trainable =
        cfg.packing ? has_any(kept_mask, bfd_cut ? static_cast<size_t>(max_len) : kept_mask.size())
                    : has_trainable(kept_mask, kept_mask.size());
    if (!trainable) {
      count_dropped(&st, n);
      return;
    }
    out.examples.add(kept_ids, kept_mask, rec.line, cut);
    count_kept(&st, static_cast<int64_t>(kept_ids.size()), cut);
    st.label_tokens += count_label_tokens(kept_mask);
  };
  read_records(source, reader_options(cfg, encoder), &out.format, &st, "example left to train on",
               check, take);
  return out;
}

void build_preference_sequence(std::span<const int32_t> prompt, std::span<const int32_t> completion,
                               int64_t max_length, TruncationMode mode, std::vector<int32_t>* ids,
                               std::vector<uint8_t>* completion_mask) {
  ids->assign(prompt.begin(), prompt.end());
  ids->insert(ids->end(), completion.begin(), completion.end());
  completion_mask->assign(prompt.size(), 0);
  completion_mask->resize(ids->size(), 1);
  const int64_t n = static_cast<int64_t>(ids->size());
  if (max_length > 0 && n > max_length) {
    if (mode == TruncationMode::kKeepStart) {
      ids->resize(static_cast<size_t>(max_length));
      completion_mask->resize(static_cast<size_t>(max_length));
    } else {
      ids->erase(ids->begin(), ids->end() - max_length);
      completion_mask->erase(completion_mask->begin(), completion_mask->end() - max_length);
    }
  }
}

namespace {

// Tokenised prompt + completions with the old DPO truncation; returns the tokens cut.
int64_t tokenize_completions(const TextField& prompt,
                             const std::vector<const TextField*>& completions, bool conversational,
                             const TextEncoder& enc, const DataConfig& cfg,
                             std::vector<int32_t>* prompt_ids,
                             std::vector<std::vector<int32_t>>* completion_ids) {
  std::string prompt_text;
  std::vector<std::string> texts;
  completion_texts(prompt, completions, conversational, enc, &prompt_text, &texts);
  *prompt_ids = enc.encode(prompt_text, false);
  completion_ids->clear();
  int64_t cut = 0;
  truncate_keep_last(prompt_ids, cfg.max_prompt_length, &cut);
  for (const std::string& t : texts) {
    std::vector<int32_t> c = enc.encode(t, false);
    c.push_back(enc.eos_token_id());
    truncate_keep_first(&c, cfg.max_completion_length, &cut);
    completion_ids->push_back(std::move(c));
  }
  return cut;
}

// Whether prompt + completion keeps a completion token at a position >= 1 after max_length.
bool completion_survives(const std::vector<int32_t>& prompt, const std::vector<int32_t>& completion,
                         const DataConfig& cfg, TruncationMode mode, int64_t* cut) {
  std::vector<int32_t> ids;
  std::vector<uint8_t> cm;
  build_preference_sequence(prompt, completion, cfg.max_length, mode, &ids, &cm);
  *cut += static_cast<int64_t>(prompt.size() + completion.size() - ids.size());
  return has_trainable(cm, cm.size());
}

}  // namespace

namespace {
// The `check` of read_records for dpo and reward, which need chosen/rejected rows.
auto preference_format_check(const std::string& path) {
  return [&path](const DatasetFormat& format, int64_t line) {
    LT_CHECK_INPUT(format.kind == DatasetKind::kPreference, path, ":", line, ": dataset format ",
                   format.name(),
                   " is not a preference format ('prompt'+'chosen'+'rejected' or "
                   "'chosen'+'rejected')");
  };
}
}  // namespace

PreferenceData load_preference_data(const JsonlSource& source, const TextEncoder& enc,
                                    const DataConfig& cfg) {
  const TruncationMode mode = validated_truncation_mode(cfg);
  PreferenceData out;
  DataStats& st = out.stats;
  auto take = [&](const Record& rec, RecordGuard& guard) {
    PreferenceExample ex;
    ex.line = rec.line;
    int64_t cut = 0;
    std::vector<std::vector<int32_t>> comps;
    if (!guard.run(rec.line, [&] {
          cut = tokenize_completions(rec.prompt, {&rec.chosen, &rec.rejected},
                                     out.format.conversational, enc, cfg, &ex.prompt_ids, &comps);
        })) {
      return;
    }
    ex.chosen_ids = std::move(comps[0]);
    ex.rejected_ids = std::move(comps[1]);
    const int64_t n =
        static_cast<int64_t>(ex.prompt_ids.size() + ex.chosen_ids.size() + ex.rejected_ids.size());
    const bool ok = completion_survives(ex.prompt_ids, ex.chosen_ids, cfg, mode, &cut) &
                    completion_survives(ex.prompt_ids, ex.rejected_ids, cfg, mode, &cut);
    if (!ok) {
      count_dropped(&st, n);
      return;
    }
    count_kept(&st, n, cut);
    out.examples.push_back(std::move(ex));
  };
  read_records(source, reader_options(cfg, &enc), &out.format, &st, "example left to train on",
               preference_format_check(source.path), take);
  return out;
}

std::vector<int32_t> reward_sequence_ids(const TextField& prompt, const TextField& completion,
                                         bool conversational, const TextEncoder& enc) {
  if (conversational) {
    std::vector<Message> m = prompt.messages;
    m.insert(m.end(), completion.messages.begin(), completion.messages.end());
    return enc.encode_chat(m, false).ids;
  }
  const std::string eos = enc.eos_token();
  const bool has_eos = completion.text.ends_with(eos);
  return enc.encode(prompt.text + completion.text + (has_eos ? "" : eos), true);
}

RewardData load_reward_data(const JsonlSource& source, const TextEncoder& enc,
                            const DataConfig& cfg) {
  validate_data_config(cfg);
  DatasetReaderOptions ro = reader_options(cfg, &enc);
  ro.extract_implicit_prompt = false;
  RewardData out;
  DataStats& st = out.stats;
  auto take = [&](const Record& rec, RecordGuard& guard) {
    RewardPair p;
    p.line = rec.line;
    p.margin = out.format.has_margin ? rec.margin : 0.0;
    if (!guard.run(rec.line, [&] {
          const bool conv = out.format.conversational;
          p.chosen_ids = reward_sequence_ids(rec.prompt, rec.chosen, conv, enc);
          p.rejected_ids = reward_sequence_ids(rec.prompt, rec.rejected, conv, enc);
        })) {
      return;
    }
    const auto nc = static_cast<int64_t>(p.chosen_ids.size());
    const auto nr = static_cast<int64_t>(p.rejected_ids.size());
    if (nc == 0 || nr == 0) {
      ++st.empty_examples;
      return;
    }
    if (cfg.max_length > 0 && (nc > cfg.max_length || nr > cfg.max_length)) {
      ++st.too_long_examples;
      st.too_long_tokens += nc + nr;
      return;
    }
    count_kept(&st, nc + nr, 0);
    out.pairs.push_back(std::move(p));
  };
  read_records(source, ro, &out.format, &st, "pair left to train on",
               preference_format_check(source.path), take);
  return out;
}

UnpairedData load_unpaired_data(const JsonlSource& source, const TextEncoder& enc,
                                const DataConfig& cfg) {
  const TruncationMode mode = validated_truncation_mode(cfg);
  UnpairedData out;
  DataStats& st = out.stats;
  auto check = [&](const DatasetFormat& f, int64_t line) {
    LT_CHECK_INPUT(f.kind == DatasetKind::kUnpairedPreference || f.kind == DatasetKind::kPreference,
                   source.path, ":", line, ": dataset format ", f.name(),
                   " is not an unpaired preference format ('prompt'+'completion'+'label', or a "
                   "preference dataset to unpair)");
  };
  auto take = [&](const Record& rec, RecordGuard& guard) {
    // A preference record unpairs into (chosen, true) then (rejected, false).
    std::vector<const TextField*> fields;
    std::vector<bool> labels;
    if (out.format.kind == DatasetKind::kPreference) {
      fields = {&rec.chosen, &rec.rejected};
      labels = {true, false};
    } else {
      fields = {&rec.completion};
      labels = {rec.label};
    }
    std::vector<int32_t> prompt_ids;
    std::vector<std::vector<int32_t>> comps;
    int64_t cut = 0;
    if (!guard.run(rec.line, [&] {
          cut = tokenize_completions(rec.prompt, fields, out.format.conversational, enc, cfg,
                                     &prompt_ids, &comps);
        })) {
      return;
    }
    for (size_t k = 0; k < comps.size(); ++k) {
      const int64_t n = static_cast<int64_t>(prompt_ids.size() + comps[k].size());
      int64_t seq_cut = k == 0 ? cut : 0;
      if (!completion_survives(prompt_ids, comps[k], cfg, mode, &seq_cut)) {
        count_dropped(&st, n);
        continue;
      }
      count_kept(&st, n, seq_cut);
      out.examples.push_back({prompt_ids, std::move(comps[k]), labels[k], rec.line});
    }
  };
  read_records(source, reader_options(cfg, &enc), &out.format, &st, "example left to train on",
               check, take);
  return out;
}

PromptData load_prompt_data(const JsonlSource& source, const TextEncoder& enc,
                            const DataConfig& cfg) {
  validate_data_config(cfg);
  PromptData out;
  DataStats& st = out.stats;
  auto check = [&](const DatasetFormat& f, int64_t line) {
    LT_CHECK_INPUT(f.kind != DatasetKind::kLanguageModeling && f.kind != DatasetKind::kTokenized,
                   source.path, ":", line, ": dataset format ", f.name(), " has no 'prompt'");
  };
  auto take = [&](const Record& rec, RecordGuard& guard) {
    PromptExample ex;
    ex.line = rec.line;
    ex.prompt = rec.prompt;
    if (!guard.run(rec.line, [&] {
          ex.prompt_ids = prompt_ids_of(rec.prompt, out.format.conversational, enc);
        })) {
      return;
    }
    if (ex.prompt_ids.empty()) {
      count_dropped(&st, 0);
      return;
    }
    count_kept(&st, static_cast<int64_t>(ex.prompt_ids.size()), 0);
    out.examples.push_back(std::move(ex));
  };
  read_records(source, reader_options(cfg, &enc), &out.format, &st, "example left", check, take);
  return out;
}

}  // namespace leantune
