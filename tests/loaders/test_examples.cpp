// Tokenisation of JSONL records into SFT / preference / unpaired / prompt examples: EOS,
// completion and assistant masks, truncation modes and drops, with a fake byte-level encoder
// and with the committed Qwen2.5 tokenizer.
#include <gtest/gtest.h>

#include <filesystem>

#include "dataset_test_util.h"
#include "engine/check.h"
#include "loaders/chat_template.h"
#include "loaders/dataset.h"
#include "loaders/examples.h"
#include "loaders/jsonl.h"
#include "loaders/text_encoder.h"
#include "loaders/tokenizer.h"
#include "testing/testing.h"

namespace leantune {
namespace {

using namespace dataset_testing;

// ---- SFT tokenisation

DataConfig sft_config() {
  DataConfig c;
  c.max_length = 0;
  return c;
}

TEST(SftExamples, TextGetsEosOnce) {
  FakeEncoder e;
  const auto data = load_sft_data(
      write_lines("t.jsonl", {R"({"text":"ab"})", R"({"text":"cd<eos>"})"}), &e, sft_config());
  ASSERT_EQ(data.examples.size(), 2);
  const auto ids0 = data.examples.ids(0);
  EXPECT_EQ(std::vector<int32_t>(ids0.begin(), ids0.end()), (std::vector<int32_t>{1, 197, 198, 2}));
  const auto ids1 = data.examples.ids(1);
  EXPECT_EQ(std::vector<int32_t>(ids1.begin(), ids1.end()), (std::vector<int32_t>{1, 199, 200, 2}));
  const auto m = data.examples.mask(0);
  EXPECT_EQ(std::vector<uint8_t>(m.begin(), m.end()), (std::vector<uint8_t>{1, 1, 1, 1}));
  EXPECT_FALSE(data.completion_only_loss);
}

TEST(SftExamples, PromptCompletionMask) {
  FakeEncoder e;
  const std::string path = write_lines("pc.jsonl", {R"({"prompt":"ab","completion":"c"})"});
  auto data = load_sft_data(path, &e, sft_config());
  EXPECT_TRUE(data.completion_only_loss);
  auto ids = data.examples.ids(0);
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.end()),
            (std::vector<int32_t>{1, 197, 198, 199, 2}));
  auto m = data.examples.mask(0);
  EXPECT_EQ(std::vector<uint8_t>(m.begin(), m.end()), (std::vector<uint8_t>{0, 0, 0, 1, 1}));
  DataConfig off = sft_config();
  off.completion_only_loss = false;
  data = load_sft_data(path, &e, off);
  m = data.examples.mask(0);
  EXPECT_EQ(std::vector<uint8_t>(m.begin(), m.end()), (std::vector<uint8_t>{1, 1, 1, 1, 1}));
}

TEST(SftExamples, ConversationalAssistantOnlyLoss) {
  FakeEncoder e;
  const std::string path = write_lines(
      "m.jsonl",
      {R"({"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]})"});
  DataConfig c = sft_config();
  c.assistant_only_loss = true;
  const auto data = load_sft_data(path, &e, c);
  const auto expected = FakeEncoder().encode_chat({{"user", "a"}, {"assistant", "b"}}, false);
  auto ids = data.examples.ids(0);
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.end()), expected.ids);
  auto m = data.examples.mask(0);
  EXPECT_EQ(std::vector<uint8_t>(m.begin(), m.end()), expected.assistant_mask);
  // Non-conversational data cannot use assistant_only_loss.
  EXPECT_THROW(load_sft_data(write_lines("t.jsonl", {R"({"text":"x"})"}), &e, c), Error);
}

