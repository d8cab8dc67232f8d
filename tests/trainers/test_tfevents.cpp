// TensorBoard event files (trainers/common/tfevents.h): CRC-32C test vectors, the bytes of
// TensorBoard's own encoder (tests/fixtures/gen_tensorboard_fixtures.py: golden.tfevents, read
// back by TensorBoard's EventAccumulator into golden.json), transformers' mapping of a log record
// to tags, the writer's file, and trainer_bin sft --report_to tensorboard read back by an
// independent decoder of the wire format that checks every record's checksums.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "testing/testing.h"
#include "trainers/common/tfevents.h"
#include "trainers/trainer_test_util.h"

namespace leantune {
namespace {

namespace fs = std::filesystem;

std::string fixture(const std::string& name) {
  return testing::read_file(std::string(LT_SOURCE_DIR) + "/tests/fixtures/tensorboard/" + name);
}

// --- an independent reader: TFRecord framing and the Event fields the tests look at ---------

struct ReadEvent {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::string tag;
  std::optional<float> simple_value;
  std::string text;  // the first string_val of a tensor value
};

uint64_t varint(const std::string& b, size_t& i) {
  uint64_t v = 0;
  for (int shift = 0; i < b.size(); shift += 7) {
    const auto c = static_cast<unsigned char>(b[i++]);
    v |= static_cast<uint64_t>(c & 0x7f) << shift;
    if ((c & 0x80) == 0) return v;
  }
  ADD_FAILURE() << "truncated varint";
  return v;
}

// Calls f(field, wire, payload) for each field of message b; fixed-width payloads are raw bytes.
template <class F>
void fields(const std::string& b, F f) {
  size_t i = 0;
  while (i < b.size()) {
    const uint64_t key = varint(b, i);
    const auto wire = static_cast<int>(key & 7);
    const auto field = static_cast<int>(key >> 3);
    std::string payload;
    if (wire == 0) {
      const uint64_t v = varint(b, i);
      payload.assign(reinterpret_cast<const char*>(&v), 8);
    } else if (wire == 1 || wire == 5) {
      const size_t n = wire == 1 ? 8 : 4;
      ASSERT_LE(i + n, b.size());
      payload = b.substr(i, n);
      i += n;
    } else {
      ASSERT_EQ(wire, 2);
      const uint64_t n = varint(b, i);
      ASSERT_LE(i + n, b.size());
      payload = b.substr(i, n);
      i += n;
    }
    f(field, wire, payload);
  }
}

template <class T>
T raw(const std::string& p) {
  T v{};
  std::memcpy(&v, p.data(), sizeof(T));
  return v;
}

ReadEvent decode_event(const std::string& b) {
  ReadEvent e;
  fields(b, [&](int f, int, const std::string& p) {
    if (f == 1) e.wall_time = raw<double>(p);
    if (f == 2) e.step = raw<int64_t>(p);
    if (f == 3) e.file_version = p;
    if (f != 5) return;
    fields(p, [&](int sf, int, const std::string& value) {
      ASSERT_EQ(sf, 1);
      fields(value, [&](int vf, int, const std::string& q) {
        if (vf == 1) e.tag = q;
        if (vf == 2) e.simple_value = raw<float>(q);
        if (vf == 8)
          fields(q, [&](int tf, int, const std::string& s) {
            if (tf == 8 && e.text.empty()) e.text = s;
          });
      });
    });
  });
  return e;
}

// Every record of an event file, each checksum checked.
std::vector<ReadEvent> read_events(const std::string& bytes) {
  std::vector<ReadEvent> out;
  size_t i = 0;
  while (i < bytes.size()) {
    EXPECT_LE(i + 12, bytes.size()) << "torn record header at " << i;
    if (i + 12 > bytes.size()) break;
    const auto len = raw<uint64_t>(bytes.substr(i, 8));
    EXPECT_EQ(raw<uint32_t>(bytes.substr(i + 8, 4)), masked_crc32c(bytes.data() + i, 8));
    EXPECT_LE(i + 12 + len + 4, bytes.size()) << "torn record at " << i;
    if (i + 12 + len + 4 > bytes.size()) break;
    const std::string data = bytes.substr(i + 12, len);
    EXPECT_EQ(raw<uint32_t>(bytes.substr(i + 12 + len, 4)),
              masked_crc32c(data.data(), data.size()));
    out.push_back(decode_event(data));
    i += 12 + len + 4;
  }
  return out;
}

// --- tests ---------------------------------------------------------------------------------

TEST(TfEvents, Crc32cMatchesPublishedVectors) {
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);  // the CRC catalogue's check value
  const std::string zeros(32, '\0'), ones(32, '\xff');
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8a9136aau);  // RFC 3720, B.4
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62a8ab43u);
  std::string inc(32, '\0');
  for (int k = 0; k < 32; ++k) inc[k] = static_cast<char>(k);
  EXPECT_EQ(crc32c(inc.data(), 32), 0x46dd794eu);
  EXPECT_EQ(crc32c(inc.data() + 5, 27, crc32c(inc.data(), 5)), crc32c(inc.data(), 32));
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
}

