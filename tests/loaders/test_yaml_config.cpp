// YAML configs (loaders/yaml_config.h): the core-schema typing of plain scalars (a TRL YAML's
// `learning_rate: 2e-5` is a number, `bf16: true` a bool, a quoted "42" a string), sequences and
// nested mappings, the refusals (syntax errors, duplicate keys, aliases, several documents) each
// naming the file, line and column, and a YAML config applied to a command's options as
// `--config x.yaml` does, flags still overriding it.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "engine/check.h"
#include "loaders/options.h"
#include "loaders/yaml_config.h"
#include "testing/testing.h"

namespace leantune {
namespace {

std::string error_of(const std::string& text) {
  try {
    parse_yaml_config(text, "c.yaml");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput) << e.what();
    return e.what();
  }
  return "";
}

TEST(YamlConfig, PlainScalarsTakeTheCoreSchema) {
  const nlohmann::json j = parse_yaml_config(
      "a: ~\nb: null\nc:\nd: true\ne: False\nf: 42\ng: -7\nh: 0x1f\ni: 0o17\nj: 2e-5\nk: 1.5\n"
      "l: .inf\nm: -.inf\nn: .nan\no: all-linear\np: '42'\nq: \"true\"\nr: yes\ns: 1_000\n",
      "c.yaml");
  EXPECT_TRUE(j["a"].is_null());
  EXPECT_TRUE(j["b"].is_null());
  EXPECT_TRUE(j["c"].is_null());
  EXPECT_EQ(j["d"], true);
  EXPECT_EQ(j["e"], false);
  EXPECT_EQ(j["f"], 42);
  EXPECT_TRUE(j["f"].is_number_integer());
  EXPECT_EQ(j["g"], -7);
  EXPECT_EQ(j["h"], 31);
  EXPECT_EQ(j["i"], 15);
  EXPECT_DOUBLE_EQ(j["j"].get<double>(), 2e-5);
  EXPECT_DOUBLE_EQ(j["k"].get<double>(), 1.5);
  EXPECT_TRUE(std::isinf(j["l"].get<double>()) && j["l"].get<double>() > 0);
  EXPECT_TRUE(std::isinf(j["m"].get<double>()) && j["m"].get<double>() < 0);
  EXPECT_TRUE(std::isnan(j["n"].get<double>()));
  EXPECT_EQ(j["o"], "all-linear");
  EXPECT_EQ(j["p"], "42");     // quoted: a string
  EXPECT_EQ(j["q"], "true");   // quoted: a string
  EXPECT_EQ(j["r"], "yes");    // YAML 1.1's booleans are strings in 1.2's core schema
  EXPECT_EQ(j["s"], "1_000");  // and so are its digit separators
}

TEST(YamlConfig, SequencesAndMappings) {
  const nlohmann::json j = parse_yaml_config(
      "# a TRL-style config\nlora_target_modules: [q_proj, v_proj]\nreward_funcs:\n"
      "  - accuracy_reward\n  - format_reward\nchat_template_kwargs: {enable_thinking: false}\n",
      "c.yaml");
  EXPECT_EQ(j["lora_target_modules"], (nlohmann::json{"q_proj", "v_proj"}));
  EXPECT_EQ(j["reward_funcs"], (nlohmann::json{"accuracy_reward", "format_reward"}));
  EXPECT_EQ(j["chat_template_kwargs"], (nlohmann::json{{"enable_thinking", false}}));
  EXPECT_EQ(parse_yaml_config("", "c.yaml"), nlohmann::json::object());
  EXPECT_EQ(parse_yaml_config("# nothing\n", "c.yaml"), nlohmann::json::object());
}

TEST(YamlConfig, RefusalsNameTheFileLineAndColumn) {
  EXPECT_NE(error_of("a: 1\nb: [1, 2\n").find("c.yaml:"), std::string::npos);
  EXPECT_NE(error_of("a: 1\na: 2\n").find("c.yaml:2:1: duplicate key 'a'"), std::string::npos)
      << error_of("a: 1\na: 2\n");
  EXPECT_NE(error_of("a: &x 1\nb: *x\n").find("not supported"), std::string::npos);
  EXPECT_NE(error_of("a: 1\n---\nb: 2\n").find("one YAML document"), std::string::npos);
  EXPECT_NE(error_of("[1, 2]: 3\n").find("a YAML key must be a string"), std::string::npos);
  std::string deep;
  for (int i = 0; i < 70; ++i) deep += "[";
  EXPECT_NE(error_of(deep).find("c.yaml"), std::string::npos);
}

TEST(YamlConfig, ConfigFileSetsOptionsAndFlagsOverrideIt) {
  const std::string path = testing::temp_dir("yaml_config") + "/sft.yaml";
  {
    std::ofstream f(path);
    f << "learning_rate: 2.0e-5\nmax_steps: 7\npacking: true\nnames: [a, b]\nkind: x\n";
  }
  auto options = [] {
    Options o("cmd");
    o.add_float("learning_rate", 1e-3, "lr", 0.0);
    o.add_int("max_steps", -1, "steps");
    o.add_bool("packing", false, "packing");
    o.add_string_list("names", {}, "names");
    o.add_string("kind", "y", "kind");
    return o;
  };
  Options o = options();
  ASSERT_TRUE(o.parse({"--config", path, "--max_steps", "9"}));
  EXPECT_DOUBLE_EQ(o.get_float("learning_rate"), 2e-5);
  EXPECT_EQ(o.get_int("max_steps"), 9);  // the flag wins
  EXPECT_TRUE(o.get_bool("packing"));
  EXPECT_EQ(o.get_string_list("names"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(o.get_string("kind"), "x");
  {
    std::ofstream f(path);
    f << "max_steps: seven\n";
  }
  Options bad = options();
  EXPECT_THROW(bad.parse({"--config", path}), Error);
}

}  // namespace
}  // namespace leantune
