// JSONL datasets: every TRL format parses, every bad-line category is reported with its file
// and line (or skipped and counted), UTF-8 / surrogate validation and prompt extraction.
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

// ---- formats

TEST(DatasetFormats, Text) {
  DatasetFormat f;
  const auto recs = read_all(
      write_lines("t.jsonl", {R"({"text":"hello","other":1})", R"({"text":"world"})"}), {}, &f);
  EXPECT_EQ(f.kind, DatasetKind::kLanguageModeling);
  EXPECT_FALSE(f.conversational);
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[0].text.text, "hello");
  EXPECT_EQ(recs[1].line, 2);
}

TEST(DatasetFormats, DatasetTextFieldRenamesText) {
  DatasetFormat f;
  DatasetReaderOptions o;
  o.dataset_text_field = "content";
  const auto recs = read_all(write_lines("t.jsonl", {R"({"content":"abc"})"}), o, &f);
  EXPECT_EQ(f.kind, DatasetKind::kLanguageModeling);
  EXPECT_EQ(recs[0].text.text, "abc");
  EXPECT_NE(f.name().find("content"), std::string::npos);
}

TEST(DatasetFormats, Messages) {
  DatasetFormat f;
  const auto recs =
      read_all(write_lines("m.jsonl", {R"({"messages":[{"role":"user","content":"hi"},)"
                                       R"({"role":"assistant","content":"yo"}]})"}),
               {}, &f);
  EXPECT_TRUE(f.conversational);
  ASSERT_EQ(recs[0].text.messages.size(), 2u);
  EXPECT_EQ(recs[0].text.messages[1], (Message{"assistant", "yo"}));
}

TEST(DatasetFormats, PromptCompletionStringsAndMessages) {
  DatasetFormat f;
  auto recs = read_all(
      write_lines("pc.jsonl", {R"({"prompt":"The sky is","completion":" blue."})"}), {}, &f);
  EXPECT_EQ(f.kind, DatasetKind::kPromptCompletion);
  EXPECT_FALSE(f.conversational);
  EXPECT_EQ(recs[0].completion.text, " blue.");
  recs =
      read_all(write_lines("pcm.jsonl", {R"({"prompt":[{"role":"user","content":"q"}],)"
                                         R"("completion":[{"role":"assistant","content":"a"}]})"}),
               {}, &f);
  EXPECT_EQ(f.kind, DatasetKind::kPromptCompletion);
  EXPECT_TRUE(f.conversational);
  EXPECT_EQ(recs[0].completion.messages[0].content, "a");
}

TEST(DatasetFormats, PreferenceExplicitAndImplicit) {
  DatasetFormat f;
  auto recs = read_all(
      write_lines("p.jsonl", {R"({"prompt":"Q","chosen":" good","rejected":" bad"})"}), {}, &f);
  EXPECT_EQ(f.kind, DatasetKind::kPreference);
  EXPECT_FALSE(f.implicit_prompt);
  EXPECT_EQ(recs[0].prompt.text, "Q");
  // Implicit, strings: the shared prefix is the prompt; the space before the split goes with
  // the completions (TRL's extract_prompt).
  recs = read_all(
      write_lines("pi.jsonl", {R"({"chosen":"The sky is blue.","rejected":"The sky is green."})"}),
      {}, &f);
  EXPECT_TRUE(f.implicit_prompt);
  EXPECT_EQ(recs[0].prompt.text, "The sky is");
  EXPECT_EQ(recs[0].chosen.text, " blue.");
  EXPECT_EQ(recs[0].rejected.text, " green.");
  // Implicit, conversational (TRL's docstring example).
  recs = read_all(
      write_lines("pic.jsonl", {R"({"chosen":[{"role":"user","content":"What color is the sky?"},)"
                                R"({"role":"assistant","content":"It is blue."}],)"
                                R"("rejected":[{"role":"user","content":"What color is the sky?"},)"
                                R"({"role":"assistant","content":"It is green."}]})"}),
      {}, &f);
  EXPECT_TRUE(f.conversational);
  EXPECT_TRUE(f.implicit_prompt);
  ASSERT_EQ(recs[0].prompt.messages.size(), 1u);
  EXPECT_EQ(recs[0].prompt.messages[0].content, "What color is the sky?");
  ASSERT_EQ(recs[0].chosen.messages.size(), 1u);
  EXPECT_EQ(recs[0].chosen.messages[0].content, "It is blue.");
  EXPECT_EQ(recs[0].rejected.messages[0].content, "It is green.");
  // A string prompt beside message lists is ignored and the prompt extracted
  // (maybe_extract_prompt).
  recs = read_all(
      write_lines(
          "pim.jsonl",
          {R"({"prompt":"What color is the sky?",)"
           R"("chosen":[{"role":"user","content":"q"},{"role":"assistant","content":"a"}],)"
           R"("rejected":[{"role":"user","content":"q"},{"role":"assistant","content":"b"}]})"}),
      {}, &f);
  EXPECT_TRUE(f.implicit_prompt);
  EXPECT_EQ(recs[0].prompt.messages[0].content, "q");
}

