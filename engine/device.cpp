// Device names, parsing and the CUDA device count (see device.h).
#include "engine/device.h"

#include <string>

#include "engine/check.h"
#include "engine/cuda_backend.h"

namespace leantune {

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

Device Device::parse(std::string_view s) {
  if (s == "cpu") return cpu();
  if (s == "auto") return cuda_available() ? cuda(0) : cpu();
  if (s == "cuda") return cuda(0);
  if (s.substr(0, 5) == "cuda:") {
    std::string rest(s.substr(5));
    int idx = -1;
    try {
      size_t used = 0;
      idx = std::stoi(rest, &used);
      if (used != rest.size()) idx = -1;
    } catch (...) {
      idx = -1;
    }
    LT_CHECK_INPUT(idx >= 0, "invalid device '", s, "' (expected cpu, cuda, cuda:N or auto)");
    return cuda(idx);
  }
  LT_THROW(ErrorKind::kInput, "invalid device '", s, "' (expected cpu, cuda, cuda:N or auto)");
}

int cuda_device_count() {
  static const int n = cuda_backend_device_count();
  return n;
}
bool cuda_available() { return cuda_device_count() > 0; }

}  // namespace leantune
