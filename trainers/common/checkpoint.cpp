// Checkpoint folders: listing, resolving, rotation, stale-file cleanup, trainer_state.json (see
// checkpoint.h).
#include "trainers/common/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "engine/check.h"
#include "loaders/fs_util.h"
#include "trainers/common/evaluation.h"

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

int64_t tree_bytes(const fs::path& dir) {
  int64_t n = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec))
    if (it->is_regular_file(ec)) n += static_cast<int64_t>(it->file_size(ec));
  return n;
}

// ".checkpoint-N.tmp-PID" / ".checkpoint-N.old-PID": kind "tmp" or "old" and the final name.
bool parse_stale_name(const std::string& n, std::string* kind, std::string* final_name) {
  if (n.rfind(".checkpoint-", 0) != 0) return false;
  for (const char* k : {"tmp", "old"}) {
    const size_t at = n.rfind(std::string(".") + k + "-");
    if (at == std::string::npos || at <= 1) continue;
    *kind = k;
    *final_name = n.substr(1, at - 1);
    return true;
  }
  return false;
}
}  // namespace

std::string rank_state_name(int rank) { return "rank_" + std::to_string(rank) + ".json"; }
std::string rank_optimizer_name(int rank) {
  return "optimizer_rank_" + std::to_string(rank) + ".safetensors";
}