TEST(DatasetFormats, ExtractPromptQuirks) {
  // Identical up to the shorter length: TRL's loop leaves idx at min_length - 1.
  TextField c{"abc", {}}, r{"abcd", {}}, p;
  extract_prompt(&c, &r, &p, false);
  EXPECT_EQ(p.text, "ab");
  EXPECT_EQ(c.text, "c");
  EXPECT_EQ(r.text, "cd");
  // Differing at the first character: empty prompt.
  TextField c2{"x", {}}, r2{"y", {}}, p2;
  extract_prompt(&c2, &r2, &p2, false);
  EXPECT_EQ(p2.text, "");
  EXPECT_EQ(c2.text, "x");
}

TEST(DatasetFormats, UnpairedPromptOnlyTokenized) {
  DatasetFormat f;
  auto recs = read_all(write_lines("u.jsonl", {R"({"prompt":"Q","completion":"A","label":true})",
                                               R"({"prompt":"Q","completion":"B","label":false})"}),
                       {}, &f);
  EXPECT_EQ(f.kind, DatasetKind::kUnpairedPreference);
  EXPECT_TRUE(recs[0].label);
  EXPECT_FALSE(recs[1].label);
  recs = read_all(write_lines("po.jsonl", {R"({"prompt":"Q"})"}), {}, &f);
  EXPECT_EQ(f.kind, DatasetKind::kPromptOnly);
  recs = read_all(write_lines("tk.jsonl", {R"({"input_ids":[5,6,7],"completion_mask":[0,1,1]})"}),
                  {}, &f);
  EXPECT_EQ(f.kind, DatasetKind::kTokenized);
  EXPECT_TRUE(f.has_completion_mask);
  EXPECT_EQ(recs[0].input_ids, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(recs[0].completion_mask, (std::vector<uint8_t>{0, 1, 1}));
  recs =
      read_all(write_lines("tl.jsonl", {R"({"input_ids":[5,6,7],"labels":[-100,6,7]})"}), {}, &f);
  EXPECT_TRUE(f.has_labels);
  EXPECT_EQ(recs[0].label_mask, (std::vector<uint8_t>{0, 1, 1}));
}

TEST(DatasetFormats, BlankLinesAndCrlf) {
  DatasetReader r(write_file(testing::temp_dir("crlf"), "c.jsonl",
                             "{\"text\":\"a\"}\r\n\r\n   \n{\"text\":\"b\"}"));
  Record rec;
  ASSERT_TRUE(r.next(&rec));
  EXPECT_EQ(rec.text.text, "a");
  ASSERT_TRUE(r.next(&rec));
  EXPECT_EQ(rec.text.text, "b");
  EXPECT_EQ(rec.line, 4);
  EXPECT_FALSE(r.next(&rec));
  EXPECT_EQ(r.blank_lines(), 2);
}

// ---- bad lines: strict mode names file:line; skip mode counts per category

struct BadCase {
  std::string name;
  std::vector<std::string> lines;  // the bad one is the last
  BadLineKind kind;
  std::string needle;
  std::string text_field = "text";
};

std::ostream& operator<<(std::ostream& os, const BadCase& c) { return os << c.name; }

class DatasetBadLine : public ::testing::TestWithParam<BadCase> {};

TEST_P(DatasetBadLine, StrictReportsFileAndLine) {
  const BadCase& c = GetParam();
  const std::string path = write_lines("bad.jsonl", c.lines);
  DatasetReaderOptions o;
  o.dataset_text_field = c.text_field;
  o.vocab_size = 1000;
  try {
    read_all(path, o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    const std::string what = e.what();
    const std::string where = path + ":" + std::to_string(c.lines.size()) + ": ";
    EXPECT_EQ(what.rfind(where, 0), 0u) << what;
    EXPECT_NE(what.find(c.needle), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << "one line: " << what;
  }
}

TEST_P(DatasetBadLine, SkipCountsCategory) {
  const BadCase& c = GetParam();
  std::vector<std::string> lines = c.lines;
  // A valid line after the bad one, in the detected format.
  lines.push_back(lines.size() > 1 ? lines[0] : R"({"text":"ok"})");
  const std::string path = write_lines("bad.jsonl", lines);
  DatasetReaderOptions o;
  o.dataset_text_field = c.text_field;
  o.skip_bad_lines = true;
  o.vocab_size = 1000;
  DatasetReader r(path, o);
  Record rec;
  int n = 0;
  while (r.next(&rec)) ++n;
  EXPECT_EQ(n, static_cast<int>(lines.size()) - 1);
  EXPECT_EQ(r.bad_lines().total(), 1);
  EXPECT_EQ(r.bad_lines().count(c.kind), 1) << r.bad_lines().summary();
  EXPECT_NE(r.bad_lines().summary().find(bad_line_kind_name(c.kind)), std::string::npos);
}

const std::string kOk = R"({"prompt":"p","completion":"c"})";

INSTANTIATE_TEST_SUITE_P(
    Categories, DatasetBadLine,
    ::testing::Values(
        BadCase{"invalid_json",
                {kOk, R"({"prompt":"p","completion":)"},
                BadLineKind::kInvalidJson,
                "invalid JSON"},
        BadCase{"trailing_garbage",
                {kOk, R"({"prompt":"p","completion":"c"} x)"},
                BadLineKind::kInvalidJson,
                "invalid JSON"},
        BadCase{"not_object",
                {kOk, R"(["p","c"])"},
                BadLineKind::kNotObject,
                "expected a JSON object, got array"},
        BadCase{"missing_key",
                {kOk, kOk, R"({"prompt":"p"})"},
                BadLineKind::kMissingKey,
                "missing key 'completion'"},
        BadCase{"unknown_format_first_line",
                {R"({"foo":1})"},
                BadLineKind::kMissingKey,
                "cannot detect the dataset format"},
        BadCase{"wrong_type",
                {kOk, R"({"prompt":"p","completion":7})"},
                BadLineKind::kWrongType,
                "'completion' must be a string, got number"},
        BadCase{"wrong_style",
                {kOk, R"({"prompt":"p","completion":[{"role":"assistant","content":"c"}]})"},
                BadLineKind::kWrongType,
                "got a message list"},
        BadCase{"message_missing_content",
                {R"({"messages":[{"role":"user","content":"a"}]})",
                 R"({"messages":[{"role":"user"}]})"},
                BadLineKind::kMissingKey,
                "missing key 'content' in 'messages[0]'"},
        BadCase{"label_not_bool",
                {R"({"prompt":"p","completion":"c","label":true})",
                 R"({"prompt":"p","completion":"c","label":1})"},
                BadLineKind::kWrongType,
                "'label' must be a boolean"},
        BadCase{"empty_text",
                {R"({"text":"a"})", R"({"text":""})"},
                BadLineKind::kEmptyText,
                "'text' is empty"},
        BadCase{"empty_messages",
                {R"({"messages":[{"role":"user","content":"a"}]})", R"({"messages":[]})"},
                BadLineKind::kEmptyText,
                "empty message list"},
        BadCase{"mask_length",
                {R"({"input_ids":[1],"completion_mask":[1]})",
                 R"({"input_ids":[1,2],"completion_mask":[1]})"},
                BadLineKind::kWrongType,
                "'completion_mask' has 1 values"},
        BadCase{"token_out_of_range",
                {R"({"input_ids":[1]})", R"({"input_ids":[1,1000]})"},
                BadLineKind::kOutOfRange,
                "'input_ids[1]' = 1000"},
        BadCase{"negative_token",
                {R"({"input_ids":[1]})", R"({"input_ids":[-1]})"},
                BadLineKind::kOutOfRange,
                "'input_ids[0]' = -1"},
        BadCase{"mask_not_binary",
                {R"({"input_ids":[1],"completion_mask":[1]})",
                 R"({"input_ids":[1],"completion_mask":[2]})"},
                BadLineKind::kOutOfRange,
                "'completion_mask[0]' = 2"},
        BadCase{"label_not_token",
                {R"({"input_ids":[1],"labels":[1]})", R"({"input_ids":[1],"labels":[5]})"},
                BadLineKind::kWrongType,
                "neither -100 nor input_ids[0]"},
        BadCase{"invalid_utf8",
                {kOk, "{\"prompt\":\"p\xff\",\"completion\":\"c\"}"},
                BadLineKind::kInvalidUtf8,
                "invalid UTF-8 at byte 13"},
        BadCase{"utf8_encoded_surrogate",
                {kOk, "{\"prompt\":\"\xed\xa0\x80\",\"completion\":\"c\"}"},
                BadLineKind::kInvalidUtf8,
                "invalid UTF-8"},
        BadCase{"overlong_utf8",
                {kOk, "{\"prompt\":\"\xc0\xaf\",\"completion\":\"c\"}"},
                BadLineKind::kInvalidUtf8,
                "invalid UTF-8"},
        BadCase{"lone_high_surrogate",
                {kOk, R"({"prompt":"a\ud800","completion":"c"})"},
                BadLineKind::kLoneSurrogate,
                "lone surrogate escape '\\ud800'"},
        BadCase{"high_then_other_escape",
                {kOk, R"({"prompt":"a\ud800\u0041","completion":"c"})"},
                BadLineKind::kLoneSurrogate,
                "lone surrogate"},
        // A file has one schema: a key row 1's format does not use is refused, not dropped.
        BadCase{"margin_from_row_2",
                {R"({"prompt":"p","chosen":"a","rejected":"b"})",
                 R"({"prompt":"p","chosen":"a","rejected":"b","margin":1})"},
                BadLineKind::kFormatMismatch,
                "has key 'margin', which the dataset's format (preference, from line 1) does not "
                "use"},
        BadCase{"prompt_from_row_2",
                {R"({"chosen":"p a","rejected":"p b"})",
                 R"({"prompt":"q","chosen":" a","rejected":" b"})"},
                BadLineKind::kFormatMismatch,
                "has key 'prompt', which the dataset's format (preference (implicit prompt), from "
                "line 1)"},
        BadCase{"label_from_row_2",
                {kOk, R"({"prompt":"p","completion":"c","label":true})"},
                BadLineKind::kFormatMismatch,
                "has key 'label'"},
        BadCase{"mask_from_row_2",
                {R"({"input_ids":[1]})", R"({"input_ids":[1],"completion_mask":[1]})"},
                BadLineKind::kFormatMismatch,
                "has key 'completion_mask'"},
        BadCase{"messages_beside_text_from_row_2",
                {R"({"text":"a"})", R"({"text":"b","messages":[{"role":"user","content":"x"}]})"},
                BadLineKind::kFormatMismatch,
                "has key 'messages'"},
        BadCase{"margin_missing_from_row_2",
                {R"({"prompt":"p","chosen":"a","rejected":"b","margin":1})",
                 R"({"prompt":"p","chosen":"a","rejected":"b"})"},
                BadLineKind::kMissingKey,
                "missing key 'margin' (dataset format, from line 1: preference (margin))"},
        BadCase{"lone_low_surrogate",
                {kOk, R"({"prompt":"a\uDC00","completion":"c"})"},
                BadLineKind::kLoneSurrogate,
                "lone surrogate escape '\\uDC00'"}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return info.param.name; });

TEST(DatasetBadLines, SkipSummaryCountsEveryCategory) {
  const std::string path = write_lines(
      "mixed.jsonl",
      {R"({"text":"a"})", "{bad", R"([1])", R"({"other":1})", R"({"text":3})", R"({"text":""})",
       "{\"text\":\"\xff\"}", R"({"text":"\ud800"})", R"({"text":"b"})", R"({"text":"\\ud800"})"});
  DatasetReaderOptions o;
  o.skip_bad_lines = true;
  DatasetReader r(path, o);
  Record rec;
  std::vector<std::string> texts;
  while (r.next(&rec)) texts.push_back(rec.text.text);
  // An escaped backslash followed by "ud800" is text, not an escape.
  EXPECT_EQ(texts, (std::vector<std::string>{"a", "b", "\\ud800"}));
  const BadLineCounts& b = r.bad_lines();
  EXPECT_EQ(b.count(BadLineKind::kInvalidJson), 1);
  EXPECT_EQ(b.count(BadLineKind::kNotObject), 1);
  EXPECT_EQ(b.count(BadLineKind::kMissingKey), 1);
  EXPECT_EQ(b.count(BadLineKind::kWrongType), 1);
  EXPECT_EQ(b.count(BadLineKind::kEmptyText), 1);
  EXPECT_EQ(b.count(BadLineKind::kInvalidUtf8), 1);
  EXPECT_EQ(b.count(BadLineKind::kLoneSurrogate), 1);
  EXPECT_EQ(b.total(), 7);
  EXPECT_EQ(b.summary(),
            "7 bad lines skipped: invalid_utf8 1, lone_surrogate 1, invalid_json 1, not_object 1, "
            "missing_key 1, wrong_type 1, empty_text 1");
  ASSERT_EQ(b.examples.size(), BadLineCounts::kMaxExamples);
  EXPECT_EQ(b.examples[0].rfind(path + ":2: ", 0), 0u) << b.examples[0];
}

TEST(DatasetBadLines, EmptyAndMissingFiles) {
  const std::string dir = testing::temp_dir("files");
  EXPECT_THROW(read_all(dir + "/nope.jsonl"), Error);
  try {
    read_all(write_file(dir, "empty.jsonl", ""));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("no valid example"), std::string::npos) << e.what();
  }
  DatasetReaderOptions o;
  o.skip_bad_lines = true;
  try {
    read_all(write_lines("allbad.jsonl", {"{", "["}), o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("2 bad lines skipped"), std::string::npos) << e.what();
  }
}

// Mutated lines (random byte flips, truncations, insertions) never crash the reader: every
// line is either a record or one counted bad line.
TEST(DatasetBadLines, RandomMutationsAreRecordsOrCountedBadLines) {
  const std::vector<std::string> seeds = {
      R"({"prompt":"The sky is","completion":" blue.","x":[1,2,{"y":null}]})",
      R"({"prompt":"caf\u00e9 \ud83d\ude00","completion":"\"q\" \\ end"})",
      "{\"prompt\":\"\xe2\x82\xac\",\"completion\":\"\xf0\x9f\x98\x80\"}"};
  uint64_t x = 12345;
  auto next = [&x] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  std::vector<std::string> lines = {seeds[0]};
  const char alphabet[] = "{}[]\",:u0d8c \x80\xff\xed\xa0\n";
  for (int i = 0; i < 3000; ++i) {
    std::string l = seeds[next() % seeds.size()];
    const int edits = 1 + static_cast<int>(next() % 4);
    for (int e = 0; e < edits && !l.empty(); ++e) {
      const size_t at = next() % l.size();
      switch (next() % 3) {
        case 0:
          l[at] = alphabet[next() % (sizeof(alphabet) - 1)];
          break;
        case 1:
          l.resize(at);
          break;
        default:
          l.insert(at, 1, alphabet[next() % (sizeof(alphabet) - 1)]);
          break;
      }
    }
    if (l.find('\n') != std::string::npos) l.erase(l.find('\n'));
    if (l.find_first_not_of(" \t\r") == std::string::npos) l = "x";
    lines.push_back(l);
  }
  DatasetReaderOptions o;
  o.skip_bad_lines = true;
  DatasetReader r(write_lines("fuzz.jsonl", lines), o);
  Record rec;
  int64_t records = 0;
  while (r.next(&rec)) ++records;
  EXPECT_EQ(records + r.bad_lines().total(), static_cast<int64_t>(lines.size()));
  EXPECT_GT(records, 0);
  EXPECT_GT(r.bad_lines().total(), 0);
}