TEST(SftExamples, ConversationalPromptCompletion) {
  FakeEncoder e;
  const auto data = load_sft_data(
      write_lines("pcm.jsonl", {R"({"prompt":[{"role":"user","content":"q"}],)"
                                R"("completion":[{"role":"assistant","content":"a"}]})"}),
      &e, sft_config());
  const auto full = e.encode_chat({{"user", "q"}, {"assistant", "a"}}, false);
  const auto prompt = e.encode_chat({{"user", "q"}}, true);
  auto ids = data.examples.ids(0);
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.end()), full.ids);
  // "<assistant>" of the generation prompt is also the start of the completion's header, so
  // the common prefix covers it.
  auto m = data.examples.mask(0);
  size_t zeros = 0;
  while (zeros < m.size() && m[zeros] == 0) ++zeros;
  EXPECT_EQ(zeros, prompt.ids.size());
  EXPECT_EQ(data.stats.prompt_mismatch, 0);
}

TEST(SftExamples, TruncationModesAndDrops) {
  FakeEncoder e;
  const std::string path = write_lines("t.jsonl", {R"({"text":"abcdef"})", R"({"text":"ab"})"});
  DataConfig c = sft_config();
  c.max_length = 4;
  auto data = load_sft_data(path, &e, c);
  auto ids = data.examples.ids(0);
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.end()), (std::vector<int32_t>{1, 197, 198, 199}));
  EXPECT_EQ(data.stats.truncated_examples, 1);
  EXPECT_EQ(data.stats.truncated_tokens, 4);  // bos a b c d e f eos: 8 -> 4
  EXPECT_EQ(data.examples.cut(0), 4);
  c.truncation_mode = "keep_end";
  data = load_sft_data(path, &e, c);
  ids = data.examples.ids(0);
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.end()), (std::vector<int32_t>{200, 201, 202, 2}));
  // Packing: nothing is cut before the packer.
  c.packing = true;
  data = load_sft_data(path, &e, c);
  EXPECT_EQ(data.examples.length(0), 8);
  EXPECT_EQ(data.stats.truncated_examples, 0);
}

TEST(SftExamples, AcceptanceCase12DropsFullyMaskedExamples) {
  const std::string path =
      write_lines("tk.jsonl", {R"({"input_ids":[1,2,3,4,5],"completion_mask":[0,0,0,1,1]})",
                               R"({"input_ids":[6,7,8],"completion_mask":[1,1,1]})"});
  DataConfig c = sft_config();
  c.max_length = 3;
  const auto data = load_sft_data(path, nullptr, c);
  ASSERT_EQ(data.examples.size(), 1);
  auto ids = data.examples.ids(0);
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.end()), (std::vector<int32_t>{6, 7, 8}));
  EXPECT_EQ(data.examples.line(0), 2);
  EXPECT_EQ(data.stats.dropped_examples, 1);
  EXPECT_EQ(data.stats.dropped_tokens, 5);
  EXPECT_NE(data.stats.summary().find("1 dropped with no trainable token"), std::string::npos)
      << data.stats.summary();
}

TEST(SftExamples, TrainableOnlyAtFirstPositionIsDropped) {
  const std::string path =
      write_lines("tk.jsonl", {R"({"input_ids":[1,2],"completion_mask":[1,0]})",
                               R"({"input_ids":[3,4],"completion_mask":[0,1]})"});
  const auto data = load_sft_data(path, nullptr, sft_config());
  ASSERT_EQ(data.examples.size(), 1);
  EXPECT_EQ(data.examples.line(0), 2);
}

TEST(SftExamples, BfdPackingChecksOnlyTheKeptPrefix) {
  const std::string path =
      write_lines("tk.jsonl", {R"({"input_ids":[1,2,3,4],"completion_mask":[0,0,1,1]})",
                               R"({"input_ids":[5,6],"completion_mask":[1,1]})"});
  DataConfig c = sft_config();
  c.max_length = 2;
  c.packing = true;
  auto data = load_sft_data(path, nullptr, c);
  EXPECT_EQ(data.examples.size(), 1);  // bfd keeps [1,2]: nothing to learn
  c.packing_strategy = "bfd_split";
  data = load_sft_data(path, nullptr, c);
  EXPECT_EQ(data.examples.size(), 2);
}

