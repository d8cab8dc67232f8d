// safetensors reader/writer and sharded store: bit-exact round trips for every dtype, the
// temp-file + rename write protocol (a mapped file keeps its old bytes), sharded folders, and
// a table of malformed files that must each give an Error of kind kInput naming the problem.
//
// This file is also compiled, with the loader and engine sources, into the sanitizer target
// loaders_test_safetensors_asan (tests/loaders/safetensors.cmake), so it uses no helper from
// tests/testing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/check.h"
#include "engine/device.h"
#include "engine/tensor.h"
#include "loaders/fs_util.h"
#include "loaders/safetensors.h"
#include "tests/testing/scratch_root.h"

namespace leantune {
namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& tag) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string id = std::string(info->test_suite_name()) + "." + info->name() + "_" + tag;
  for (char& c : id) {
    if (c == '/') c = '_';
  }
  const fs::path dir = testing::scratch_root("leantune_st_") / id;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::string read_bytes(const std::string& path) { return read_text_file(path); }

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A tensor whose bytes are a deterministic pseudo-random pattern (NaN payloads included).
Tensor patterned(const Shape& shape, DType dt, uint32_t seed) {
  Tensor t = Tensor::empty(shape, dt, Device::cpu(), MemTag::kOther);
  auto* p = static_cast<uint8_t*>(t.data_ptr());
  uint32_t s = seed * 2654435761u + 1;
  for (size_t i = 0; i < t.nbytes(); ++i) {
    s = s * 1664525u + 1013904223u;
    p[i] = static_cast<uint8_t>(s >> 24);
  }
  // bool holds only 0 or 1.
  if (dt == DType::kBool) {
    for (size_t i = 0; i < t.nbytes(); ++i) p[i] &= 1;
  }
  return t;
}

std::string tensor_bytes(const Tensor& t) {
  Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.nbytes());
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

// A file with a correct length prefix.
std::string st_file(const std::string& header, const std::string& data = "") {
  return le64(header.size()) + header + data;
}

// Runs fn and returns the Error of kind kInput it must throw.
std::string input_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput) << e.what();
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-leantune exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no error thrown";
  return "";
}

// ------------------------------------------------------------------------------- round trips

class SafetensorsDtype : public ::testing::TestWithParam<DType> {};

