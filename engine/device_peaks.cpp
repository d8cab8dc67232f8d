// The GPU peak table of engine/device_peaks.h.
#include "engine/device_peaks.h"

namespace leantune {

namespace {

struct Peak {
  const char* name;
  bool exact;  // the whole name, else a prefix
  double tflops;
};

// Most specific first. NVIDIA datasheets, dense BF16 tensor-core TFLOPS.
constexpr Peak kPeaks[] = {
    {"NVIDIA H200", true, 989.5},            // H200 SXM (the NVL part reports another name)
    {"NVIDIA H100 80GB HBM3", true, 989.5},  // H100 SXM5
    {"NVIDIA H100 PCIe", true, 756.5},
    {"NVIDIA GH200", false, 989.5},
    {"NVIDIA A100", false, 312.0},  // SXM4 and PCIe, 40 and 80 GB
    {"NVIDIA L40S", true, 362.05},
    {"NVIDIA L4", true, 121.0},
    {"NVIDIA A10", true, 125.0},
};

}  // namespace

double peak_bf16_flops(const std::string& device_name) {
  if (device_name.find("NVL") != std::string::npos) return 0.0;
  for (const Peak& p : kPeaks) {
    const bool match = p.exact ? device_name == p.name : device_name.rfind(p.name, 0) == 0;
    if (match) return p.tflops * 1e12;
  }
  return 0.0;
}

double training_flops_per_token(double parameters, double trainable_parameters) {
  return 4.0 * parameters + 2.0 * trainable_parameters;
}

}  // namespace leantune
