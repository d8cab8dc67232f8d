// Chat template tests: templates run by the Jinja2 interpreter must give transformers'
// apply_chat_template text, ids and (generation-block) assistant masks on the references made by
// tests/fixtures/gen_tokenizer_fixtures.py and gen_chat_template_fixtures.py (SmolLM2 with its
// default system prompt, tools, kwargs); known families without {% generation %} blocks get
// their training variant's mask; other templates refuse assistant masks with one line.
#include <gtest/gtest.h>

#include <ctime>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "engine/check.h"
#include "loaders/chat_template.h"
#include "loaders/fs_util.h"
#include "loaders/jinja/bundled.h"
#include "loaders/tokenizer.h"
#include "testing/testing.h"

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
  for (const auto& [key, value] : tok->special_tokens()) t.set_special_token(key, value);
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

using ojson = nlohmann::ordered_json;

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string jinja_dir() { return std::string(LT_SOURCE_DIR) + "/tests/fixtures/chat_templates/"; }

const ojson& jinja_references() {
  static const ojson j = ojson::parse(read_text(jinja_dir() + "references.json"));
  return j;
}

bool is_bundled(const std::string& name) {
  for (const std::string& n : ChatTemplate::bundled_names()) {
    if (n == name) return true;
  }
  return false;
}

// The case's template as leantune loads it (by name, or from its .jinja file), with the case's
// special tokens, kwargs and clock.
ChatTemplate jinja_template_for(const ojson& c, const std::string& name) {
  ChatTemplate t =
      is_bundled(name) || name.find("_training") == std::string::npos
          ? ChatTemplate::from_name(is_bundled(name) ? name : jinja_dir() + name + ".jinja")
          : ChatTemplate::from_source(
                [&] {
                  for (const auto& b : jinja::bundled_templates()) {
                    if (name == b.name) return std::string(b.text);
                  }
                  return std::string();
                }(),
                name);
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    if (c["context"].contains(key)) t.set_special_token(key, c["context"][key].get<std::string>());
  }
  t.set_kwargs(c["kwargs"]);
  std::tm tm{};
  tm.tm_year = 2024 - 1900;
  tm.tm_mon = 6;
  tm.tm_mday = 26;
  t.set_now(tm);
  return t;
}

ChatRequest request_for(const ojson& c) {
  ChatRequest r;
  r.messages = c["context"]["messages"];
  r.tools = c["context"]["tools"];
  r.add_generation_prompt = c["add_generation_prompt"];
  return r;
}

std::string describe_j(const ojson& c) {
  return c["template"].get<std::string>() + "/" + c["conversation"].get<std::string>() +
         " add_generation_prompt=" + (c["add_generation_prompt"].get<bool>() ? "true" : "false") +
         " kwargs=" + c["kwargs"].dump();
}

const ojson* find_case(const std::string& tmpl, const ojson& like) {
  for (const ojson& c : jinja_references()["cases"]) {
    if (c["template"] == tmpl && c["conversation"] == like["conversation"] &&
        c["add_generation_prompt"] == like["add_generation_prompt"] &&
        c["kwargs"] == like["kwargs"]) {
      return &c;
    }
  }
  return nullptr;
}

// Ids and masks through ChatTemplate (the path sft, tokenize --chat and generate take).
TEST(ChatTemplateJinja, IdsAndMasksMatchTransformers) {
  size_t checked = 0, masks = 0, family_masks = 0;
  for (const ojson& c : jinja_references()["cases"]) {
    if (c.contains("error") || !c.contains("ids")) continue;
    const std::string name = c["template"];
    if (name.rfind("constructs_", 0) == 0) continue;
    const ChatTemplate t = jinja_template_for(c, name);
    const auto tok = tokenizer(c["tokenizer"]);
    const ChatEncoding enc = t.encode_request(*tok, request_for(c));
    EXPECT_EQ(enc.ids, c["ids"].get<std::vector<int32_t>>()) << describe_j(c);
    ++checked;
    if (c.contains("assistant_mask")) {
      EXPECT_EQ(enc.assistant_mask, c["assistant_mask"].get<std::vector<uint8_t>>())
          << describe_j(c);
      ++masks;
    } else if (const ojson* training = find_case(name + "_training", c)) {
      // A known family without {% generation %}: its training variant's mask.
      if (training->contains("assistant_mask") && training->at("text") == c["text"]) {
        EXPECT_EQ(enc.assistant_mask, training->at("assistant_mask").get<std::vector<uint8_t>>())
            << describe_j(c);
        ++family_masks;
      }
    }
  }
  EXPECT_GE(checked, 150u);
  EXPECT_GE(masks, 40u);
  EXPECT_GE(family_masks, 40u);
}

