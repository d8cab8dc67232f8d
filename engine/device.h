// Where a tensor lives: the host (cpu) or one CUDA device (cuda:N).
#pragma once

#include <string>
#include <string_view>

namespace leantune {

enum class DeviceType : uint8_t { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;

  static Device cpu() { return {DeviceType::kCPU, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::kCUDA, i}; }
  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const;
  // "cpu", "cuda", "cuda:1", or "auto" (cuda:0 when a device is present, else cpu).
  // Throws an input Error naming the text otherwise.
  static Device parse(std::string_view s);
};

// Number of CUDA devices usable by this process (0 in a CPU-only build or without a GPU).
int cuda_device_count();
bool cuda_available();

}  // namespace leantune
