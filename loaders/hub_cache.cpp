// Hub IDs resolved in the local Hugging Face cache (see hub_cache.h).
#include "loaders/hub_cache.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>

#include "engine/check.h"

namespace leantune {

namespace {

namespace fs = std::filesystem;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// huggingface_hub's repo ID rule: an optional namespace, then a name, of letters, digits, '-',
// '_' and '.', not starting or ending with '-' or '.'.
bool looks_like_repo_id(const std::string& s) {
  static const std::regex id(
      R"(^([A-Za-z0-9][A-Za-z0-9_.-]*[A-Za-z0-9_]/)?[A-Za-z0-9][A-Za-z0-9_.-]*[A-Za-z0-9_]$)");
  return s.size() <= 96 && std::regex_match(s, id) && s.find("..") == std::string::npos;
}

// models--Org--Name in the cache folder.
fs::path repo_folder(const std::string& id) {
  std::string folder = "models--" + id;
  for (size_t p = folder.find('/'); p != std::string::npos; p = folder.find('/'))
    folder.replace(p, 1, "--");
  return fs::path(hub_cache_dir()) / folder;
}

}  // namespace

bool in_hub_cache(const std::string& id) {
  std::error_code ec;
  return looks_like_repo_id(id) && fs::is_directory(repo_folder(id), ec);
}

std::string hub_cache_dir() {
  if (const std::string c = env("HF_HUB_CACHE"); !c.empty()) return c;
  if (const std::string h = env("HF_HOME"); !h.empty()) return (fs::path(h) / "hub").string();
  if (const std::string x = env("XDG_CACHE_HOME"); !x.empty())
    return (fs::path(x) / "huggingface" / "hub").string();
  return (fs::path(env("HOME")) / ".cache" / "huggingface" / "hub").string();
}

std::string resolve_model_path(const std::string& name_or_path, const std::string& option,
                               const std::string& revision) {
  std::error_code ec;
  if (name_or_path.empty() || fs::exists(name_or_path, ec)) return name_or_path;
  LT_CHECK_INPUT(looks_like_repo_id(name_or_path), "option --", option, ": '", name_or_path,
                 "' does not exist (neither a local path nor a Hub ID such as Qwen/Qwen2.5-0.5B)");
  LT_CHECK_INPUT(
      !revision.empty() && revision.find("..") == std::string::npos &&
          revision.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                     "0123456789._-/") == std::string::npos,
      "option --model_revision: '", revision, "' is not a branch, tag or commit name");
  const fs::path repo = repo_folder(name_or_path);
  const std::string fetch = "huggingface-cli download " + name_or_path +
                            (revision == "main" ? "" : " --revision " + revision);
  LT_CHECK_INPUT(fs::is_directory(repo, ec), "option --", option, ": '", name_or_path,
                 "' is not a local path and not in the Hugging Face cache (", repo.string(),
                 "); leantune does not download: run `", fetch, "` first");
  std::string commit = revision;
  std::ifstream ref(repo / "refs" / revision);
  if (ref) std::getline(ref, commit);
  const fs::path snapshot = repo / "snapshots" / commit;
  LT_CHECK_INPUT(!commit.empty() && fs::is_directory(snapshot, ec), "option --", option, ": '",
                 name_or_path, "' revision '", revision, "' is not in the Hugging Face cache (no ",
                 snapshot.string(), "); run `", fetch, "` first");
  return snapshot.string();
}

}  // namespace leantune