TEST(ChatTemplateJinja, SmolLM2DefaultSystemPromptIsRendered) {
  ojson c;
  c["context"] = ojson::object();
  c["kwargs"] = ojson::object();
  const ChatTemplate t = jinja_template_for(c, "smollm2");
  EXPECT_EQ(t.render({{"user", "hi"}}, true),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_TRUE(t.has_assistant_mask());
}

TEST(ChatTemplateJinja, DeepSeekR1DistillRendersButHasNoMask) {
  const ChatTemplate t = ChatTemplate::from_name(jinja_dir() + "deepseek_r1_distill_qwen.jinja");
  EXPECT_EQ(t.render({{"user", "2+2?"}, {"assistant", "<think>sum</think>4"}}, true),
            "<\uff5cUser\uff5c>2+2?<\uff5cAssistant\uff5c>4<\uff5cend\u2581of\u2581sentence\uff5c>"
            "<\uff5cAssistant\uff5c><think>\n");
  EXPECT_FALSE(t.has_assistant_mask());
  EXPECT_NE(t.assistant_mask_error().find("{% generation %}"), std::string::npos);
  EXPECT_EQ(t.assistant_mask_error().find('\n'), std::string::npos);
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

TEST(ChatTemplateNames, BundledNamesFilesAndUnknownNames) {
  for (const char* n : {"chatml", "qwen2.5", "qwen3", "llama3", "llama3.1", "llama3.2", "gemma3"}) {
    ChatTemplate t = ChatTemplate::from_name(n);
    t.set_bos_token("<|begin_of_text|>");  // the Llama templates need it (from the tokenizer)
    EXPECT_EQ(t.name(), n);
    EXPECT_TRUE(t.has_assistant_mask()) << n;
  }
  const ChatTemplate f = ChatTemplate::from_name(jinja_dir() + "smollm2.jinja");
  EXPECT_EQ(f.name(), jinja_dir() + "smollm2.jinja");
  expect_input_error([] { ChatTemplate::from_name("vicuna"); }, "unknown chat template 'vicuna'");
  expect_input_error([] { ChatTemplate::from_name("chatml_training"); }, "unknown chat template");
  expect_input_error([] { ChatTemplate::detect("", "m/cfg"); }, "--chat_template");
  // SmolLM2's fixture folder has no tokenizer_config.json, hence no template.
  expect_input_error([] { tokenizer("smollm2")->chat_template(); }, "--chat_template");
}

TEST(ChatTemplateNames, TemplateErrorsNameTheConfigLineAndColumn) {
  expect_input_error([] { ChatTemplate::detect("{{ x }}\n{% if %}", "m/tokenizer_config.json"); },
                     "m/tokenizer_config.json:2:7: ");
  expect_input_error([] { parse_chat_template_kwargs("[1]"); }, "--chat_template_kwargs");
  expect_input_error([] { parse_chat_template_kwargs("{bad"); }, "--chat_template_kwargs");
}

TEST(ChatTemplateNames, KwargsReachTheTemplate) {
  ChatTemplate t = ChatTemplate::from_source(
      "{{ 'think' if enable_thinking is not defined or enable_thinking else 'plain' }}", "k.jinja");
  EXPECT_EQ(t.render({{"user", "x"}}, false), "think");
  t.set_kwargs(parse_chat_template_kwargs(R"({"enable_thinking": false})"));
  EXPECT_EQ(t.render({{"user", "x"}}, false), "plain");
}

// Kwargs that would replace what the renderer binds (the conversation, the tools, the
// generation prompt, the special tokens) are refused naming the option and the key, and leave the
// template as it was.
TEST(ChatTemplateNames, KwargsCannotReplaceTheTemplatesOwnVariables) {
  ChatTemplate t = ChatTemplate::from_name("chatml");
  const std::string before = t.render({{"user", "x"}}, true);
  for (const std::string& key : chat_template_variables()) {
    expect_input_error(
        [&] { t.set_kwargs(parse_chat_template_kwargs("{\"" + key + "\": []}")); },
        "option --chat_template_kwargs: key '" + key + "' is the chat template's own variable");
  }
  EXPECT_EQ(t.render({{"user", "x"}}, true), before);
  expect_input_error(
      [&] { check_chat_template_kwargs(parse_chat_template_kwargs(R"({"tools": null})"), "row"); },
      "row: key 'tools'");
}

// A template that is not UTF-8 is refused when it is read, naming its file (not later, as
// tokenizer input at some byte).
TEST(ChatTemplateNames, InvalidUtf8TemplateNamesItsFile) {
  const std::string path = testing::temp_dir("tpl") + "/bad.jinja";
  std::ofstream(path) << "{{ 'a' }}\xff";
  expect_input_error([&] { ChatTemplate::from_name(path); },
                     "option --chat_template: '" + path + "' is not valid UTF-8 (byte 9)");
  expect_input_error([] { ChatTemplate::from_source("\xc3(", "m/chat_template.jinja"); },
                     "m/chat_template.jinja: the chat template is not valid UTF-8 (byte 0)");
}

TEST(ChatTemplateNames, OverrideByNameOnATokenizer) {
  auto tok = Tokenizer::load(fixture_dir() + "smollm2");
  EXPECT_FALSE(tok->has_chat_template());
  tok->set_chat_template("chatml");
  const ChatEncoding enc =
      tok->chat_template().encode(*tok, {{"user", "a"}, {"assistant", "b"}}, false);
  EXPECT_EQ(tok->decode(enc.ids),
            "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n");
  std::string masked;
  for (size_t i = 0; i < enc.ids.size(); ++i) {
    if (enc.assistant_mask[i]) masked += tok->decode({enc.ids[i]});
  }
  EXPECT_EQ(masked, "\nb<|im_end|>\n");
}

TEST(ChatTemplateNames, Llama3TrimsContentWithPythonWhitespace) {
  ChatTemplate t = ChatTemplate::from_name("llama3");
  t.set_bos_token("<|begin_of_text|>");
  EXPECT_EQ(t.render({{"user", " \u3000hi\x1f\n"}}, false),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>");
}

}  // namespace
}  // namespace leantune