TEST_P(SafetensorsDtype, RoundTripIsBitIdenticalAndZeroCopy) {
  const DType dt = GetParam();
  const std::string dir = temp_dir(dtype_name(dt));
  const std::string path = dir + "/t.safetensors";
  const Tensor a = patterned({3, 5}, dt, 1);
  const Tensor b = patterned({7}, dt, 2);
  const Tensor scalar = patterned({}, dt, 3);
  const Tensor empty = Tensor::empty({0, 4}, dt, Device::cpu(), MemTag::kOther);
  save_safetensors(path, {{"a", a}, {"b", b}, {"scalar", scalar}, {"empty", empty}});

  auto f = SafetensorsFile::open(path);
  ASSERT_EQ(f->entries().size(), 4u);
  for (const auto& [name, src] : std::vector<std::pair<std::string, Tensor>>{
           {"a", a}, {"b", b}, {"scalar", scalar}, {"empty", empty}}) {
    const SafetensorsEntry* e = f->find(name);
    ASSERT_NE(e, nullptr) << name;
    EXPECT_EQ(e->dtype, dt);
    EXPECT_EQ(e->shape, src.shape());
    EXPECT_EQ(e->end - e->begin, src.nbytes());
    const Tensor t = f->tensor(name);
    EXPECT_EQ(t.dtype(), dt);
    EXPECT_EQ(t.shape(), src.shape());
    EXPECT_EQ(tensor_bytes(t), tensor_bytes(src)) << name;
  }
  // A view over the mapping, not a copy.
  const Tensor va = f->tensor("a");
  EXPECT_TRUE(va.storage()->is_external());
  const auto* base = reinterpret_cast<const uint8_t*>(va.data_ptr());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(base) % dtype_size(dt), 0u);
  EXPECT_EQ(f->find("missing"), nullptr);
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, SafetensorsDtype,
                         ::testing::Values(DType::kF64, DType::kF32, DType::kF16, DType::kBF16,
                                           DType::kI64, DType::kI32, DType::kI16, DType::kI8,
                                           DType::kU8, DType::kU16, DType::kU32, DType::kU64,
                                           DType::kBool, DType::kF8E4M3, DType::kF8E5M2),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(Safetensors, FileLayoutMatchesTheFormat) {
  const std::string path = temp_dir("x") + "/m.safetensors";
  save_safetensors(path,
                   {{"w8", patterned({3}, DType::kU8, 1)},
                    {"w64", patterned({2}, DType::kF64, 2)},
                    {"w16", patterned({5}, DType::kBF16, 3)}},
                   {{"format", "pt"}, {"note", "hello"}});
  const std::string bytes = read_bytes(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ((8 + n) % 8, 0u) << "header must be padded to a multiple of 8";
  EXPECT_EQ(bytes.size(), 8 + n + 3 + 16 + 10);
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.front(), '{');
  const auto j = nlohmann::json::parse(header);
  EXPECT_EQ(j["__metadata__"]["format"], "pt");
  // Larger elements first: f64, then bf16, then u8.
  EXPECT_EQ(j["w64"]["data_offsets"], nlohmann::json::array({0, 16}));
  EXPECT_EQ(j["w16"]["data_offsets"], nlohmann::json::array({16, 26}));
  EXPECT_EQ(j["w8"]["data_offsets"], nlohmann::json::array({26, 29}));
  EXPECT_EQ(j["w16"]["dtype"], "BF16");
  EXPECT_EQ(j["w16"]["shape"], nlohmann::json::array({5}));

  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f->metadata().at("note"), "hello");
  ASSERT_EQ(f->entries().size(), 3u);
  EXPECT_EQ(f->entries()[0].name, "w64");
  EXPECT_EQ(f->entries()[2].name, "w8");
  EXPECT_EQ(f->header_size(), n);
  EXPECT_EQ(f->data_size(), 29u);
}

TEST(Safetensors, StridedTensorsAreWrittenContiguousAndBitExact) {
  const std::string path = temp_dir("x") + "/s.safetensors";
  // Values above 2^53 would not survive a conversion through double.
  std::vector<int64_t> v(6);
  for (int i = 0; i < 6; ++i) v[i] = (int64_t{1} << 60) + i * 7 + 1;
  const Tensor m = Tensor::from_vector(v, {2, 3});
  const Tensor mt = m.transpose(0, 1);  // [3, 2], not contiguous
  ASSERT_FALSE(mt.is_contiguous());
  const Tensor col = m.narrow(1, 1, 2);  // [2, 2] with a row stride of 3
  save_safetensors(path, {{"t", mt}, {"col", col}});
  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f->tensor("t").shape(), (Shape{3, 2}));
  EXPECT_EQ(f->tensor("t").to_i64(), (std::vector<int64_t>{v[0], v[3], v[1], v[4], v[2], v[5]}));
  EXPECT_EQ(f->tensor("col").to_i64(), (std::vector<int64_t>{v[1], v[2], v[4], v[5]}));
}

TEST(SafetensorsCuda, DeviceTensorsAreSavedFromHostCopies) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::string path = temp_dir("x") + "/d.safetensors";
  std::vector<float> v(24);
  for (int i = 0; i < 24; ++i) v[i] = 0.25f * static_cast<float>(i) - 3.0f;
  const Tensor dev = Tensor::from_vector(v, {4, 6}, Device::cuda());
  save_safetensors(path, {{"d", dev}, {"dt", dev.transpose(0, 1)}});
  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f->tensor("d").to_f32(), v);
  std::vector<float> vt(24);
  for (int r = 0; r < 4; ++r) {
    for (int c = 0; c < 6; ++c) vt[c * 4 + r] = v[r * 6 + c];
  }
  EXPECT_EQ(f->tensor("dt").shape(), (Shape{6, 4}));
  EXPECT_EQ(f->tensor("dt").to_f32(), vt);
}

