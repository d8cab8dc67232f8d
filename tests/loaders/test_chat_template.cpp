// Chat template tests: the native renderers must give transformers' apply_chat_template text,
// ids and (TRL generation-block) assistant masks on the references made by
// tests/fixtures/gen_tokenizer_fixtures.py; detection and its errors are checked on the real
// tokenizer_config.json files and on made-up templates.
#include <gtest/gtest.h>

#include <ctime>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>

#include "engine/check.h"
#include "loaders/chat_template.h"
#include "loaders/fs_util.h"
#include "loaders/tokenizer.h"

namespace leantune {
namespace {

using nlohmann::json;

std::string fixture_dir() { return std::string(LT_SOURCE_DIR) + "/tests/fixtures/tokenizers/"; }

std::shared_ptr<Tokenizer> tokenizer(const std::string& folder) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<Tokenizer>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& t = cache[folder];
  if (!t) t = Tokenizer::load(fixture_dir() + folder);
  return t;
}

const json& references() {
  static const json j = read_json_file(fixture_dir() + "chat_references.json");
  return j;
}

std::vector<ChatMessage> messages_of(const json& list) {
  std::vector<ChatMessage> out;
  for (const json& m : list) out.push_back({m["role"], m["content"]});
  return out;
}

ChatTemplate template_for(const json& c) {
  const auto tok = tokenizer(c["tokenizer"]);
  ChatTemplate t =
      c["template"] == "detected" ? tok->chat_template() : ChatTemplate::from_name(c["template"]);
  if (c["date_string"].is_string()) t.set_date_string(c["date_string"]);
  return t;
}

std::string describe(const json& c) {
  return c["tokenizer"].get<std::string>() + "/" + c["template"].get<std::string>() +
         " add_generation_prompt=" + (c["add_generation_prompt"].get<bool>() ? "true" : "false") +
         " " + c["messages"].dump();
}

TEST(ChatTemplateReferences, RenderMatchesTransformers) {
  const json& cases = references()["cases"];
  ASSERT_GE(cases.size(), 40u);
  for (const json& c : cases) {
    const ChatTemplate t = template_for(c);
    EXPECT_EQ(t.render(messages_of(c["messages"]), c["add_generation_prompt"]),
              c["text"].get<std::string>())
        << describe(c);
  }
}

TEST(ChatTemplateReferences, IdsAndAssistantMaskMatchTransformersAndTrl) {
  for (const json& c : references()["cases"]) {
    const ChatTemplate t = template_for(c);
    const auto tok = tokenizer(c["tokenizer"]);
    const ChatEncoding enc = t.encode(*tok, messages_of(c["messages"]), c["add_generation_prompt"]);
    EXPECT_EQ(enc.ids, c["ids"].get<std::vector<int32_t>>()) << describe(c);
    EXPECT_EQ(enc.assistant_mask, c["assistant_mask"].get<std::vector<uint8_t>>()) << describe(c);
  }
}

TEST(ChatTemplateDetect, RecognisesTheFixtureTemplates) {
  const ChatTemplate& qwen = tokenizer("qwen2.5")->chat_template();
  EXPECT_EQ(qwen.kind(), ChatTemplateKind::kChatML);
  EXPECT_EQ(qwen.default_system_prompt(),
            "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  const ChatTemplate& llama = tokenizer("llama3.2")->chat_template();
  EXPECT_EQ(llama.kind(), ChatTemplateKind::kLlama3);
  EXPECT_EQ(llama.name(), "llama3.2");
}

TEST(ChatTemplateDetect, Llama32DateDefaultsToTodayLikeStrftimeNow) {
  const ChatTemplate t = tokenizer("llama3.2")->chat_template();
  const std::string date = t.effective_date_string();
  EXPECT_TRUE(std::regex_match(date, std::regex("[0-3][0-9] [A-Z][a-z][a-z] 20[0-9][0-9]")))
      << date;
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  EXPECT_NE(date.find(std::to_string(1900 + tm.tm_year)), std::string::npos) << date;
  const std::string text = t.render({{"user", "hi"}}, false);
  EXPECT_NE(text.find("Today Date: " + date + "\n\n"), std::string::npos) << text;
  ChatTemplate fixed = t;
  fixed.set_date_string("01 Jan 2030");
  EXPECT_NE(fixed.render({{"user", "hi"}}, false).find("Today Date: 01 Jan 2030\n"),
            std::string::npos);
}

TEST(ChatTemplateDetect, Llama31StyleUsesTheTemplatesFixedDate) {
  const std::string src =
      "{{- bos_token }}{%- if not date_string is defined %}{%- set date_string = \"26 Jul 2024\" "
      "%}{%- endif %}{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}"
      "{{- \"Cutting Knowledge Date: December 2023\\n\" }}";
  const ChatTemplate t = ChatTemplate::detect(src, "t.json");
  EXPECT_EQ(t.name(), "llama3.1");
  EXPECT_EQ(t.effective_date_string(), "26 Jul 2024");
}

TEST(ChatTemplateDetect, PlainChatMLHasNoDefaultSystemPrompt) {
  const std::string src =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
      "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
      "{{ '<|im_start|>assistant\\n' }}{% endif %}";
  const ChatTemplate t = ChatTemplate::detect(src, "t.json");
  EXPECT_EQ(t.kind(), ChatTemplateKind::kChatML);
  EXPECT_FALSE(t.default_system_prompt().has_value());
  EXPECT_EQ(t.render({{"user", "hi"}, {"assistant", "yo"}}, true),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplateDetect, SmolLM2StyleDefaultSystemPromptIsRead) {
  const std::string src =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
      "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
      "Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
      "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}";
  const ChatTemplate t = ChatTemplate::detect(src, "t.json");
  EXPECT_EQ(t.default_system_prompt(),
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
}

void expect_input_error(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning " << needle;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(ChatTemplateDetect, UnknownOrMissingTemplatesSuggestTheOption) {
  expect_input_error(
      [] { ChatTemplate::detect("{{ '[INST] ' + message['content'] + ' [/INST]' }}", "m/cfg"); },
      "--chat_template chatml|llama3");
  expect_input_error([] { ChatTemplate::detect("", "m/cfg"); }, "--chat_template chatml|llama3");
  expect_input_error([] { ChatTemplate::detect("<|im_start|>{% if '<think>' %}", "m/cfg"); },
                     "--chat_template");
  // SmolLM2's fixture has no tokenizer_config.json, hence no template.
  expect_input_error([] { tokenizer("smollm2")->chat_template(); }, "--chat_template");
  expect_input_error([] { ChatTemplate::from_name("vicuna"); }, "vicuna");
}

TEST(ChatTemplateDetect, OverrideByName) {
  auto tok = Tokenizer::load(fixture_dir() + "smollm2");
  EXPECT_FALSE(tok->has_chat_template());
  tok->set_chat_template("chatml");
  EXPECT_EQ(tok->chat_template().kind(), ChatTemplateKind::kChatML);
  const ChatEncoding enc =
      tok->chat_template().encode(*tok, {{"user", "a"}, {"assistant", "b"}}, false);
  EXPECT_EQ(tok->decode(enc.ids),
            "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nb"
            "<|im_end|>\n");
  // Masked: "\n", "b", "<|im_end|>", "\n".
  std::string masked;
  for (size_t i = 0; i < enc.ids.size(); ++i) {
    if (enc.assistant_mask[i]) masked += tok->decode({enc.ids[i]});
  }
  EXPECT_EQ(masked, "\nb<|im_end|>\n");
}

TEST(ChatTemplateMessages, BadConversationsAreInputErrors) {
  const ChatTemplate t = ChatTemplate::from_name("qwen2.5");
  expect_input_error([&] { t.render({}, false); }, "at least one message");
  expect_input_error([&] { t.render({{"user", "a"}, {"tool", "b"}}, false); }, "role 'tool'");
}

TEST(ChatTemplateMessages, Llama3TrimsContentWithPythonWhitespace) {
  const ChatTemplate t = ChatTemplate::from_name("llama3");
  EXPECT_EQ(t.render({{"user", " \u3000hi\x1f\n"}}, false),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>");
}

}  // namespace
}  // namespace leantune
