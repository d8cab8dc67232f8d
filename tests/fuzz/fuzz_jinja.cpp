// Fuzz target for the Jinja2 template parser and interpreter (loaders/jinja): arbitrary bytes
// are parsed as a chat template and rendered with a fixed conversation (system, user,
// assistant with a tool call, tool reply; tools; special tokens). Parsing and rendering must
// either succeed or throw Error of kind kInput whose one-line message starts with
// "fuzz.jinja:<line>:<col>: ". Anything else -- a crash, a sanitizer report, a hang caught by
// libFuzzer's -timeout, another exception, an internal Error, a multi-line message -- aborts.
//
// Two builds from this file (tests/loaders/jinja.cmake):
//   - fuzz_jinja: libFuzzer + ASan + UBSan, only with clang and LEANTUNE_FUZZ=ON:
//       CXX=clang++ CC=clang cmake -S . -B build-fuzz -DLEANTUNE_FUZZ=ON -DLEANTUNE_CUDA=OFF
//       cmake --build build-fuzz --target fuzz_jinja
//       build-fuzz/fuzz_jinja -max_total_time=600 -max_len=4096 -timeout=10  (one command line)
//         -dict=tests/fuzz/jinja.dict CORPUS_COPY tests/fuzz/corpus/jinja
//   - fuzz_jinja_corpus: the plain corpus driver of fuzz_corpus_main.h (built with ASan + UBSan)
//     over the committed corpus: good_* templates must render the conversation; bad_* must be
//     rejected (malformed templates, and chat templates that concatenate the content of the
//     assistant's tool-call message, which has none, as Jinja2 rejects them too).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "engine/check.h"
#include "loaders/jinja/interpreter.h"
#include "tests/fuzz/fuzz_corpus_main.h"

namespace {

[[noreturn]] void fail(const char* what, std::string_view input, const char* detail = "") {
  std::fprintf(stderr, "fuzz_jinja: %s on input of %zu bytes %s\n", what, input.size(), detail);
  std::abort();
}

const leantune::jinja::Value& context() {
  static const leantune::jinja::Value ctx =
      leantune::jinja::Value::from_json(nlohmann::ordered_json::parse(R"({
        "messages": [
          {"role": "system", "content": "  Be brief.  "},
          {"role": "user", "content": "Weather in Paris? 日本 🚀"},
          {"role": "assistant", "tool_calls": [{"type": "function", "function":
            {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
          {"role": "tool", "content": "{\"temp\": 21.5}"},
          {"role": "assistant", "content": "<think>x</think>21.5 °C"}],
        "tools": [{"type": "function", "function": {"name": "get_weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
        "documents": null, "add_generation_prompt": true,
        "bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>"})"));
  return ctx;
}

}  // namespace

// True when the template parses and renders; false when it is rejected as it must be.
bool fuzz_accepts(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  static const std::regex kWhere("^fuzz\\.jinja:[0-9]+:[0-9]+: ");
  std::tm now{};
  now.tm_year = 124;
  now.tm_mon = 6;
  now.tm_mday = 26;
  try {
    const leantune::jinja::Template t(text, "fuzz.jinja");
    const leantune::jinja::Rendered r = t.render(context(), now);
    for (const auto& [b, e] : r.generation_spans) {
      if (b > e) fail("generation span with begin > end", text);
    }
    return true;
  } catch (const leantune::Error& e) {
    const std::string msg = e.what();
    if (e.kind() != leantune::ErrorKind::kInput) fail("non-input error", text, msg.c_str());
    if (msg.find('\n') != std::string::npos) fail("multi-line error", text, msg.c_str());
    if (!std::regex_search(msg, kWhere)) fail("error without line:col", text, msg.c_str());
    return false;
  } catch (const std::exception& e) {
    fail("unexpected exception", text, e.what());
  }
}