TEST(Safetensors, ViewsKeepTheMappingAliveAndConvertOnRequest) {
  const std::string path = temp_dir("x") + "/k.safetensors";
  save_safetensors(path, {{"x", Tensor::from_vector<float>({1.5f, -2.0f, 3.25f}, {3})}});
  Tensor view;
  {
    auto f = SafetensorsFile::open(path);
    view = f->tensor("x");
    const Tensor as_f64 = f->tensor("x", DType::kF64);
    EXPECT_EQ(as_f64.dtype(), DType::kF64);
    EXPECT_EQ(as_f64.to_f64(), (std::vector<double>{1.5, -2.0, 3.25}));
  }
  EXPECT_EQ(view.to_f32(), (std::vector<float>{1.5f, -2.0f, 3.25f}));
  // Writes to a view are private to this process: the file keeps its bytes.
  view.data<float>()[0] = 99.0f;
  EXPECT_EQ(SafetensorsFile::open(path)->tensor("x").to_f32()[0], 1.5f);
}

TEST(Safetensors, MisalignedTensorIsReturnedAsAlignedCopy) {
  // An f32 tensor at data offset 1: the u8 before it shifts it off a 4-byte boundary.
  const std::string header = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[1,9]}})";
  std::string data(9, '\0');
  data[0] = 7;
  const float vals[2] = {0.5f, -8.0f};
  std::memcpy(&data[1], vals, 8);
  std::string padded = header + std::string((8 - header.size() % 8) % 8, ' ');
  const std::string path = temp_dir("x") + "/mis.safetensors";
  write_bytes(path, st_file(padded, data));
  auto f = SafetensorsFile::open(path);
  const Tensor b = f->tensor("b");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data_ptr()) % 4, 0u);
  EXPECT_FALSE(b.storage()->is_external());
  EXPECT_EQ(b.to_f32(), (std::vector<float>{0.5f, -8.0f}));
  EXPECT_EQ(f->tensor("a").to_i64(), (std::vector<int64_t>{7}));
}

