#include "trainer_test_util.h"

#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/check.h"
#include "loaders/fs_util.h"
#include "loaders/model_config.h"
#include "models/decoder.h"
#include "testing/testing.h"
#include "trainers/common/model_io.h"
#include "trainers/sft/sft.h"

namespace leantune::testing {

std::string make_tiny_model(const std::string& dir, uint64_t seed) {
  DecoderModel m(ModelConfig::load(fixture_path("trainer/tiny_config.json")), Device::cpu(),
                 DType::kF32);
  m.init_random(seed);
  m.save(dir, DType::kF32);
  copy_tokenizer_files(std::string(LT_SOURCE_DIR) + "/data/embedded", dir);
  return dir;
}

std::string small_dataset() { return fixture_path("trainer/stories_small.jsonl"); }

Options tiny_sft_options(const std::string& model, const std::string& out,
                         const std::vector<std::string>& extra) {
  Options o = sft_options();
  std::vector<std::string> args = {"--model_name_or_path", model,          "--dataset",
                                   small_dataset(),        "--output_dir", out};
  const std::pair<const char*, const char*> defaults[] = {
      {"--max_length", "64"},      {"--logging_steps", "1"}, {"--save_steps", "0"},
      {"--learning_rate", "1e-3"}, {"--seed", "3"},          {"--device", "cpu"}};
  for (const auto& [flag, value] : defaults) {
    args.push_back(flag);
    args.push_back(value);
  }
  args.insert(args.end(), extra.begin(), extra.end());
  LT_CHECK(o.parse(args), "tiny_sft_options: the options did not parse");
  return o;
}

std::string trainer_bin() { return std::string(LT_BINARY_DIR) + "/trainer_bin"; }

int run_command(const std::string& cmd, std::string* out) {
  std::FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) text.append(buf, n);
  const int status = ::pclose(p);
  if (out) *out = text;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::vector<std::pair<int64_t, double>> read_losses(const std::string& path) {
  std::vector<std::pair<int64_t, double>> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out.emplace_back(j["step"].get<int64_t>(), j["loss"].get<double>());
  }
  return out;
}

std::string read_file(const std::string& path) { return read_text_file(path); }

}  // namespace leantune::testing
