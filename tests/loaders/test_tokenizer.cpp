// Tokenizer tests: ids and decoded text must equal Hugging Face tokenizers' on the real
// Qwen2.5 / Llama-3.2 / SmolLM2 files (references made by tests/fixtures/
// gen_tokenizer_fixtures.py and the published llama.cpp / transformers.js cases), on small
// synthetic tokenizer.json files that use the options the real ones do not, and the error paths
// (invalid UTF-8, bad files, bad ids) must throw leantune::Error of kind kInput.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "engine/check.h"
#include "loaders/bpe.h"
#include "loaders/chat_template.h"
#include "loaders/fs_util.h"
#include "loaders/tokenizer.h"
#include "loaders/unicode.h"

namespace leantune {
namespace {

using nlohmann::json;

std::string fixture_dir() { return std::string(LT_SOURCE_DIR) + "/tests/fixtures/tokenizers/"; }

const json& load_json(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, json> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(name);
  if (it == cache.end()) {
    it = cache.emplace(name, read_json_file(fixture_dir() + name)).first;
  }
  return it->second;
}

std::shared_ptr<Tokenizer> tokenizer(const std::string& folder) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<Tokenizer>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& t = cache[folder];
  if (!t) t = Tokenizer::load(fixture_dir() + folder);
  return t;
}

std::string show(const std::string& s) { return json(s).dump(); }

class RealTokenizer : public ::testing::TestWithParam<std::string> {};

TEST_P(RealTokenizer, EncodeMatchesHuggingFaceReferencePairs) {
  const auto tok = tokenizer(GetParam());
  const json& cases = load_json("reference_pairs.json")["tokenizers"][GetParam()]["cases"];
  ASSERT_GT(cases.size(), 50u);
  for (const json& c : cases) {
    const std::string text = c["text"];
    EXPECT_EQ(tok->encode(text, false), c["ids"].get<std::vector<int32_t>>())
        << c["category"] << " " << show(text);
    EXPECT_EQ(tok->encode(text, true), c["ids_with_special"].get<std::vector<int32_t>>())
        << c["category"] << " " << show(text);
  }
}

TEST_P(RealTokenizer, DecodeMatchesHuggingFaceReferencePairs) {
  const auto tok = tokenizer(GetParam());
  const json& cases = load_json("reference_pairs.json")["tokenizers"][GetParam()]["cases"];
  for (const json& c : cases) {
    EXPECT_EQ(tok->decode(c["ids"].get<std::vector<int32_t>>(), false),
              c["decoded"].get<std::string>())
        << show(c["text"]);
    EXPECT_EQ(tok->decode(c["ids_with_special"].get<std::vector<int32_t>>(), true),
              c["decoded_skip_special"].get<std::string>())
        << show(c["text"]);
  }
}

TEST_P(RealTokenizer, VocabSizeMatchesHuggingFace) {
  const json& ref = load_json("reference_pairs.json")["tokenizers"][GetParam()];
  EXPECT_EQ(tokenizer(GetParam())->vocab_size(), ref["vocab_size"].get<int64_t>());
}

TEST_P(RealTokenizer, OffsetsCoverTheInputAndIdsMatchEncode) {
  const auto tok = tokenizer(GetParam());
  const json& cases = load_json("reference_pairs.json")["tokenizers"][GetParam()]["cases"];
  for (const json& c : cases) {
    const std::string text = c["text"];
    const EncodingWithOffsets enc = tok->encode_with_offsets(text, false);
    EXPECT_EQ(enc.ids, tok->encode(text, false)) << show(text);
    ASSERT_EQ(enc.offsets.size(), enc.ids.size());
    uint32_t prev_begin = 0;
    for (const auto& [b, e] : enc.offsets) {
      EXPECT_LT(b, e) << show(text);
      EXPECT_LE(e, text.size());
      EXPECT_GE(b, prev_begin) << show(text);
      prev_begin = b;
    }
    if (!enc.offsets.empty()) {
      EXPECT_EQ(enc.offsets.front().first, 0u) << show(text);
      EXPECT_EQ(enc.offsets.back().second, text.size()) << show(text);
    }
  }
}

TEST_P(RealTokenizer, EncodeDecodeRoundTripsNormalizedText) {
  const auto tok = tokenizer(GetParam());
  const json& cases = load_json("reference_pairs.json")["tokenizers"][GetParam()]["cases"];
  for (const json& c : cases) {
    // decoded is the normalized input (NFC for Qwen2.5), which must round-trip exactly.
    const std::string normalized = c["decoded"];
    EXPECT_EQ(tok->decode(tok->encode(normalized)), normalized) << show(normalized);
  }
}

TEST_P(RealTokenizer, EncodeIsThreadSafe) {
  const auto tok = tokenizer(GetParam());
  const json& cases = load_json("reference_pairs.json")["tokenizers"][GetParam()]["cases"];
  std::vector<std::string> texts;
  std::vector<std::vector<int32_t>> want;
  for (const json& c : cases) {
    texts.push_back(c["text"]);
    want.push_back(c["ids"].get<std::vector<int32_t>>());
  }
  std::vector<int> failures(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 5; ++round) {
        for (size_t i = 0; i < texts.size(); ++i) {
          if (tok->encode(texts[(i + t * 7) % texts.size()]) != want[(i + t * 7) % texts.size()]) {
            ++failures[t];
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int f : failures) EXPECT_EQ(f, 0);
}

INSTANTIATE_TEST_SUITE_P(Files, RealTokenizer, ::testing::Values("qwen2.5", "llama3.2", "smollm2"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n) {
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return n;
                         });

// The published pairs (llama.cpp's vocab tests, made with HF tokenizers; transformers.js).
TEST(PublishedReferenceCases, AllFamiliesMatch) {
  const json& d = load_json("published_reference_cases.json");
  const std::map<std::string, std::string> folder = {
      {"qwen2_family", "qwen2.5"}, {"llama3_family", "llama3.2"}, {"smollm_family", "smollm2"}};
  size_t checked = 0;
  for (const auto& [family, dir] : folder) {
    const auto tok = tokenizer(dir);
    for (const char* key : {"add_special_tokens_false", "add_special_tokens_true"}) {
      if (!d[family].contains(key)) continue;
      const bool add = std::string(key) == "add_special_tokens_true";
      for (const json& c : d[family][key]) {
        EXPECT_EQ(tok->encode(c["text"].get<std::string>(), add),
                  c["ids"].get<std::vector<int32_t>>())
            << family << " " << show(c["text"]);
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 201u);
}

// Small tokenizer.json files built by the generator to cover Split behaviors/invert, ByteLevel
// prefix space and GPT-2 regex, Digits, ignore_merges, added-token flags with a lowercasing
// NFKD normalizer, TemplateProcessing, merges as pairs, and no decoder.
TEST(SyntheticTokenizers, MatchHuggingFace) {
  const json& synth = load_json("reference_pairs.json")["synthetic"];
  ASSERT_GE(synth.size(), 15u);
  for (const auto& [name, entry] : synth.items()) {
    const auto tok = Tokenizer::from_json(entry["tokenizer_json"].dump(), "", "", name);
    for (const json& c : entry["cases"]) {
      const std::string text = c["text"];
      EXPECT_EQ(tok->encode(text, false), c["ids"].get<std::vector<int32_t>>())
          << name << " " << show(text);
      EXPECT_EQ(tok->encode(text, true), c["ids_with_special"].get<std::vector<int32_t>>())
          << name << " " << show(text);
      EXPECT_EQ(tok->decode(c["ids"].get<std::vector<int32_t>>(), false),
                c["decoded"].get<std::string>())
          << name << " " << show(text);
      EXPECT_EQ(tok->decode(c["ids_with_special"].get<std::vector<int32_t>>(), true),
                c["decoded_skip_special"].get<std::string>())
          << name << " " << show(text);
    }
  }
}

TEST(TokenizerVocab, TokenLookupsAndSpecialTokens) {
  const auto qwen = tokenizer("qwen2.5");
  EXPECT_EQ(qwen->token_to_id("Ġthe"), 279);
  EXPECT_EQ(qwen->id_to_token(279), "Ġthe");
  EXPECT_EQ(qwen->token_to_id("<|im_start|>"), 151644);
  EXPECT_EQ(qwen->id_to_token(151645), "<|im_end|>");
  EXPECT_FALSE(qwen->token_to_id("no such token").has_value());
  EXPECT_EQ(qwen->id_to_token(-1), "");
  EXPECT_EQ(qwen->id_to_token(1 << 30), "");
  EXPECT_FALSE(qwen->bos_token_id().has_value());
  EXPECT_EQ(qwen->eos_token_id(), 151645);
  EXPECT_EQ(qwen->pad_token_id(), 151643);
  EXPECT_TRUE(qwen->is_special(151643));
  EXPECT_TRUE(qwen->is_special(151644));
  EXPECT_FALSE(qwen->is_special(151657));  // <tool_call> is an added, non-special token
  EXPECT_FALSE(qwen->is_special(279));

  const auto llama = tokenizer("llama3.2");
  EXPECT_EQ(llama->bos_token_id(), 128000);
  EXPECT_EQ(llama->eos_token_id(), 128009);
  EXPECT_FALSE(llama->pad_token_id().has_value());
  EXPECT_EQ(llama->bos_token(), "<|begin_of_text|>");
  EXPECT_EQ(llama->encode("Hi", true).front(), 128000);
  EXPECT_EQ(llama->encode("", true), std::vector<int32_t>{128000});
  EXPECT_TRUE(llama->encode("", false).empty());
}

TEST(TokenizerInput, InvalidUtf8IsAnInputErrorNamingTheByte) {
  const auto tok = tokenizer("qwen2.5");
  for (const auto& [text, offset] :
       std::vector<std::pair<std::string, size_t>>{{"\xff", 0},
                                                   {"ab\xe2\x82", 2},
                                                   {"ok \xed\xa0\x80 surrogate", 3},
                                                   {"\xc0\xaf overlong", 0},
                                                   {"abc\xf4\x90\x80\x80", 3}}) {
    try {
      tok->encode(text);
      ADD_FAILURE() << "no error for " << show(utf8_replace_invalid(text));
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInput);
      EXPECT_NE(std::string(e.what()).find("byte " + std::to_string(offset)), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(utf8_find_invalid(text), offset);
  }
  EXPECT_EQ(utf8_find_invalid("plain ascii and é 😀"), std::string_view::npos);
}

TEST(TokenizerInput, ReplaceInvalidFollowsPythonErrorsReplace) {
  // Values of bytes.decode('utf-8', errors='replace') in CPython 3.11.
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(utf8_replace_invalid("\xe2\x82"), r);
  EXPECT_EQ(utf8_replace_invalid("\xf0\x80\x80"), r + r + r);
  EXPECT_EQ(utf8_replace_invalid("a\xedz"), "a" + r + "z");
  EXPECT_EQ(utf8_replace_invalid("\xed\xa0\x80"), r + r + r);
  EXPECT_EQ(utf8_replace_invalid("\xf4\x8f\xbf"), r);
  EXPECT_EQ(utf8_replace_invalid("\xe2\x82\xac\xe2"), "\xe2\x82\xac" + r);
  EXPECT_EQ(utf8_replace_invalid("\xc3\x28"), r + "(");
  EXPECT_EQ(utf8_replace_invalid("\x80\xbf"), r + r);
}

TEST(TokenizerInput, DecodeOfPartialByteTokensReplacesLikeTokenizers) {
  const auto tok = tokenizer("qwen2.5");
  const std::vector<int32_t> ids = tok->encode("\ue000");  // a private-use character
  ASSERT_EQ(ids, (std::vector<int32_t>{170, 222, 222}));   // split into its three bytes
  EXPECT_EQ(tok->decode({ids[0]}), "\xEF\xBF\xBD");
  EXPECT_EQ(tok->decode({ids[0], ids[1]}), "\xEF\xBF\xBD");
  EXPECT_EQ(tok->decode({ids[1], ids[2], ids[0]}), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(tok->decode(ids), "\ue000");
}

TEST(TokenizerInput, DecodeRejectsIdsOutsideTheVocab) {
  const auto tok = tokenizer("llama3.2");
  for (int32_t bad : {-1, 128256, 1 << 30}) {
    try {
      tok->decode({1, bad});
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInput);
      EXPECT_NE(std::string(e.what()).find(std::to_string(bad)), std::string::npos);
    }
  }
}

TEST(TokenizerInput, LongRunsDoNotBreakTheRegexOrTheMergeLoop) {
  const auto tok = tokenizer("llama3.2");
  const std::string spaces(200000, ' ');
  const std::string text = "x" + spaces + "y";
  EXPECT_EQ(tok->decode(tok->encode(text)), text);
  const std::string word(100000, 'z');
  EXPECT_EQ(tok->decode(tok->encode(word)), word);
}

void expect_input_error(const std::string& json_text, const std::string& needle) {
  try {
    Tokenizer::from_json(json_text, "", "", "bad.json");
    ADD_FAILURE() << "no error for " << json_text;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bad.json"), std::string::npos) << e.what();
  }
}

TEST(TokenizerFiles, BadFilesAreInputErrorsNamingTheProblem) {
  expect_input_error("{not json", "invalid JSON");
  expect_input_error(R"({"model": {"type": "WordPiece", "vocab": {}}})", "WordPiece");
  expect_input_error(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})",
                     "not in the vocab");
  expect_input_error(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b"]}})",
                     "'ab' which is not in the vocab");
  expect_input_error(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["ab"]}})",
                     "not of the form");
  expect_input_error(R"({"model": {"type": "BPE", "vocab": {}, "byte_fallback": true}})",
                     "byte_fallback");
  expect_input_error(
      R"({"model": {"type": "BPE", "vocab": {}}, "normalizer": {"type": "BertNormalizer"}})",
      "BertNormalizer");
  expect_input_error(
      R"({"model": {"type": "BPE", "vocab": {}}, "pre_tokenizer": {"type": "Split", )"
      R"("pattern": {"Regex": "(["}, "behavior": "Isolated", "invert": false}})",
      "cannot compile regex");
  expect_input_error(R"({"model": {"type": "BPE", "vocab": {"a": 2000000000}}})",
                     "implausibly large");
  expect_input_error(
      R"({"model": {"type": "BPE", "vocab": {}}, "added_tokens": [{"id": -4, "content": "x"}]})",
      "outside [0, 2^31)");
  expect_input_error(R"({"model": {"type": "BPE", "vocab": {}}, "normalizer": {"type": 7}})",
                     "unexpected tokenizer.json content");
  expect_input_error(R"({"model": {"type": "BPE", "vocab": {"a": "x"}}})", "not an integer");
  expect_input_error(R"({"model": {"type": "BPE", "vocab": {}, "merges": [["a"]]}})",
                     "a merge must be");
  try {
    Tokenizer::load(fixture_dir() + "no_such_folder");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("no_such_folder"), std::string::npos);
  }
}

TEST(TokenizerFiles, LoadsFromTheTokenizerJsonPathToo) {
  const auto tok = Tokenizer::load(fixture_dir() + "llama3.2/tokenizer.json");
  EXPECT_EQ(tok->bos_token_id(), 128000);  // special_tokens_map/tokenizer_config found beside it
  EXPECT_NE(tok->source_path().find("tokenizer.json"), std::string::npos);
}

// The merge loop has two implementations (linear scan for short words, heap for long ones);
// on random BPE models they must agree with each other on every word.
TEST(BpeMergeLoop, ScanAndHeapAgreeOnRandomModels) {
  std::mt19937 rng(1234);
  const std::string alphabet = "abcd";
  for (int model = 0; model < 20; ++model) {
    FlatStringMap vocab;
    std::vector<std::string> tokens;
    for (char c : alphabet) {
      tokens.push_back(std::string(1, c));
      vocab.insert(tokens.back(), vocab.size());
    }
    std::vector<std::pair<std::string, std::string>> merges;
    for (int m = 0; m < 60; ++m) {
      const std::string a = tokens[rng() % tokens.size()];
      const std::string b = tokens[rng() % tokens.size()];
      if (a.size() + b.size() > 12) continue;
      merges.emplace_back(a, b);
      if (vocab.find(a + b) == FlatStringMap::kMissing) {
        vocab.insert(a + b, vocab.size());
        tokens.push_back(a + b);
      }
    }
    // Shuffle ranks so that new pairs can have lower ranks than the merge that made them.
    std::shuffle(merges.begin(), merges.end(), rng);
    BpeModel bpe(vocab, merges, {}, "random");
    for (int w = 0; w < 200; ++w) {
      std::string word;
      const int n = 1 + static_cast<int>(rng() % 120);
      for (int i = 0; i < n; ++i) word.push_back(alphabet[rng() % alphabet.size()]);
      EXPECT_EQ(bpe.merge_word_for_test(word, true), bpe.merge_word_for_test(word, false)) << word;
    }
  }
}

// trainer_bin tokenize, run as a user would (skipped when trainer_bin has not been built).
struct CommandResult {
  int exit_code;
  std::string out;
  std::string err;
};

CommandResult run_tokenize(const std::string& args, const std::string& stdin_text = "") {
  const std::string bin = std::string(LT_BINARY_DIR) + "/trainer_bin";
  // Per-process names: ctest runs the tests of this file in parallel processes.
  const std::string dir = ::testing::TempDir();
  const std::string id = std::to_string(::getpid());
  const std::string in_path = dir + "/lt_tokenize_in_" + id + ".txt";
  const std::string err_path = dir + "/lt_tokenize_err_" + id + ".txt";
  std::ofstream(in_path, std::ios::binary) << stdin_text;
  const std::string cmd = bin + " tokenize " + args + " < " + in_path + " 2> " + err_path;
  FILE* p = popen(cmd.c_str(), "r");
  EXPECT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  std::stringstream err;
  {
    std::ifstream ef(err_path);
    err << ef.rdbuf();
  }
  std::remove(in_path.c_str());
  std::remove(err_path.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out, err.str()};
}

bool have_trainer_bin() {
  return std::ifstream(std::string(LT_BINARY_DIR) + "/trainer_bin").good();
}

std::string quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

TEST(TokenizeCommand, EncodesDecodesAndRendersChats) {
  if (!have_trainer_bin()) GTEST_SKIP() << "trainer_bin not built";
  const std::string llama = "--tokenizer " + fixture_dir() + "llama3.2";
  CommandResult r = run_tokenize(llama + " --text 'How are you doing?' --add_special_tokens");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[128000,4438,527,499,3815,30]\n");
  EXPECT_EQ(r.err, "");

  r = run_tokenize(llama + " --decode --text '[128000,4438,527,499,3815,30]'");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "<|begin_of_text|>How are you doing?\n");
  r = run_tokenize(llama + " --decode --skip_special_tokens --file -", "[128000, 4438, 527]");
  EXPECT_EQ(r.out, "How are\n");

  const std::string qwen = "--tokenizer " + fixture_dir() + "qwen2.5/tokenizer.json";
  r = run_tokenize(qwen + " --file -", "Hello world\n");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[9707,1879,198]\n");

  const std::string chat =
      R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}])";
  r = run_tokenize(qwen + " --chat --text " + quoted(chat));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const auto tok = tokenizer("qwen2.5");
  const ChatEncoding enc =
      tok->chat_template().encode(*tok, {{"user", "Hi"}, {"assistant", "Yo"}}, false);
  EXPECT_EQ(r.out, json(enc.ids).dump() + "\n");
  r = run_tokenize(qwen + " --chat --assistant_mask --chat_template chatml --text " + quoted(chat));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(tok->decode(j["ids"].get<std::vector<int32_t>>()),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nYo<|im_end|>\n");
  EXPECT_EQ(j["assistant_mask"].get<std::vector<int>>().size(), j["ids"].size());
}