std::string write_checkpoint(const std::string& output_dir, int64_t step,
                             const std::function<void(const std::string& dir)>& fill) {
  fs::create_directories(output_dir);
  const std::string name = "checkpoint-" + std::to_string(step);
  const fs::path final_path = fs::path(output_dir) / name;
  const fs::path tmp = fs::path(output_dir) / ("." + name + ".tmp-" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  try {
    fs::create_directories(tmp);
    fill(tmp.string());
    write_text_atomic((tmp / kCheckpointMarker).string(), std::to_string(step) + "\n");
    fsync_tree(tmp);
  } catch (const Error& e) {
    // A failed save (a full disk) must not leave its partial folder taking the space.
    std::error_code ec;
    fs::remove_all(tmp, ec);
    LT_THROW(e.kind(), "saving ", final_path.string(), ": ", e.what());
  } catch (const fs::filesystem_error& e) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    LT_THROW(ErrorKind::kInput, "saving ", final_path.string(), ": ", e.code().message(), " (",
             e.path1().string(), ")");
  }
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

StaleCleanup clean_stale_checkpoint_files(const std::string& output_dir) {
  StaleCleanup r;
  if (!fs::is_directory(output_dir)) return r;
  std::vector<fs::path> tmps, olds;
  for (const auto& e : fs::directory_iterator(output_dir)) {
    std::string kind, final_name;
    if (!parse_stale_name(e.path().filename().string(), &kind, &final_name)) continue;
    (kind == "old" ? olds : tmps).push_back(e.path());
  }
  // Old folders first: one may be the only complete copy of its checkpoint.
  for (const fs::path& p : olds) {
    std::string kind, final_name;
    parse_stale_name(p.filename().string(), &kind, &final_name);
    const fs::path final_path = fs::path(output_dir) / final_name;
    if (!fs::exists(final_path) && is_complete(p)) {
      fs::rename(p, final_path);
      ++r.restored;
      continue;
    }
    r.bytes += tree_bytes(p);
    fs::remove_all(p);
    ++r.removed;
  }
  for (const fs::path& p : tmps) {
    r.bytes += tree_bytes(p);
    fs::remove_all(p);
    ++r.removed;
  }
  if (r.removed + r.restored > 0) fsync_dir(output_dir);
  return r;
}

TrainerState parse_trainer_state(std::string_view text, const std::string& source) {
  const nlohmann::json j = parse_json_strict(text, source, 64);
  LT_CHECK_INPUT(j.is_object(), source, ": expected a JSON object, got ", printable(j.dump(), 60));
  auto count = [&](const char* key, bool required) -> int64_t {
    auto it = j.find(key);
    if (it == j.end()) {
      LT_CHECK_INPUT(!required, source, ": key '", key, "' is missing");
      return 0;
    }
    LT_CHECK_INPUT(
        it->is_number_integer() &&
            (it->is_number_unsigned() ? it->get<uint64_t>() <= INT64_MAX : it->get<int64_t>() >= 0),
        source, ": key '", key, "' must be a non-negative integer, got ",
        printable(it->dump(), 60));
    return it->get<int64_t>();
  };
  TrainerState st;
  st.global_step = count("global_step", true);
  st.optimizer_step = count("optimizer_step", true);
  st.num_tokens = count("num_tokens", false);
  st.consecutive_nonfinite = count("consecutive_nonfinite", false);
  st.skipped_steps = count("skipped_steps", false);
  if (j.contains("world_size")) st.world_size = count("world_size", false);
  LT_CHECK_INPUT(st.world_size >= 1, source, ": key 'world_size' must be at least 1");
  st.zero_stage = count("zero_stage", false);
  if (j.contains("cp_size")) st.cp_size = count("cp_size", false);
  LT_CHECK_INPUT(st.cp_size >= 1, source, ": key 'cp_size' must be at least 1");
  st.consolidated_from = count("consolidated_from", false);
  auto text_value = [&](const char* key, std::string& out) {
    auto it = j.find(key);
    if (it == j.end()) return;
    LT_CHECK_INPUT(it->is_string(), source, ": key '", key, "' must be a string, got ",
                   printable(it->dump(), 60));
    out = it->get<std::string>();
  };
  text_value("optim", st.optim);
  text_value("offload_optimizer", st.offload_optimizer);
  auto ds = j.find("data_state");
  LT_CHECK_INPUT(ds != j.end(), source, ": key 'data_state' is missing");
  LT_CHECK_INPUT(ds->is_object(), source, ": key 'data_state' must be an object, got ",
                 printable(ds->dump(), 60));
  st.data_state = *ds;
  if (j.contains("rng")) st.rng = parse_rng_state(j["rng"], source);
  if (auto it = j.find("save_only_model"); it != j.end()) {
    LT_CHECK_INPUT(it->is_boolean(), source, ": key 'save_only_model' must be true or false, got ",
                   printable(it->dump(), 60));
    st.save_only_model = it->get<bool>();
  }
  if (auto it = j.find("best"); it != j.end()) st.best = best_from_json(*it, source);
  if (auto it = j.find("lr_scheduler"); it != j.end()) st.lr_scheduler = *it;
  return st;
}

std::string checkpoint_state_path(const std::string& dir) {
  const std::string ours = dir + "/" + kCheckpointStateFile;
  const std::string older = dir + "/trainer_state.json";
  return fs::exists(ours) || !fs::exists(older) ? ours : older;
}

nlohmann::json parse_rng_state(const nlohmann::json& rng, const std::string& source) {
  LT_CHECK_INPUT(rng.is_object(), source, ": key 'rng' must be an object, got ",
                 printable(rng.dump(), 60));
  for (auto it = rng.begin(); it != rng.end(); ++it)
    LT_CHECK_INPUT(it->is_number_unsigned() || (it->is_number_integer() && it->get<int64_t>() >= 0),
                   source, ": rng key '", it.key(), "' must be a non-negative integer, got ",
                   printable(it->dump(), 60));
  return rng;
}

void rotate_checkpoints(const std::string& output_dir, int64_t limit, const std::string& keep) {
  if (!fs::is_directory(output_dir)) return;
  clean_stale_checkpoint_files(output_dir);
  if (limit <= 0) return;
  auto all = list_checkpoints(output_dir);
  // The kept checkpoint counts against the limit, but the newest always stays (transformers
  // keeps the best and the last, even with save_total_limit 1).
  const bool kept = !keep.empty() && std::any_of(all.begin(), all.end(), [&](const auto& c) {
    return fs::path(c.second) == fs::path(keep);
  });
  if (kept)
    all.erase(std::remove_if(all.begin(), all.end(),
                             [&](const auto& c) { return fs::path(c.second) == fs::path(keep); }),
              all.end());
  const int64_t room = std::max<int64_t>(1, limit - (kept ? 1 : 0));
  while (static_cast<int64_t>(all.size()) > room) {
    fs::remove_all(all.front().second);
    all.erase(all.begin());
  }
}

}  // namespace leantune
