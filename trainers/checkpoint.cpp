#include "trainers/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "engine/check.h"
#include "loaders/fs_util.h"

namespace leantune {

namespace fs = std::filesystem;

namespace {
// fsync every regular file under dir, then dir itself.
void fsync_tree(const fs::path& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::FILE* f = std::fopen(e.path().c_str(), "rb");
    LT_CHECK_INPUT(f != nullptr, "cannot reopen ", e.path().string(), " to sync it");
    const int rc = ::fsync(fileno(f));
    std::fclose(f);
    LT_CHECK_INPUT(rc == 0, "fsync failed for ", e.path().string());
  }
  fsync_dir(dir.string());
}

bool is_complete(const fs::path& p) { return fs::exists(p / kCheckpointMarker); }
}  // namespace

std::string write_checkpoint(const std::string& output_dir, int64_t step,
                             const std::function<void(const std::string& dir)>& fill) {
  fs::create_directories(output_dir);
  const std::string name = "checkpoint-" + std::to_string(step);
  const fs::path final_path = fs::path(output_dir) / name;
  const fs::path tmp = fs::path(output_dir) / ("." + name + ".tmp-" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  fill(tmp.string());
  write_text_atomic((tmp / kCheckpointMarker).string(), std::to_string(step) + "\n");
  fsync_tree(tmp);
  if (fs::exists(final_path)) {
    // Move the old one aside first so that a complete checkpoint-N exists at every moment.
    const fs::path old = fs::path(output_dir) / ("." + name + ".old-" + std::to_string(::getpid()));
    fs::remove_all(old);
    fs::rename(final_path, old);
    fs::rename(tmp, final_path);
    fs::remove_all(old);
  } else {
    fs::rename(tmp, final_path);
  }
  fsync_dir(output_dir);
  return final_path.string();
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& output_dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  if (!fs::is_directory(output_dir)) return out;
  for (const auto& e : fs::directory_iterator(output_dir)) {
    const std::string n = e.path().filename().string();
    if (!e.is_directory() || n.rfind("checkpoint-", 0) != 0) continue;
    const std::string num = n.substr(11);
    if (num.empty() || !std::all_of(num.begin(), num.end(), ::isdigit)) continue;
    if (!is_complete(e.path())) continue;
    out.emplace_back(std::stoll(num), e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string resolve_checkpoint(const std::string& spec, const std::string& output_dir) {
  if (spec == "latest") {
    auto all = list_checkpoints(output_dir);
    LT_CHECK_INPUT(!all.empty(), "resume_from_checkpoint=latest: no complete checkpoint in ",
                   output_dir);
    return all.back().second;
  }
  LT_CHECK_INPUT(fs::is_directory(spec), "resume_from_checkpoint: ", spec, " is not a folder");
  LT_CHECK_INPUT(is_complete(spec), "resume_from_checkpoint: ", spec,
                 " is not a complete checkpoint (no ", kCheckpointMarker, " marker)");
  return spec;
}

void rotate_checkpoints(const std::string& output_dir, int64_t limit) {
  if (!fs::is_directory(output_dir)) return;
  for (const auto& e : fs::directory_iterator(output_dir)) {
    const std::string n = e.path().filename().string();
    const bool stale = n.rfind(".checkpoint-", 0) == 0 && (n.find(".tmp-") != std::string::npos ||
                                                           n.find(".old-") != std::string::npos);
    if (stale) fs::remove_all(e.path());
  }
  if (limit <= 0) return;
  auto all = list_checkpoints(output_dir);
  while (static_cast<int64_t>(all.size()) > limit) {
    fs::remove_all(all.front().second);
    all.erase(all.begin());
  }
}

}  // namespace leantune