// The cases of gen_tensorboard_fixtures.py, in its order.
TEST(TfEvents, EncoderWritesTensorBoardsBytes) {
  std::string file = tfrecord(event_file_version(1764000000.25));
  file += tfrecord(event_scalar(1764000001.5, 10, "train/loss", 0.6931f));
  file += tfrecord(event_scalar(1764000001.5, 10, "train/learning_rate", 0.0f));
  file += tfrecord(event_scalar(1764000002.0, 0, "eval/loss", -1.5f));
  file += tfrecord(event_scalar(1764000003.25, 300, "train/num_tokens", 123456789.0f));
  file +=
      tfrecord(event_scalar(1764000004.0, int64_t{1} << 40, "train/memory/peak_allocated", 3.5e9f));
  file += tfrecord(
      event_text(1764000005.0, 0, "args", "{\"learning_rate\": 2e-05, \"note\": \"caf\xc3\xa9\"}"));
  file += tfrecord(event_text(1764000006.0, 20, "train/phase", "eval"));
  const std::string golden = fixture("golden.tfevents");
  ASSERT_EQ(file.size(), golden.size());
  EXPECT_TRUE(file == golden) << "the bytes differ from TensorBoard's encoder";

  // What TensorBoard's EventAccumulator read from those bytes, seen by our reader too.
  const nlohmann::json back = nlohmann::json::parse(fixture("golden.json"));
  std::map<std::string, std::vector<std::pair<int64_t, double>>> scalars;
  std::map<std::string, std::vector<std::pair<int64_t, std::string>>> texts;
  const std::vector<ReadEvent> events = read_events(golden);
  ASSERT_EQ(events.size(), 8u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_EQ(events[0].wall_time, 1764000000.25);
  for (size_t k = 1; k < events.size(); ++k) {
    if (events[k].simple_value)
      scalars[events[k].tag].push_back({events[k].step, *events[k].simple_value});
    else
      texts[events[k].tag].push_back({events[k].step, events[k].text});
  }
  ASSERT_EQ(scalars.size(), back["scalars"].size());
  for (const auto& [tag, series] : back["scalars"].items()) {
    ASSERT_EQ(scalars[tag].size(), series.size()) << tag;
    for (size_t k = 0; k < series.size(); ++k) {
      EXPECT_EQ(scalars[tag][k].first, series[k][0].get<int64_t>()) << tag;
      EXPECT_EQ(scalars[tag][k].second, series[k][1].get<double>()) << tag;
    }
  }
  ASSERT_EQ(texts.size(), back["texts"].size());
  for (const auto& [tag, series] : back["texts"].items()) {
    ASSERT_EQ(texts[tag].size(), 1u) << tag;
    EXPECT_EQ(texts[tag][0].first, series[0][0].get<int64_t>()) << tag;
    EXPECT_EQ(texts[tag][0].second, series[0][1].get<std::string>()) << tag;
  }
}

TEST(TfEvents, RecordsMapAsTransformersTensorBoardCallback) {
  const nlohmann::json rec = {
      {"step", 7},
      {"loss", 0.5},
      {"eval_loss", 1.25},
      {"eval_rewards/accuracies", 0.75},
      {"test_accuracy", 1},
      {"rewards/chosen", -0.25},
      {"memory", {{"peak_allocated", 4096}, {"by_tag", {{"param", {{"current", 1024}}}}}}},
      {"skipped", true},
      {"steps_list", {1, 2}},
      {"phase", "eval"}};
  const TensorBoardRecord r = tensorboard_record(rec);
  EXPECT_EQ(r.step, 7);
  const std::vector<std::pair<std::string, double>> want = {
      {"eval/loss", 1.25},
      {"eval/rewards/accuracies", 0.75},
      {"train/loss", 0.5},
      {"train/memory/by_tag/param/current", 1024},
      {"train/memory/peak_allocated", 4096},
      {"train/rewards/chosen", -0.25},
      {"test/accuracy", 1}};
  EXPECT_EQ(r.scalars, want);
  ASSERT_EQ(r.texts.size(), 1u);
  EXPECT_EQ(r.texts[0].first, "train/phase");
  EXPECT_EQ(r.texts[0].second, "eval");
  EXPECT_EQ(tensorboard_record({{"loss", 1.0}}).step, 0);
}

TEST(TfEvents, WriterNamesItsFileAsSummaryWriterAndAppendsWholeRecords) {
  const std::string dir = testing::temp_dir("tfevents") + "/runs/x";
  double t = 1764000000.75;
  {
    TensorBoardWriter w(dir, [&t] { return t += 0.5; });
    char host[256] = {};
    ASSERT_EQ(gethostname(host, sizeof host - 1), 0);
    EXPECT_EQ(fs::path(w.path()).filename().string(), "events.out.tfevents.1764000001." +
                                                          std::string(host) + "." +
                                                          std::to_string(getpid()) + ".0");
    EXPECT_TRUE(w.log({{"step", 3}, {"loss", 2.5}, {"eval_loss", 3.0}, {"note", "hi"}}));
    EXPECT_TRUE(w.scalar("train/x", -1, 4));
  }
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path().string());
  ASSERT_EQ(files.size(), 1u);
  std::string want = tfrecord(event_file_version(1764000001.25));
  want += tfrecord(event_scalar(1764000001.75, 3, "eval/loss", 3.0f));
  want += tfrecord(event_scalar(1764000002.25, 3, "train/loss", 2.5f));
  want += tfrecord(event_text(1764000002.75, 3, "train/note", "hi"));
  want += tfrecord(event_scalar(1764000003.25, 4, "train/x", -1.0f));
  EXPECT_TRUE(testing::read_file(files[0]) == want);
}

