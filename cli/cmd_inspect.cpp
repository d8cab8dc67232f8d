// `trainer_bin inspect PATH`: what a checkpoint holds, validated.
//
// PATH is a .safetensors file, a model.safetensors.index.json, a config.json, or an HF model
// folder (config.json and/or model.safetensors / a sharded index). Prints the name, dtype and
// shape of every tensor (file offset order for one file, sorted names for a folder), the
// parameter and byte totals, and the config summary when a config is present. Every file is
// fully validated first, so a bad file produces one error line naming it and exit code 2
// (thrown as Error kInput and reported by main.cpp).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "engine/check.h"
#include "loaders/fs_util.h"
#include "loaders/model_config.h"
#include "loaders/safetensors.h"

namespace leantune {
namespace {

std::string human(double n) {
  char buf[32];
  if (n >= 1e9) {
    std::snprintf(buf, sizeof(buf), "%.2fB", n / 1e9);
  } else if (n >= 1e6) {
    std::snprintf(buf, sizeof(buf), "%.2fM", n / 1e6);
  } else if (n >= 1e3) {
    std::snprintf(buf, sizeof(buf), "%.2fK", n / 1e3);
  } else {
    std::snprintf(buf, sizeof(buf), "%.0f", n);
  }
  return buf;
}

void print_entry(const SafetensorsEntry& e, size_t width) {
  std::printf("  %-*s  %-7s  %s\n", static_cast<int>(width), printable(e.name, 1000).c_str(),
              dtype_safetensors_name(e.dtype), shape_str(e.shape).c_str());
}

void print_store(const TensorStore& store) {
  for (const auto& f : store.files()) {
    std::printf("file: %s (%llu bytes, header %llu bytes, %zu tensors)\n", f->path().c_str(),
                static_cast<unsigned long long>(f->file_size()),
                static_cast<unsigned long long>(f->header_size()), f->entries().size());
    for (const auto& [k, v] : f->metadata()) {
      std::printf("  metadata %s = %s\n", printable(k).c_str(), printable(v).c_str());
    }
  }
  size_t width = 4;
  for (const auto& name : store.names()) width = std::max(width, printable(name, 1000).size());
  std::printf("tensors: %zu\n", store.size());
  std::printf("  %-*s  %-7s  %s\n", static_cast<int>(width), "name", "dtype", "shape");
  if (store.files().size() == 1) {
    for (const auto& e : store.files()[0]->entries()) print_entry(e, width);
  } else {
    for (const auto& name : store.names()) print_entry(store.entry(name), width);
  }
  const int64_t params = store.num_elements();
  std::printf("parameters: %lld (%s)\n", static_cast<long long>(params),
              human(static_cast<double>(params)).c_str());
  std::printf("bytes: %llu (%s)\n", static_cast<unsigned long long>(store.num_bytes()),
              human(static_cast<double>(store.num_bytes())).c_str());
}

int run_inspect(const std::vector<std::string>& args) {
  CLI::App app{"Validates and describes a safetensors file or an HF model folder.",
               "trainer_bin inspect"};
  std::string path;
  app.add_option("path", path,
                 "a .safetensors file, model.safetensors.index.json, config.json, or a model "
                 "folder")
      ->required();
  if (!parse_tool_args(app, args, "inspect")) return 0;

  namespace fs = std::filesystem;
  std::error_code ec;
  LT_CHECK_INPUT(fs::exists(path, ec), path, ": no such file or directory");
  std::optional<TensorStore> store;
  std::optional<ModelConfig> config;
  if (fs::is_directory(path, ec)) {
    const bool has_config = fs::exists(fs::path(path) / "config.json", ec);
    const bool has_weights = fs::exists(fs::path(path) / "model.safetensors", ec) ||
                             fs::exists(fs::path(path) / "model.safetensors.index.json", ec);
    LT_CHECK_INPUT(has_config || has_weights, path,
                   ": folder has no config.json, model.safetensors or "
                   "model.safetensors.index.json");
    if (has_weights) store = TensorStore::open(path);
    if (has_config) config = ModelConfig::load(path);
  } else if (path.ends_with(".json") && !path.ends_with(".index.json")) {
    config = ModelConfig::load(path);
  } else {
    store = TensorStore::open(path);
  }

  if (store) print_store(*store);
  if (config) {
    std::printf("config: %s\n", config->summary().c_str());
    if (store) {
      const int64_t expected = config->num_parameters();
      const int64_t actual = store->num_elements();
      std::printf("config parameter count %s the tensors (%lld vs %lld)\n",
                  expected == actual ? "matches" : "differs from", static_cast<long long>(expected),
                  static_cast<long long>(actual));
    }
  }
  return 0;
}

}  // namespace

int cmd_inspect(const std::vector<std::string>& args) { return run_inspect(args); }

}  // namespace leantune