TEST(TokenizeCommand, BadInputIsExitCodeTwoWithOneLine) {
  if (!have_trainer_bin()) GTEST_SKIP() << "trainer_bin not built";
  const std::string qwen = "--tokenizer " + fixture_dir() + "qwen2.5";
  const std::vector<std::pair<CommandResult, std::string>> cases = {
      {run_tokenize(qwen), "--text or --file"},
      {run_tokenize(qwen + " --text a --file b"), "excludes"},
      {run_tokenize("--tokenizer /no/such/dir --text a"), "/no/such/dir"},
      {run_tokenize(qwen + " --decode --text '[1, \"x\"]'"), "not an integer"},
      {run_tokenize(qwen + " --decode --text '[999999999]'"), "out of range"},
      {run_tokenize(qwen + " --chat --text '{\"role\": 1}'"), "\"messages\" list"},
      {run_tokenize(qwen + " --chat --text '[{\"content\": \"x\"}]'"), "string \"role\""},
      {run_tokenize(qwen + " --file -", "bad \xff byte"), "byte 4"},
      {run_tokenize("--tokenizer " + fixture_dir() + "smollm2 --chat --text '[]'"),
       "--chat_template NAME"},
      {run_tokenize(qwen + " --no_such_flag"), "no_such_flag"},
  };
  for (const auto& [r, needle] : cases) {
    EXPECT_EQ(r.exit_code, 2) << needle << ": " << r.err;
    EXPECT_EQ(r.out, "") << needle;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

TEST(Unicode, ByteLevelMapIsGpt2s) {
  EXPECT_EQ(unicode::byte_to_char()[' '], U'\u0120');   // "Ġ"
  EXPECT_EQ(unicode::byte_to_char()['\n'], U'\u010A');  // "Ċ"
  EXPECT_EQ(unicode::byte_to_char()['A'], U'A');
  EXPECT_EQ(unicode::byte_to_char()[0xAD], U'\u0143');
  for (int b = 0; b < 256; ++b) EXPECT_EQ(unicode::char_to_byte(unicode::byte_to_char()[b]), b);
  EXPECT_EQ(unicode::char_to_byte(U'\u0144'), -1);
}

TEST(Unicode, PythonStripUsesStrIsspace) {
  EXPECT_EQ(unicode::python_strip("  \t\n x y \x1c\x1f\u3000\u2028"), "x y");
  EXPECT_EQ(unicode::python_strip("\u200bx\u200b"), "\u200bx\u200b");  // ZWSP is not space
  EXPECT_EQ(unicode::python_strip(""), "");
  EXPECT_EQ(unicode::python_strip(" \u00a0 "), "");
}

}  // namespace
}  // namespace leantune
