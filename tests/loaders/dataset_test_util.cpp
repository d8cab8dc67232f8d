// Helpers shared by the dataset tests (see dataset_test_util.h).
#include "dataset_test_util.h"

#include <fstream>

#include "testing/testing.h"

namespace leantune::dataset_testing {

std::string write_file(const std::string& dir, const std::string& name,
                       const std::string& content) {
  const std::string path = dir + "/" + name;
  std::ofstream f(path, std::ios::binary);
  f << content;
  return path;
}

std::string write_lines(const std::string& name, const std::vector<std::string>& lines) {
  std::string content;
  for (const auto& l : lines) content += l + "\n";
  return write_file(testing::temp_dir("ds"), name, content);
}

std::vector<Record> read_all(const std::string& path, DatasetReaderOptions opts,
                             DatasetFormat* format) {
  DatasetReader r(path, opts);
  std::vector<Record> out;
  Record rec;
  while (r.next(&rec)) out.push_back(rec);
  if (format) *format = r.format();
  return out;
}

std::vector<int32_t> enc(const std::string& s, bool special) {
  return FakeEncoder().encode(s, special);
}

}  // namespace leantune::dataset_testing
