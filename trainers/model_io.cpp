#include "trainers/model_io.h"

#include <filesystem>

#include "engine/check.h"

namespace leantune {

int copy_tokenizer_files(const std::string& src, const std::string& dst) {
  namespace fs = std::filesystem;
  fs::path s(src);
  if (fs::is_regular_file(s)) s = s.parent_path();
  LT_CHECK_INPUT(fs::exists(s / "tokenizer.json"), src, ": no tokenizer.json in this folder");
  fs::create_directories(dst);
  int n = 0;
  for (const char* f :
       {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
        "merges.txt", "chat_template.jinja", "added_tokens.json", "generation_config.json"}) {
    if (!fs::exists(s / f)) continue;
    std::error_code ec;
    fs::copy_file(s / f, fs::path(dst) / f, fs::copy_options::overwrite_existing, ec);
    LT_CHECK_INPUT(!ec, "cannot copy ", (s / f).string(), " to ", dst, ": ", ec.message());
    ++n;
  }
  return n;
}

}  // namespace leantune