TEST(SftExamples, AllDroppedIsAnError) {
  const std::string path =
      write_lines("tk.jsonl", {R"({"input_ids":[1,2],"completion_mask":[0,0]})"});
  try {
    load_sft_data(path, nullptr, sft_config());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("no example left"), std::string::npos) << e.what();
  }
}

TEST(SftExamples, TokenizerErrorsBecomeBadLines) {
  FakeEncoder e;
  const std::string path = write_lines(
      "m.jsonl",
      {R"({"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]})",
       R"({"messages":[{"role":"tool","content":"a"}]})"});
  try {
    load_sft_data(path, &e, sft_config());
    FAIL();
  } catch (const Error& err) {
    EXPECT_EQ(std::string(err.what()).rfind(path + ":2: unknown role 'tool'", 0), 0u) << err.what();
  }
  DataConfig c = sft_config();
  c.skip_bad_lines = true;
  const auto data = load_sft_data(path, &e, c);
  EXPECT_EQ(data.examples.size(), 1);
  EXPECT_EQ(data.stats.bad_lines.count(BadLineKind::kTokenizer), 1);
}

TEST(SftExamples, FormatsSftCannotUse) {
  FakeEncoder e;
  EXPECT_THROW(load_sft_data(write_lines("p.jsonl", {R"({"prompt":"a"})"}), &e, sft_config()),
               Error);
  EXPECT_THROW(load_sft_data(write_lines("t.jsonl", {R"({"text":"a"})"}), nullptr, sft_config()),
               Error);
}

// ---- preference, unpaired, prompt-only

TEST(PreferenceExamples, EosAndTruncation) {
  FakeEncoder e;
  const std::string path =
      write_lines("p.jsonl", {R"({"prompt":"abcd","chosen":"xyz","rejected":"w"})"});
  DataConfig c;
  c.max_length = 0;
  c.max_prompt_length = 2;
  c.max_completion_length = 3;
  const auto data = load_preference_data(path, e, c);
  ASSERT_EQ(data.examples.size(), 1u);
  const auto& ex = data.examples[0];
  EXPECT_EQ(ex.prompt_ids, enc("cd"));   // last 2 tokens
  EXPECT_EQ(ex.chosen_ids, enc("xyz"));  // first 3 of x y z eos
  EXPECT_EQ(ex.rejected_ids, (std::vector<int32_t>{100 + 'w', 2}));
  EXPECT_EQ(data.stats.truncated_examples, 1);
  EXPECT_EQ(data.stats.truncated_tokens, 3);
}

TEST(PreferenceExamples, ConversationalImplicitPrompt) {
  FakeEncoder e;
  const std::string path = write_lines(
      "pc.jsonl",
      {R"({"chosen":[{"role":"user","content":"q"},{"role":"assistant","content":"a"}],)"
       R"("rejected":[{"role":"user","content":"q"},{"role":"assistant","content":"b"}]})"});
  DataConfig c;
  c.max_length = 0;
  const auto data = load_preference_data(path, e, c);
  const auto& ex = data.examples[0];
  EXPECT_EQ(ex.prompt_ids, enc("<user>q<eos><assistant>"));
  EXPECT_EQ(ex.chosen_ids, enc("a<eos><eos>"));  // the template's <eos> then the appended eos
  EXPECT_EQ(ex.rejected_ids, enc("b<eos><eos>"));
}

TEST(PreferenceExamples, DropWhenMaxLengthLeavesNoCompletion) {
  FakeEncoder e;
  const std::string path =
      write_lines("p.jsonl", {R"({"prompt":"abcdef","chosen":"x","rejected":"y"})",
                              R"({"prompt":"a","chosen":"x","rejected":"y"})"});
  DataConfig c;
  c.max_length = 4;
  c.max_prompt_length = 0;
  c.truncation_mode = "keep_start";
  auto data = load_preference_data(path, e, c);
  EXPECT_EQ(data.examples.size(), 1u);
  EXPECT_EQ(data.stats.dropped_examples, 1);
  c.truncation_mode = "keep_end";
  data = load_preference_data(path, e, c);
  EXPECT_EQ(data.examples.size(), 2u);
}

