// OptionTable (loaders/option_table.h): the declarations it makes (names, types, defaults from
// the struct, ranges, choices, aliases, --help order), the struct it reads back after parsing
// flags and JSON, and its composition (nested member structs, base classes, included tables,
// custom entries, declare-only groups).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine/check.h"
#include "loaders/option_table.h"

namespace leantune {
namespace {

enum class Mode { kAuto, kOn, kOff };

struct Inner {
  int64_t chunk = 7;
  std::string name = "in";
};

struct Base {
  double rate = 0.5;
};

struct Args : Base {
  bool flag = false;
  std::optional<bool> maybe;
  int count = 3;
  uint64_t seed = 42;
  std::optional<int64_t> limit = 1024;
  double ratio = 0.25;
  std::string kind = "a";
  std::vector<std::string> names = {"x"};
  Mode mode = Mode::kAuto;
  std::vector<int64_t> ids;
  Inner inner;
  bool extra = true;
};

const OptionTable<Inner>& inner_table() {
  static const OptionTable<Inner> t = OptionTable<Inner>()
                                          .integer("chunk", &Inner::chunk, "chunk", 0)
                                          .text("inner_name", &Inner::name, "inner name");
  return t;
}

const OptionTable<Base>& base_table() {
  static const OptionTable<Base> t =
      OptionTable<Base>().real("rate", &Base::rate, "rate", 0.0, 1.0);
  return t;
}

const OptionTable<Args>& extra_table() {
  static const OptionTable<Args> t = OptionTable<Args>().flag("extra", &Args::extra, "extra");
  return t;
}

const OptionTable<Args>& table() {
  using A = Args;
  static const OptionTable<A> t =
      OptionTable<A>()
          .flag("flag", &A::flag, "a flag")
          .flag_or_none("maybe", &A::maybe, "true, false or none")
          .integer("count", &A::count, "a count", 1, 10)
          .integer("seed", &A::seed, "a seed", 0)
          .integer_or_none("limit", &A::limit, "a limit", 1)
          .real_below("ratio", &A::ratio, "a ratio", 0.0, 1.0)
          .text("kind", &A::kind, "a kind", {"a", "b"})
          .alias("sort", "kind")
          .list("names", &A::names, "names")
          .choice("mode", &A::mode, "a mode",
                  {{"auto", Mode::kAuto}, {"true", Mode::kOn}, {"false", Mode::kOff}})
          .custom([](Options& o, const A&) { o.add_string_list("ids", {}, "token ids"); },
                  [](const Options& o, A& a) {
                    a.ids.clear();
                    for (const std::string& s : o.get_string_list("ids"))
                      a.ids.push_back(std::stoll(s));
                  },
                  "ids")
          .nested(&A::inner, inner_table())
          .base(base_table())
          .include(extra_table())
          .also([](Options& o) { o.add_int("group_only", 9, "declared by another group"); });
  return t;
}

TEST(OptionTable, DefaultsComeFromTheStruct) {
  Options o = table().options("cmd");
  ASSERT_TRUE(o.parse({}));
  const Args a = table().read(o);
  EXPECT_FALSE(a.flag);
  EXPECT_FALSE(a.maybe.has_value());
  EXPECT_EQ(a.count, 3);
  EXPECT_EQ(a.seed, 42u);
  EXPECT_EQ(a.limit, 1024);
  EXPECT_DOUBLE_EQ(a.ratio, 0.25);
  EXPECT_EQ(a.kind, "a");
  EXPECT_EQ(a.names, std::vector<std::string>{"x"});
  EXPECT_EQ(a.mode, Mode::kAuto);
  EXPECT_TRUE(a.ids.empty());
  EXPECT_EQ(a.inner.chunk, 7);
  EXPECT_EQ(a.inner.name, "in");
  EXPECT_DOUBLE_EQ(a.rate, 0.5);
  EXPECT_TRUE(a.extra);
  EXPECT_EQ(o.get_int("group_only"), 9);
  // --help lists them in the table's order, nested and base options where they stand.
  const std::string help = o.help();
  EXPECT_LT(help.find("--flag"), help.find("--mode"));
  EXPECT_LT(help.find("--mode"), help.find("--chunk"));
  EXPECT_LT(help.find("--chunk"), help.find("--rate"));
  EXPECT_LT(help.find("--rate"), help.find("--extra"));
  EXPECT_NE(help.find("also --sort"), std::string::npos) << help;
}

TEST(OptionTable, FlagsAndJsonFillTheStruct) {
  Options o = table().options("cmd");
  o.apply_json(nlohmann::json{{"count", 5}, {"inner_name", "json"}}, "test.json");
  ASSERT_TRUE(
      o.parse({"--flag",  "--maybe", "false",        "--seed",  "7",       "--limit", "none",
               "--ratio", "0.5",     "--sort",       "b",       "--names", "p,q",     "--mode",
               "false",   "--ids",   "3,5",          "--chunk", "0",       "--rate",  "1",
               "--extra", "false",   "--group_only", "2"}));
  const Args a = table().read(o);
  EXPECT_TRUE(a.flag);
  EXPECT_EQ(a.maybe, false);
  EXPECT_EQ(a.count, 5);
  EXPECT_EQ(a.seed, 7u);
  EXPECT_FALSE(a.limit.has_value());
  EXPECT_DOUBLE_EQ(a.ratio, 0.5);
  EXPECT_EQ(a.kind, "b");
  EXPECT_EQ(a.names, (std::vector<std::string>{"p", "q"}));
  EXPECT_EQ(a.mode, Mode::kOff);
  EXPECT_EQ(a.ids, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(a.inner.chunk, 0);
  EXPECT_EQ(a.inner.name, "json");
  EXPECT_DOUBLE_EQ(a.rate, 1.0);
  EXPECT_FALSE(a.extra);
}

TEST(OptionTable, RangesAndChoicesAreOptionsErrors) {
  for (const std::vector<std::string>& bad : {std::vector<std::string>{"--count", "11"},
                                              {"--ratio", "1"},
                                              {"--kind", "c"},
                                              {"--mode", "sometimes"},
                                              {"--limit", "0"},
                                              {"--rate", "2"},
                                              {"--chunk", "-1"}}) {
    Options o = table().options("cmd");
    EXPECT_THROW(o.parse(bad), Error) << bad[0] << " " << bad[1];
  }
}

TEST(OptionTable, NamesListsTheOptionsItDeclares) {
  EXPECT_EQ(table().names(), (std::vector<std::string>{"flag", "maybe", "count", "seed", "limit",
                                                       "ratio", "kind", "names", "mode", "ids"}));
  EXPECT_EQ(inner_table().names(), (std::vector<std::string>{"chunk", "inner_name"}));
}

TEST(OptionTable, ChoiceWithAnUnnamedDefaultIsAnInternalError) {
  Args d;
  d.mode = static_cast<Mode>(7);
  const OptionTable<Args> t =
      OptionTable<Args>(d).choice("mode", &Args::mode, "a mode", {{"auto", Mode::kAuto}});
  Options o("cmd");
  EXPECT_THROW(t.declare(o), Error);
}

}  // namespace
}  // namespace leantune
