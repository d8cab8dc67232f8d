#include <gtest/gtest.h>

#include <fstream>

#include "engine/check.h"
#include "loaders/options.h"
#include "testing/testing.h"

namespace leantune {
namespace {

Options make() {
  Options o("sft");
  o.add_int("max_length", 1024, "max tokens", 1);
  o.add_int_or_none("max_prompt_length", 512, "prompt cap", 1);
  o.add_bool("packing", false, "pack");
  o.add_float("learning_rate", 2e-5, "lr", 0.0);
  o.add_string("packing_strategy", "bfd", "strategy", {"bfd", "bfd_split", "wrapped"});
  o.add_string_list("lora_target_modules", {"q_proj", "v_proj"}, "targets");
  return o;
}

std::string input_error(Options& o, const std::vector<std::string>& args) {
  try {
    o.parse(args);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    return e.what();
  }
  return "";
}

TEST(Options, DefaultsFlagsAndForms) {
  Options o = make();
  ASSERT_TRUE(
      o.parse({"--max-length", "2048", "--packing", "--learning_rate=1e-4", "--lora_target_modules",
               "q_proj,k_proj,o_proj", "--max_prompt_length", "none"}));
  EXPECT_EQ(o.get_int("max_length"), 2048);
  EXPECT_TRUE(o.get_bool("packing"));
  EXPECT_DOUBLE_EQ(o.get_float("learning_rate"), 1e-4);
  EXPECT_EQ(o.get_string("packing_strategy"), "bfd");
  EXPECT_EQ(o.get_string_list("lora_target_modules"),
            (std::vector<std::string>{"q_proj", "k_proj", "o_proj"}));
  EXPECT_FALSE(o.get_int_or_none("max_prompt_length").has_value());
  EXPECT_TRUE(o.is_set("max_length"));
  EXPECT_FALSE(o.is_set("packing_strategy"));
}

TEST(Options, ConfigFileThenFlagsOverride) {
  std::string dir = testing::temp_dir("cfg");
  std::ofstream(dir + "/c.json")
      << R"({"max_length": 64, "packing": true, "packing_strategy": "wrapped"})";
  Options o = make();
  ASSERT_TRUE(o.parse({"--max_length", "128", "--config", dir + "/c.json"}));
  EXPECT_EQ(o.get_int("max_length"), 128);  // the flag wins even though it came first
  EXPECT_TRUE(o.get_bool("packing"));
  EXPECT_EQ(o.get_string("packing_strategy"), "wrapped");
}

TEST(Options, AnAliasSetsTheSameOption) {
  Options o = make();
  o.add_alias("pack", "packing");
  ASSERT_TRUE(o.parse({"--pack"}));
  EXPECT_TRUE(o.get_bool("packing"));
  EXPECT_TRUE(o.is_set("packing"));
  EXPECT_NE(o.help().find("(also --pack)"), std::string::npos);
  Options c = make();
  c.add_alias("pack", "packing");
  c.apply_config_text(R"({"pack": true})", "c.json");
  EXPECT_TRUE(c.get_bool("packing"));
  EXPECT_THROW(c.add_alias("max_length", "packing"), Error);  // an alias may not shadow an option
  EXPECT_THROW(c.add_alias("pack", "max_length"), Error);     // nor be declared twice
}

TEST(Options, EveryProblemIsOneLineNamingTheOption) {
  std::string dir = testing::temp_dir("bad");
  std::ofstream(dir + "/bad.json") << R"({"max_length": "long"})";
  std::ofstream(dir + "/notjson.json") << "{max_length: 3";
  std::ofstream(dir + "/u64.json") << R"({"max_length": 18446744073709551615})";
  std::ofstream(dir + "/big.json") << R"({"max_length": 1e30})";
  std::ofstream(dir + "/half.json") << R"({"max_length": 2.5})";
  std::ofstream(dir + "/dup.json") << R"({"max_length": 2, "packing": true, "max_length": 3})";
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  };
  const Case cases[] = {
      {{"--max_lenght", "3"}, "unknown option --max_lenght (did you mean --max_length?)"},
      {{"--max_length", "abc"}, "option --max_length expects an integer, got 'abc'"},
      {{"--max_length", "0"}, "option max_length must be an integer >= 1, got '0'"},
      {{"--max_length", "18446744073709551615"},
       "option --max_length must be an integer >= 1, got '18446744073709551615'"},
      {{"--learning_rate", "nan"}, "option learning_rate must be a finite number in [0"},
      {{"--config", dir + "/u64.json"},
       "u64.json: option max_length must be an integer >= 1, got 18446744073709551615"},
      {{"--config", dir + "/big.json"}, "option max_length must be an integer >= 1, got 1e30"},
      {{"--config", dir + "/half.json"}, "option max_length expects an integer, got 2.5"},
      {{"--config", dir + "/dup.json"}, "dup.json: duplicate key 'max_length'"},
      {{"--max_length"}, "option --max_length needs a value"},
      {{"--packing", "maybe"}, "option --packing expects true or false"},
      {{"--learning_rate", "-1"}, "option learning_rate must be a finite number in [0"},
      {{"--packing_strategy", "best"}, "must be one of bfd, bfd_split, wrapped; got 'best'"},
      {{"--config", dir + "/bad.json"}, "bad.json: option max_length expects an integer"},
      {{"--config", dir + "/notjson.json"}, "notjson.json: invalid JSON config"},
      {{"--config", dir + "/missing.json"}, "missing.json"},
      {{"stray"}, "unexpected argument 'stray'"},
  };
  for (const Case& c : cases) {
    Options o = make();
    const std::string msg = input_error(o, c.args);
    EXPECT_NE(msg.find(c.expect), std::string::npos) << "got: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST(Options, HelpListsEveryOptionWithDefault) {
  Options o = make();
  EXPECT_FALSE(o.parse({"--help"}));
  const std::string h = o.help();
  for (const char* s :
       {"--max_length (an integer, default 1024)", "--packing (true or false, default false)",
        "--max_prompt_length (an integer or none, default 512)", "[bfd|bfd_split|wrapped]",
        "--lora_target_modules (a list of strings, default q_proj,v_proj)"})
    EXPECT_NE(h.find(s), std::string::npos) << s << "\n" << h;
}

}  // namespace
}  // namespace leantune
