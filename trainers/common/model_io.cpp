// Files that travel with a model folder (model_io.h). Each is copied with copy_file_atomic: a
// full disk leaves the destination's old file or none, never a torn one, and says which file
// failed and why.
#include "trainers/common/model_io.h"

#include <filesystem>

#include "engine/check.h"
#include "loaders/fs_util.h"

namespace leantune {

int copy_tokenizer_files(const std::string& src, const std::string& dst) {
  namespace fs = std::filesystem;
  fs::path s(src);
  if (fs::is_regular_file(s)) s = s.parent_path();
  LT_CHECK_INPUT(fs::exists(s / "tokenizer.json"), src, ": no tokenizer.json in this folder");
  std::error_code ec;
  fs::create_directories(dst, ec);
  LT_CHECK_INPUT(!ec, dst, ": cannot create folder: ", ec.message());
  int n = 0;
  for (const char* f :
       {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
        "merges.txt", "chat_template.jinja", "added_tokens.json", "generation_config.json"}) {
    if (!fs::exists(s / f)) continue;
    copy_file_atomic((s / f).string(), (fs::path(dst) / f).string());
    ++n;
  }
  return n;
}

}  // namespace leantune
