// Helpers shared by the dataset tests (test_dataset.cpp, test_examples.cpp): temporary JSONL
// files, reading every record, and a byte-level fake TextEncoder with a predictable chat format.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "engine/check.h"
#include "loaders/chat_template.h"
#include "loaders/dataset.h"
#include "loaders/jsonl.h"
#include "loaders/text_encoder.h"

namespace leantune::dataset_testing {

// Writes content to dir/name and returns the path.
std::string write_file(const std::string& dir, const std::string& name, const std::string& content);
// One line per entry, in a fresh temporary directory.
std::string write_lines(const std::string& name, const std::vector<std::string>& lines);
// Every record of a JSONL dataset; its detected format in *format when given.
std::vector<Record> read_all(const std::string& path, DatasetReaderOptions opts = {},
                             DatasetFormat* format = nullptr);

// A byte-level encoder: byte b -> 100 + b, "<eos>" -> 2, BOS 1 with add_special_tokens.
// Chat: "<role>" + content + "<eos>" per message, "<assistant>" as generation prompt; the
// assistant mask covers an assistant message's content and its "<eos>".
class FakeEncoder final : public TextEncoder {
 public:
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const override {
    std::vector<int32_t> ids;
    if (add_special_tokens) ids.push_back(1);
    for (size_t i = 0; i < text.size();) {
      if (text.substr(i, 5) == "<eos>") {
        ids.push_back(2);
        i += 5;
      } else {
        ids.push_back(100 + static_cast<unsigned char>(text[i]));
        ++i;
      }
    }
    return ids;
  }
  ChatIds encode_chat(const std::vector<Message>& messages, bool gen) const override {
    ChatIds out;
    for (const Message& m : messages) {
      check_role(m.role);
      append(&out, "<" + m.role + ">", 0);
      append(&out, m.content + "<eos>", m.role == "assistant");
    }
    if (gen) append(&out, "<assistant>", 0);
    return out;
  }
  std::string render_chat(const std::vector<Message>& messages, bool gen) const override {
    std::string s;
    for (const Message& m : messages) {
      check_role(m.role);
      s += "<" + m.role + ">" + m.content + "<eos>";
    }
    if (gen) s += "<assistant>";
    return s;
  }
  std::string eos_token() const override { return "<eos>"; }
  int32_t eos_token_id() const override { return 2; }
  int32_t pad_token_id() const override { return 0; }
  int64_t vocab_size() const override { return 356; }

 private:
  static void check_role(const std::string& role) {
    LT_CHECK_INPUT(role == "system" || role == "user" || role == "assistant", "unknown role '",
                   role, "'");
  }
  void append(ChatIds* out, const std::string& text, uint8_t mask) const {
    for (int32_t id : encode(text, false)) {
      out->ids.push_back(id);
      out->assistant_mask.push_back(mask);
    }
  }
};

// FakeEncoder().encode(s, special).
std::vector<int32_t> enc(const std::string& s, bool special = false);

}  // namespace leantune::dataset_testing