TEST(TfEvents, LogFolderFollowsTransformers) {
  ::unsetenv("TENSORBOARD_LOGGING_DIR");
  const std::string d = tensorboard_log_dir("/tmp/out");
  EXPECT_EQ(d.rfind("/tmp/out/runs/", 0), 0u) << d;
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof host - 1), 0);
  const std::string tail = d.substr(std::strlen("/tmp/out/runs/"));
  // %b%d_%H-%M-%S_<host>, e.g. Dec07_17-30-05_node1
  ASSERT_EQ(tail.size(), 14 + 1 + std::strlen(host)) << tail;
  EXPECT_EQ(tail[5], '_');
  EXPECT_EQ(tail.substr(15), host);
  ::setenv("TENSORBOARD_LOGGING_DIR", "/tmp/tb_here", 1);
  EXPECT_EQ(tensorboard_log_dir("/tmp/out"), "/tmp/tb_here");
  ::unsetenv("TENSORBOARD_LOGGING_DIR");
}

// trainer_bin sft --report_to tensorboard: one event file under output_dir/runs/, the args text,
// and every loss of metrics.jsonl as train/loss at its step (rounded to float, as add_scalar).
TEST(TfEvents, SftReportsEveryLoggedLossToTensorBoard) {
  const std::string model = testing::make_tiny_model(testing::temp_dir("tb_model"));
  const std::string out = testing::temp_dir("tb_out");
  std::string log;
  ASSERT_EQ(
      testing::run_command(testing::trainer_bin() + " sft --model_name_or_path " + model +
                               " --dataset " + testing::small_dataset() + " --output_dir " + out +
                               " --max_length 64 --max_steps 3 --logging_steps 1 "
                               "--save_steps 0 --device cpu --report_to tensorboard",
                           &log),
      0)
      << log;
  std::vector<std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(out + "/runs"))
    if (e.is_regular_file()) files.push_back(e.path().string());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_NE(log.find("tensorboard: " + files[0]), std::string::npos) << log;
  const std::vector<ReadEvent> events = read_events(testing::read_file(files[0]));
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_EQ(events[1].tag, "args/text_summary");
  EXPECT_EQ(nlohmann::json::parse(events[1].text).value("max_steps", int64_t{0}), 3);
  std::map<int64_t, float> tb_loss;
  std::map<std::string, int> tags;
  for (const ReadEvent& e : events) {
    ++tags[e.tag];
    if (e.tag == "train/loss") tb_loss[e.step] = e.simple_value.value_or(-1);
  }
  const auto losses = testing::read_losses(out + "/metrics.jsonl");
  ASSERT_EQ(losses.size(), 3u);
  ASSERT_EQ(tb_loss.size(), losses.size());
  for (const auto& [step, loss] : losses) EXPECT_EQ(tb_loss[step], static_cast<float>(loss));
  for (const char* t :
       {"train/learning_rate", "train/grad_norm", "train/epoch", "train/memory/peak_allocated"})
    EXPECT_EQ(tags[t], 3) << t;
}

TEST(TfEvents, UnknownReportToIsOneLineListingTheSupportedValues) {
  std::string log;
  const int rc = testing::run_command(testing::trainer_bin() +
                                          " sft --report_to wandb --max_steps 1 --output_dir " +
                                          testing::temp_dir("tb_bad"),
                                      &log);
  EXPECT_EQ(rc, 2) << log;
  EXPECT_NE(log.find("option --report_to: 'wandb' is not supported (supported: none, "
                     "tensorboard, all)"),
            std::string::npos)
      << log;
}

}  // namespace
}  // namespace leantune