TEST(UnpairedExamples, FromUnpairedAndFromPreference) {
  FakeEncoder e;
  DataConfig c;
  auto data = load_unpaired_data(
      write_lines("u.jsonl", {R"({"prompt":"p","completion":"c","label":false})"}), e, c);
  ASSERT_EQ(data.examples.size(), 1u);
  EXPECT_FALSE(data.examples[0].label);
  EXPECT_EQ(data.examples[0].completion_ids, enc("c<eos>"));
  data = load_unpaired_data(
      write_lines("p.jsonl", {R"({"prompt":"p","chosen":"g","rejected":"b"})"}), e, c);
  ASSERT_EQ(data.examples.size(), 2u);
  EXPECT_TRUE(data.examples[0].label);
  EXPECT_EQ(data.examples[0].completion_ids, enc("g<eos>"));
  EXPECT_FALSE(data.examples[1].label);
}

TEST(PromptExamples, PromptOnly) {
  FakeEncoder e;
  DataConfig c;
  auto data = load_prompt_data(write_lines("po.jsonl", {R"({"prompt":"hi"})"}), e, c);
  EXPECT_EQ(data.examples[0].prompt_ids, enc("hi"));
  EXPECT_EQ(data.examples[0].prompt.text, "hi");
  data = load_prompt_data(
      write_lines("pom.jsonl", {R"({"prompt":[{"role":"user","content":"hi"}]})"}), e, c);
  EXPECT_EQ(data.examples[0].prompt_ids, enc("<user>hi<eos><assistant>"));
}

// ---- the real tokenizer (committed fixture), when present

std::string qwen_dir() {
  for (const char* rel : {"tokenizers/qwen2.5", "tokenizers/qwen2.5-0.5b-instruct"}) {
    const std::string p = testing::fixture_path(rel);
    if (std::filesystem::exists(p + "/tokenizer.json")) return p;
  }
  return "";
}

TEST(SftExamples, QwenTokenizerText) {
  const std::string dir = qwen_dir();
  if (dir.empty()) GTEST_SKIP() << "no Qwen2.5 tokenizer fixture under tests/fixtures/tokenizers";
  auto tok = Tokenizer::load(dir);
  auto encoder = make_text_encoder(tok);
  const auto data = load_sft_data(
      write_lines(
          "t.jsonl",
          {R"({"text":"Hello world"})",
           R"({"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello!"}]})"}),
      encoder.get(), [] {
        DataConfig c;
        c.skip_bad_lines = true;  // the second line has another format
        return c;
      }());
  ASSERT_EQ(data.examples.size(), 1);
  const auto expected = tok->encode("Hello world" + *tok->eos_token(), true);
  auto ids = data.examples.ids(0);
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.end()), expected);
  EXPECT_EQ(ids.back(), *tok->eos_token_id());
  EXPECT_EQ(data.stats.bad_lines.count(BadLineKind::kMissingKey), 1);
}

TEST(SftExamples, QwenTokenizerConversation) {
  const std::string dir = qwen_dir();
  if (dir.empty()) GTEST_SKIP() << "no Qwen2.5 tokenizer fixture under tests/fixtures/tokenizers";
  auto tok = Tokenizer::load(dir);
  auto encoder = make_text_encoder(tok);
  DataConfig c;
  c.assistant_only_loss = true;
  const auto data = load_sft_data(
      write_lines(
          "m.jsonl",
          {R"({"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello!"}]})"}),
      encoder.get(), c);
  const ChatEncoding expected =
      tok->chat_template().encode(*tok, {{"user", "Hi"}, {"assistant", "Hello!"}}, false);
  auto ids = data.examples.ids(0);
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.end()), expected.ids);
  auto m = data.examples.mask(0);
  EXPECT_EQ(std::vector<uint8_t>(m.begin(), m.end()), expected.assistant_mask);
}

}  // namespace
}  // namespace leantune