TEST(Utf8, Validator) {
  EXPECT_EQ(find_invalid_utf8("plain ascii, long enough for the fast path"), std::string::npos);
  EXPECT_EQ(find_invalid_utf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), std::string::npos);
  EXPECT_EQ(find_invalid_utf8("\xf4\x8f\xbf\xbf"), std::string::npos);  // U+10FFFF
  EXPECT_EQ(find_invalid_utf8("ab\x80"), 2u);                           // stray continuation
  EXPECT_EQ(find_invalid_utf8("abcdefghij\xc3"), 10u);                  // truncated
  EXPECT_EQ(find_invalid_utf8("\xe0\x80\xaf"), 0u);                     // overlong
  EXPECT_EQ(find_invalid_utf8("\xed\xbf\xbf"), 0u);                     // surrogate U+DFFF
  EXPECT_EQ(find_invalid_utf8("\xf4\x90\x80\x80"), 0u);                 // above U+10FFFF
  EXPECT_EQ(find_invalid_utf8("\xf5\x80\x80\x80"), 0u);
  EXPECT_EQ(find_invalid_utf8(std::string_view("a\0b", 3)), std::string::npos);
}

TEST(Utf8, SurrogateEscapes) {
  EXPECT_EQ(find_lone_surrogate_escape(R"("\ud83d\ude00")"), std::string::npos);
  EXPECT_EQ(find_lone_surrogate_escape(R"("\ud83d")"), 1u);
  EXPECT_EQ(find_lone_surrogate_escape(R"("\ude00\ud83d")"), 1u);
  EXPECT_EQ(find_lone_surrogate_escape(R"("\\ud800")"), std::string::npos);
  EXPECT_EQ(find_lone_surrogate_escape(R"("\\\ud800")"), 3u);
  EXPECT_EQ(find_lone_surrogate_escape(R"("\u00e9\n\t")"), std::string::npos);
}

}  // namespace
}  // namespace leantune