TEST(Safetensors, SavingOverAMappedFileLeavesTheOldMappingIntact) {
  const std::string path = temp_dir("x") + "/p.safetensors";
  save_safetensors(path, {{"w", Tensor::from_vector<float>({1, 2, 3, 4}, {4})}});
  auto old_file = SafetensorsFile::open(path);
  const Tensor old_view = old_file->tensor("w");
  save_safetensors(path, {{"w", Tensor::from_vector<float>({5, 6, 7, 8, 9}, {5})},
                          {"extra", Tensor::from_vector<int32_t>({42}, {1})}});
  EXPECT_EQ(old_view.to_f32(), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(old_file->tensor("w").to_f32(), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(old_file->find("extra"), nullptr);
  auto new_file = SafetensorsFile::open(path);
  EXPECT_EQ(new_file->tensor("w").to_f32(), (std::vector<float>{5, 6, 7, 8, 9}));
  EXPECT_EQ(new_file->tensor("extra").to_i64(), (std::vector<int64_t>{42}));
}

TEST(Safetensors, FailedWriteLeavesTheOldFileAndNoTempFile) {
  const std::string dir = temp_dir("x");
  const std::string path = dir + "/f.bin";
  write_text_atomic(path, "old contents");
  EXPECT_THROW(write_file_atomic(path,
                                 [](std::FILE* f) {
                                   std::fputs("half of the new", f);
                                   LT_THROW(ErrorKind::kInternal, "simulated failure");
                                 }),
               Error);
  EXPECT_EQ(read_text_file(path), "old contents");
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    ++files;
    EXPECT_EQ(e.path().filename(), "f.bin");
  }
  EXPECT_EQ(files, 1);
  const std::string msg = input_error([&] { write_text_atomic(dir + "/no/such/dir/x", "y"); });
  EXPECT_NE(msg.find(dir + "/no/such/dir/x"), std::string::npos) << msg;
  const std::string missing = input_error([&] { read_text_file(dir + "/absent.json"); });
  EXPECT_NE(missing.find("absent.json"), std::string::npos) << missing;
}

TEST(Safetensors, WriterRejectsBadNames) {
  const std::string path = temp_dir("x") + "/n.safetensors";
  const Tensor t = Tensor::from_vector<float>({1}, {1});
  EXPECT_NE(input_error([&] {
              save_safetensors(path, {{"a", t}, {"a", t}});
            }).find("twice"),
            std::string::npos);
  EXPECT_NE(input_error([&] {
              save_safetensors(path, {{"__metadata__", t}});
            }).find("__metadata__"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(path));
}

TEST(Safetensors, EmptyFileWithNoTensors) {
  const std::string path = temp_dir("x") + "/e.safetensors";
  save_safetensors(path, {});
  EXPECT_EQ(read_bytes(path), le64(8) + "{}      ");
  auto f = SafetensorsFile::open(path);
  EXPECT_TRUE(f->entries().empty());
  EXPECT_TRUE(f->metadata().empty());
  const std::string msg = input_error([&] { f->tensor("nope"); });
  EXPECT_NE(msg.find("nope"), std::string::npos);
  EXPECT_NE(msg.find(path), std::string::npos);
}

// ------------------------------------------------------------------------------- sharded

std::vector<std::pair<std::string, Tensor>> model_tensors() {
  std::vector<std::pair<std::string, Tensor>> t;
  for (int i = 0; i < 6; ++i) {
    t.emplace_back("model.layers." + std::to_string(i) + ".weight",
                   patterned({4, 4}, DType::kF32, 10 + i));  // 64 bytes each
  }
  t.emplace_back("model.norm.weight", patterned({4}, DType::kBF16, 99));
  return t;
}

TEST(TensorStore, ShardedSaveAndLoad) {
  const std::string dir = temp_dir("m");
  const auto tensors = model_tensors();
  // 136-byte shards: two 64-byte tensors each, the 8-byte norm joins the last one.
  save_model_tensors(dir, tensors, 136);
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors"));
  for (const char* s : {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                        "model-00003-of-00003.safetensors"}) {
    EXPECT_TRUE(fs::exists(dir + "/" + s)) << s;
  }
  const auto index = nlohmann::json::parse(read_text_file(dir + "/model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], 6 * 64 + 8);
  EXPECT_EQ(index["weight_map"].size(), 7u);
  EXPECT_EQ(index["weight_map"]["model.layers.0.weight"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["model.layers.3.weight"], "model-00002-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["model.norm.weight"], "model-00003-of-00003.safetensors");

  const TensorStore store = TensorStore::open(dir);
  EXPECT_EQ(store.files().size(), 3u);
  EXPECT_EQ(store.size(), 7u);
  std::vector<std::string> expected_names;
  for (const auto& [name, _] : tensors) expected_names.push_back(name);
  std::sort(expected_names.begin(), expected_names.end());
  EXPECT_EQ(store.names(), expected_names);
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(store.contains(name));
    EXPECT_EQ(store.entry(name).shape, t.shape());
    EXPECT_EQ(tensor_bytes(store.get(name)), tensor_bytes(t)) << name;
  }
  EXPECT_EQ(store.num_elements(), 6 * 16 + 4);
  EXPECT_EQ(store.num_bytes(), 6u * 64 + 8);
  EXPECT_EQ(
      SafetensorsFile::open(dir + "/model-00002-of-00003.safetensors")->metadata().at("format"),
      "pt");
  // The index file itself opens the same store.
  EXPECT_EQ(TensorStore::open(dir + "/model.safetensors.index.json").names(), expected_names);

  // Saving unsharded into the same folder removes the shards and the index.
  save_model_tensors(dir, tensors);
  EXPECT_TRUE(fs::exists(dir + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir + "/model-00001-of-00003.safetensors"));
  const TensorStore single = TensorStore::open(dir);
  EXPECT_EQ(single.files().size(), 1u);
  EXPECT_EQ(tensor_bytes(single.get("model.norm.weight")), tensor_bytes(tensors.back().second));
}

TEST(TensorStore, OversizedTensorGetsItsOwnShard) {
  const std::string dir = temp_dir("m");
  save_model_tensors(dir,
                     {{"small", patterned({2}, DType::kF32, 1)},
                      {"big", patterned({100}, DType::kF32, 2)},
                      {"tail", patterned({2}, DType::kF32, 3)}},
                     64);
  const auto index = nlohmann::json::parse(read_text_file(dir + "/model.safetensors.index.json"));
  EXPECT_EQ(index["weight_map"]["small"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["big"], "model-00002-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["tail"], "model-00003-of-00003.safetensors");
  EXPECT_EQ(TensorStore::open(dir).get("big").numel(), 100);
}

TEST(TensorStore, MissingShardIsAnInputError) {
  const std::string dir = temp_dir("m");
  save_model_tensors(dir, model_tensors(), 136);
  fs::remove(dir + "/model-00002-of-00003.safetensors");
  const std::string msg = input_error([&] { TensorStore::open(dir); });
  EXPECT_NE(msg.find("model-00002-of-00003.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;
}

TEST(TensorStore, TensorInTwoShardsIsAnInputError) {
  const std::string dir = temp_dir("m");
  const Tensor t = patterned({2}, DType::kF32, 1);
  save_safetensors(dir + "/a.safetensors", {{"x", t}, {"y", t}});
  save_safetensors(dir + "/b.safetensors", {{"x", t}, {"z", t}});
  write_text_atomic(dir + "/model.safetensors.index.json",
                    R"({"metadata":{"total_size":32},"weight_map":{"x":"a.safetensors",)"
                    R"("y":"a.safetensors","z":"b.safetensors"}})");
  const std::string msg = input_error([&] { TensorStore::open(dir); });
  EXPECT_NE(msg.find("'x' is in two shards"), std::string::npos) << msg;
}

TEST(TensorStore, InconsistentIndexesAreInputErrors) {
  const std::string dir = temp_dir("m");
  const Tensor t = patterned({2}, DType::kF32, 1);
  save_safetensors(dir + "/a.safetensors", {{"x", t}, {"w", t}});
  save_safetensors(dir + "/b.safetensors", {{"y", t}});
  const std::string index = dir + "/model.safetensors.index.json";
  struct Case {
    const char* json;
    const char* expect;
  };
  const Case cases[] = {
      {R"({"weight_map":{"x":"a.safetensors","w":"a.safetensors","y":"b.safetensors",)"
       R"("v":"a.safetensors"}})",
       "weight_map lists 'v' in shard 'a.safetensors' but that shard does not contain it"},
      {R"({"weight_map":{"x":"a.safetensors","y":"b.safetensors"}})", "tensor 'w' of shard"},
      {R"({"weight_map":{"x":"b.safetensors","w":"a.safetensors","y":"b.safetensors"}})",
       "weight_map puts 'x' in shard 'b.safetensors' but it is in"},
      {R"({"weight_map":{"x":"a.safetensors","x":"a.safetensors","y":"b.safetensors"}})",
       "duplicate key 'x'"},
      {R"({"weight_map":{"x":"../a.safetensors","y":"b.safetensors"}})",
       "not a file name inside the folder"},
      {R"({"weight_map":{"x":3}})", "not a file name"},
      {R"({"metadata":{}})", "no 'weight_map'"},
      {R"({"weight_map":[]})", "weight_map is not an object"},
      {R"([1,2])", "not a JSON object"},
      {R"({"weight_map":)", "invalid JSON"},
  };
  for (const auto& c : cases) {
    write_text_atomic(index, c.json);
    const std::string msg = input_error([&] { TensorStore::open(dir); });
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.json << " -> " << msg;
    EXPECT_NE(msg.find(index), std::string::npos) << msg;
  }
  write_text_atomic(
      index, R"({"weight_map":{"x":"a.safetensors","w":"a.safetensors","y":"b.safetensors"}})");
  EXPECT_EQ(TensorStore::open(dir).names(), (std::vector<std::string>{"w", "x", "y"}));
}

TEST(TensorStore, FolderWithoutWeightsOrMissingPath) {
  const std::string dir = temp_dir("m");
  EXPECT_NE(input_error([&] { TensorStore::open(dir); }).find("neither"), std::string::npos);
  EXPECT_NE(input_error([&] { TensorStore::open(dir + "/nothing"); }).find("no such file"),
            std::string::npos);
  const std::string msg = input_error([&] { SafetensorsFile::open(dir); });
  EXPECT_NE(msg.find(dir), std::string::npos) << msg;
}

// ------------------------------------------------------------------------------- malformed

struct BadFile {
  const char* name;
  std::string bytes;
  const char* expect;  // a fragment the error message must contain
};

std::string tensor_json(const std::string& name, const std::string& dtype, const std::string& shape,
                        const std::string& offsets) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
         ",\"data_offsets\":" + offsets + "}";
}

std::vector<BadFile> bad_files() {
  const std::string f32x2 = tensor_json("a", "F32", "[2]", "[0,8]");
  const std::string eight(8, 'x');
  return {
      {"empty_file", "", "too short"},
      {"seven_bytes", std::string(7, '\0'), "too short"},
      {"length_beyond_file", le64(100) + "{}", "exceeds the 2 bytes"},
      {"length_over_limit", le64(100'000'001) + "{}", "exceeds the limit"},
      {"length_u64_max", le64(~uint64_t{0}) + "{}", "exceeds the limit"},
      {"header_empty", le64(0), "does not begin with '{'"},
      {"header_not_brace", st_file("[{}]"), "does not begin with '{'"},
      {"header_leading_space", st_file(" {}"), "does not begin with '{'"},
      {"header_string", st_file("\"{}\""), "does not begin with '{'"},
      {"invalid_utf8_byte", st_file("{\"\xff\":1}"), "not valid UTF-8"},
      {"utf8_overlong", st_file("{\"\xc0\xaf\":1}"), "not valid UTF-8"},
      {"utf8_surrogate", st_file("{\"\xed\xa0\x80\":1}"), "not valid UTF-8"},
      {"utf8_truncated", st_file("{}\xe2\x82"), "not valid UTF-8"},
      {"json_truncated", st_file("{\"a\":"), "invalid JSON"},
      {"json_trailing_garbage", st_file("{} x"), "invalid JSON"},
      {"json_two_objects", st_file("{}{}"), "invalid JSON"},
      {"json_lone_surrogate_escape", st_file(R"({"\ud800":1})"), "invalid JSON"},
      {"padding_newline", st_file("{}\n"), "padding"},
      {"padding_tab", st_file("{}\t  "), "padding"},
      {"padding_nul", st_file(std::string("{}\0\0", 4)), "NUL byte"},
      {"nul_then_garbage", st_file(std::string("{}\0{\"a\":1}", 10)), "NUL byte"},
      {"nul_in_string", st_file(std::string("{\"a\0\":1}", 8)), "NUL byte"},
      {"duplicate_tensor", st_file("{" + f32x2 + "," + f32x2 + "}", eight), "duplicate key 'a'"},
      {"duplicate_key_in_entry",
       st_file(R"({"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})", eight),
       "duplicate key 'dtype'"},
      {"duplicate_metadata_key", st_file(R"({"__metadata__":{"k":"a","k":"b"}})"),
       "duplicate key 'k'"},
      {"metadata_non_string", st_file(R"({"__metadata__":{"k":1}})"), "not a string"},
      {"metadata_not_object", st_file(R"({"__metadata__":"x"})"), "not an object"},
      {"metadata_nested", st_file(R"({"__metadata__":{"k":{"a":"b"}}})"), "not a string"},
      {"nesting_too_deep", st_file(R"({"a":{"shape":[[[1]]]}})"), "nested deeper"},
      {"unknown_dtype", st_file("{" + tensor_json("a", "F128", "[2]", "[0,8]") + "}", eight),
       "unknown dtype 'F128'"},
      {"unknown_dtype_lowercase",
       st_file("{" + tensor_json("a", "f32", "[2]", "[0,8]") + "}", eight), "unknown dtype 'f32'"},
      {"dtype_not_string", st_file(R"({"a":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", eight),
       "dtype is 4, not a string"},
      {"shape_negative", st_file("{" + tensor_json("a", "F32", "[-2]", "[0,8]") + "}", eight),
       "shape[0] is -2"},
      {"shape_fraction", st_file("{" + tensor_json("a", "F32", "[2.5]", "[0,8]") + "}", eight),
       "shape[0] is 2.5"},
      {"shape_float_integral",
       st_file("{" + tensor_json("a", "F32", "[2.0]", "[0,8]") + "}", eight), "shape[0] is 2.0"},
      {"shape_string", st_file("{" + tensor_json("a", "F32", "[\"2\"]", "[0,8]") + "}", eight),
       "not a non-negative integer"},
      {"shape_not_array", st_file("{" + tensor_json("a", "F32", "2", "[0,8]") + "}", eight),
       "not an array"},
      {"shape_dim_beyond_int64",
       st_file("{" + tensor_json("a", "U8", "[9223372036854775808]", "[0,8]") + "}", eight),
       "too large"},
      {"shape_dim_beyond_u64",
       st_file("{" + tensor_json("a", "U8", "[18446744073709551616]", "[0,8]") + "}", eight),
       "not a non-negative integer"},
      {"shape_product_overflow",
       st_file("{" + tensor_json("a", "F32", "[4294967296,4294967296,2]", "[0,8]") + "}", eight),
       "overflows 64 bits"},
      {"shape_bytes_overflow",
       st_file("{" + tensor_json("a", "F64", "[4611686018427387904]", "[0,8]") + "}", eight),
       "overflows 64 bits"},
      {"empty_shape_product_overflow",
       st_file("{" + tensor_json("a", "F32", "[0,4294967296,4294967296]", "[0,0]") + "}"),
       "overflows 64 bits"},
      {"size_mismatch", st_file("{" + tensor_json("a", "F32", "[3]", "[0,8]") + "}", eight),
       "needs 12"},
      {"size_mismatch_dtype", st_file("{" + tensor_json("a", "F64", "[2]", "[0,8]") + "}", eight),
       "needs 16"},
      {"offsets_out_of_bounds",
       st_file("{" + tensor_json("a", "F32", "[2]", "[0,8]") + "}", "xxxx"), "out of bounds"},
      {"offsets_far_out_of_bounds",
       st_file(
           "{" + tensor_json("a", "U8", "[8]", "[18446744073709551607,18446744073709551615]") + "}",
           eight),
       "out of bounds"},
      {"offsets_overlap",
       st_file("{" + tensor_json("a", "F32", "[2]", "[0,8]") + "," +
                   tensor_json("b", "F32", "[2]", "[4,12]") + "}",
               std::string(12, 'x')),
       "overlap tensor 'a'"},
      {"offsets_same_range",
       st_file("{" + tensor_json("a", "F32", "[2]", "[0,8]") + "," +
                   tensor_json("b", "F32", "[2]", "[0,8]") + "}",
               std::string(16, 'x')),
       "overlap"},
      {"offsets_gap",
       st_file("{" + tensor_json("a", "F32", "[1]", "[0,4]") + "," +
                   tensor_json("b", "F32", "[1]", "[8,12]") + "}",
               std::string(12, 'x')),
       "gap of 4 bytes"},
      {"offsets_not_from_zero", st_file("{" + tensor_json("a", "F32", "[1]", "[4,8]") + "}", eight),
       "gap of 4 bytes"},
      {"trailing_bytes", st_file("{" + tensor_json("a", "F32", "[1]", "[0,4]") + "}", eight),
       "4 trailing bytes"},
      {"trailing_bytes_no_tensors", st_file("{}", "z"), "1 trailing bytes"},
      {"begin_after_end", st_file("{" + tensor_json("a", "F32", "[1]", "[8,4]") + "}", eight),
       "data_offsets [8, 4] end before begin"},
      {"offsets_arity_three", st_file("{" + tensor_json("a", "F32", "[2]", "[0,8,8]") + "}", eight),
       "not an array [begin, end]"},
      {"offsets_arity_one", st_file("{" + tensor_json("a", "F32", "[2]", "[8]") + "}", eight),
       "not an array [begin, end]"},
      {"offsets_negative", st_file("{" + tensor_json("a", "F32", "[2]", "[-8,0]") + "}", eight),
       "not non-negative integers"},
      {"offsets_float", st_file("{" + tensor_json("a", "F32", "[2]", "[0.0,8.0]") + "}", eight),
       "not non-negative integers"},
      {"offsets_number_overflow",
       st_file("{" + tensor_json("a", "F32", "[2]", "[0,1e400]") + "}", eight), "invalid JSON"},
      {"missing_dtype", st_file(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", eight),
       "has no 'dtype'"},
      {"missing_shape", st_file(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", eight),
       "has no 'shape'"},
      {"missing_offsets", st_file(R"({"a":{"dtype":"F32","shape":[2]}})", eight),
       "has no 'data_offsets'"},
      {"extra_key_in_entry",
       st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1}})", eight),
       "unknown key 'extra'"},
      {"entry_not_object", st_file(R"({"a":5})"), "is number, not an object"},
      {"entry_null", st_file(R"({"a":null})"), "is null, not an object"},
  };
}

class SafetensorsMalformed : public ::testing::TestWithParam<BadFile> {};

TEST_P(SafetensorsMalformed, GivesAnInputErrorNamingFileAndProblem) {
  const BadFile& bad = GetParam();
  const std::string msg = input_error([&] {
    parse_safetensors_buffer(reinterpret_cast<const uint8_t*>(bad.bytes.data()), bad.bytes.size(),
                             nullptr, "mem.safetensors");
  });
  EXPECT_NE(msg.find("mem.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find(bad.expect), std::string::npos) << "message: " << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;

  const std::string path = temp_dir(bad.name) + "/" + bad.name + ".safetensors";
  write_bytes(path, bad.bytes);
  const std::string file_msg = input_error([&] { SafetensorsFile::open(path); });
  EXPECT_NE(file_msg.find(path), std::string::npos) << file_msg;
  EXPECT_NE(file_msg.find(bad.expect), std::string::npos) << file_msg;
}

INSTANTIATE_TEST_SUITE_P(Cases, SafetensorsMalformed, ::testing::ValuesIn(bad_files()),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(SafetensorsMalformed, AtLeastThirtyHandcraftedCases) { EXPECT_GE(bad_files().size(), 30u); }

TEST(SafetensorsHeader, AcceptsValidVariants) {
  std::map<std::string, std::string> meta;
  // Whitespace inside the JSON, space padding, null metadata, zero-size tensors sharing an
  // offset, and tensors listed out of offset order.
  const std::string header =
      "{\n  \"__metadata__\": null,\n"
      "  \"z\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]},\n"
      "  \"e1\": {\"dtype\": \"BF16\", \"shape\": [0, 5], \"data_offsets\": [4, 4]},\n"
      "  \"e0\": {\"dtype\": \"I64\", \"shape\": [3, 0], \"data_offsets\": [0, 0]},\n"
      "  \"s\": {\"dtype\": \"I32\", \"shape\": [], \"data_offsets\": [0, 4]}\n}     ";
  const auto entries = parse_safetensors_header(header, 12, &meta, "ok.safetensors");
  ASSERT_EQ(entries.size(), 4u);
  EXPECT_EQ(entries[0].name, "e0");
  EXPECT_EQ(entries[1].name, "s");
  EXPECT_EQ(entries[2].name, "e1");
  EXPECT_EQ(entries[3].name, "z");
  EXPECT_EQ(entries[3].shape, (Shape{2}));
  EXPECT_EQ(entries[3].begin, 4u);
  EXPECT_EQ(entries[3].end, 12u);
  EXPECT_TRUE(entries[1].shape.empty());
  EXPECT_TRUE(meta.empty());

  // A zero dimension makes the size 0 however large the other dimensions are.
  const auto zero = parse_safetensors_header(
      R"({"a":{"dtype":"F64","shape":[9223372036854775807,0,1],"data_offsets":[0,0]}})", 0, nullptr,
      "zero.safetensors");
  ASSERT_EQ(zero.size(), 1u);
  EXPECT_EQ(zero[0].shape, (Shape{INT64_MAX, 0, 1}));
}

TEST(SafetensorsHeader, HugeDimensionNextToZeroIsStillRejectedWhenBeyondInt64) {
  const std::string msg = input_error([] {
    parse_safetensors_header(
        R"({"a":{"dtype":"F64","shape":[0,18446744073709551615],"data_offsets":[0,0]}})", 0,
        nullptr, "zero.safetensors");
  });
  EXPECT_NE(msg.find("too large"), std::string::npos) << msg;
}

}  // namespace
}  // namespace leantune
