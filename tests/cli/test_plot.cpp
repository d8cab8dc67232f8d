// trainer_bin plot's charts (cli/plot.h) from hand-built metrics records: which chart each metric
// lands in, the training and evaluation series, memory by tag in GiB, and the file reader's
// handling of malformed and torn records.
#include <gtest/gtest.h>

#include <fstream>

#include "cli/plot.h"
#include "engine/check.h"
#include "testing/testing.h"

namespace leantune {
namespace {

const PlotChart* chart(const std::vector<PlotChart>& charts, const std::string& title) {
  for (const PlotChart& c : charts)
    if (c.title == title) return &c;
  return nullptr;
}
const PlotSeries* series(const PlotChart* c, const std::string& name) {
  if (c == nullptr) return nullptr;
  for (const PlotSeries& s : c->series)
    if (s.name == name) return &s;
  return nullptr;
}

TEST(Plot, MetricsLandInTheirCharts) {
  const double gib = 1024.0 * 1024.0 * 1024.0;
  std::vector<nlohmann::json> recs = {
      {{"step", 1},
       {"epoch", 0.5},
       {"loss", 0.9},
       {"learning_rate", 1e-4},
       {"grad_norm", 2.0},
       {"tokens_per_second", 100.0},
       {"num_tokens", 64},
       {"rewards/chosen", 0.1},
       {"rewards/accuracies", 0.5},
       {"entropy", 3.0},
       {"memory",
        {{"peak_allocated", 2 * gib},
         {"by_tag", {{"param", {{"current", gib}}}, {"grad", {{"current", 0}}}}}}}},
      {{"step", 2}, {"eval_loss", 0.8}, {"eval_rewards/accuracies", 0.75}, {"eval_runtime", 1.0}},
      {{"step", 2}, {"loss", 0.7}, {"learning_rate", 5e-5}, {"rewards/chosen", 0.3}}};
  const std::vector<PlotChart> charts = metrics_charts(recs);
  ASSERT_GE(charts.size(), 7u);
  EXPECT_EQ(charts[0].title, "loss");
  EXPECT_EQ(charts[1].title, "learning_rate");
  EXPECT_EQ(charts[2].title, "grad_norm");
  EXPECT_EQ(charts[3].title, "tokens/s");
  EXPECT_EQ(charts[4].title, "memory (GiB)");
  const PlotSeries* loss = series(chart(charts, "loss"), "loss");
  const PlotSeries* eval_loss = series(chart(charts, "loss"), "eval_loss");
  ASSERT_TRUE(loss && eval_loss);
  EXPECT_EQ(loss->points, (std::vector<std::pair<double, double>>{{1, 0.9}, {2, 0.7}}));
  EXPECT_FALSE(loss->dashed);
  EXPECT_TRUE(eval_loss->dashed);
  EXPECT_EQ(eval_loss->points, (std::vector<std::pair<double, double>>{{2, 0.8}}));
  const PlotChart* rewards = chart(charts, "rewards");
  ASSERT_NE(rewards, nullptr);
  EXPECT_EQ(rewards->series.size(), 3u);  // chosen, accuracies, eval accuracies
  ASSERT_NE(series(rewards, "eval_rewards/accuracies"), nullptr);
  EXPECT_TRUE(series(rewards, "eval_rewards/accuracies")->dashed);
  const PlotChart* mem = chart(charts, "memory (GiB)");
  ASSERT_NE(series(mem, "param"), nullptr);
  EXPECT_EQ(series(mem, "param")->points[0].second, 1.0);
  EXPECT_EQ(series(mem, "peak_allocated")->points[0].second, 2.0);
  EXPECT_EQ(series(mem, "grad"), nullptr);  // 0 at every logged step
  EXPECT_NE(chart(charts, "entropy"), nullptr);
  for (const char* gone : {"epoch", "num_tokens", "eval_runtime", "runtime", "step"})
    EXPECT_EQ(chart(charts, gone), nullptr) << gone;

  const std::string page = metrics_page(charts, "run <1>");
  EXPECT_NE(page.find("<h1>run &lt;1&gt;</h1>"), std::string::npos);
  EXPECT_NE(page.find("data-chart=\"rewards\""), std::string::npos);
  EXPECT_NE(page.find("<title>eval_loss, step 2: 0.8</title>"), std::string::npos) << page;
  // Self-contained: nothing fetched.
  EXPECT_EQ(page.find("src="), std::string::npos);
  EXPECT_EQ(page.find("href="), std::string::npos);
  EXPECT_NE(metrics_page({}, "x").find("no logged metrics"), std::string::npos);
}

TEST(Plot, ReaderNamesTheBadLineAndLeavesATornLastOneOut) {
  const std::string dir = testing::temp_dir("plot");
  const std::string good = dir + "/m.jsonl";
  std::ofstream(good) << "{\"step\":1,\"loss\":1}\n\n{\"step\":2,\"loss\":0.5}\n{\"step\":3,\"lo";
  bool torn = false;
  EXPECT_EQ(read_metrics_file(good, &torn).size(), 2u);
  EXPECT_TRUE(torn);
  const std::string bad = dir + "/bad.jsonl";
  std::ofstream(bad) << "{\"step\":1}\nnot json\n{\"step\":2}\n";
  try {
    read_metrics_file(bad);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("bad.jsonl:2: not a JSON record"), std::string::npos)
        << e.what();
  }
  std::ofstream(bad) << "[1, 2]\n";
  EXPECT_THROW(read_metrics_file(bad), Error);
  EXPECT_THROW(read_metrics_file(dir + "/missing.jsonl"), Error);
}

}  // namespace
}  // namespace leantune
