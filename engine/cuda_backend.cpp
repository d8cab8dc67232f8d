// Finding and loading libleantune_cuda.so (see cuda_backend.h). LEANTUNE_CUDA_BACKEND (1 when the
// build has the CUDA backend) is set for this file alone by CMake; executables that compile the
// engine sources themselves (the sanitizer tests) have no backend.
#include "engine/cuda_backend.h"

#ifndef LEANTUNE_CUDA_BACKEND
#define LEANTUNE_CUDA_BACKEND 0
#endif

#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <vector>

#include "engine/check.h"
#include "engine/cuda_api.h"

namespace leantune {
namespace {

constexpr bool kBuiltWithCuda = LEANTUNE_CUDA_BACKEND != 0;
constexpr const char* kLibraryName = "libleantune_cuda.so";

struct Backend {
  void* handle = nullptr;
  std::string error;
};

// Where libleantune itself was loaded from ("" if unknown): the backend is installed beside it.
std::string own_directory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&cuda_backend_loaded), &info) == 0 || !info.dli_fname) {
    return "";
  }
  const std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

Backend load() {
  if (!kBuiltWithCuda) {
    return {nullptr,
            "this build of leantune has no CUDA backend (configure with -DLEANTUNE_CUDA=ON on a "
            "machine with nvcc)"};
  }
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("LEANTUNE_CUDA_LIBRARY"); env && *env) {
    candidates.push_back(env);  // an explicit choice: no fallback
  } else {
    if (const std::string dir = own_directory(); !dir.empty()) {
      candidates.push_back(dir + "/" + kLibraryName);
    }
    candidates.push_back(kLibraryName);  // LD_LIBRARY_PATH, libleantune's runpath
  }
  std::string errors;
  for (const std::string& c : candidates) {
    // RTLD_NOW: a missing CUDA library or symbol is reported here, not at a later call.
    if (void* h = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL)) return {h, ""};
    const char* e = dlerror();
    if (!errors.empty()) errors += "; ";
    errors += e ? e : c + ": cannot load";
  }
  return {nullptr, errors};
}

std::atomic<bool> attempted{false};

const Backend& backend() {
  static const Backend b = (attempted = true, load());
  return b;
}

bool backend_attempted() { return attempted; }

// The CUDA driver's library; without it there is no device and the backend is not loaded.
bool driver_present() {
  static const bool present =
      std::getenv("LEANTUNE_CUDA_LIBRARY") || dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  return present;
}

}  // namespace

bool cuda_backend_built() { return kBuiltWithCuda; }

bool cuda_backend_loaded() { return backend().handle != nullptr; }

std::string cuda_backend_error() {
  if (kBuiltWithCuda && !driver_present() && !backend_attempted()) {
    return "no CUDA driver (libcuda.so.1 cannot be loaded)";
  }
  if (backend().handle && cuda_backend_device_count() == 0) return "the CUDA driver sees no device";
  return backend().error;
}

int cuda_backend_device_count() {
  if (!kBuiltWithCuda) return 0;
  // No driver, no device: answered without mapping the CUDA runtime and cuBLAS.
  if (!driver_present()) return 0;
  if (!cuda_backend_loaded()) return 0;
  try {
    return cuda_device_count_impl();
  } catch (const Error&) {
    return 0;
  }
}

const void* cuda_backend_table(const char* symbol, uint32_t abi_version, size_t size,
                               const char* op) {
  if (!kBuiltWithCuda) LT_THROW_NO_CUDA(op);
  const Backend& b = backend();
  LT_CHECK_INPUT(b.handle != nullptr, op, ": CUDA backend unavailable: ", b.error);
  dlerror();
  const auto* header = static_cast<const CudaTableHeader*>(dlsym(b.handle, symbol));
  const char* err = header ? nullptr : dlerror();
  LT_CHECK(header != nullptr, op, ": libleantune_cuda has no table ", symbol, " (",
           err ? err : "null", ")");
  LT_CHECK(header->abi_version == abi_version && header->size == size, op, ": libleantune_cuda's ",
           symbol, " is version ", header->abi_version, " (", header->size,
           " bytes), this libleantune expects version ", abi_version, " (", size,
           " bytes): the two libraries come from different builds");
  return header;
}

}  // namespace leantune
