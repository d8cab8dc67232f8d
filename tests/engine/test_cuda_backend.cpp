// The CUDA backend door (engine/cuda_backend.h) as seen from a process without a usable GPU:
// device queries answer 0 without throwing, and a forwarded CUDA entry point throws one clear
// Error(kInput) naming itself and the reason. The cases that need a device live in the *Cuda*
// tests; the CLI side (no CUDA library linked, lazy load, a broken LEANTUNE_CUDA_LIBRARY) is
// tests/engine/cuda_backend.cmake.
#include <gtest/gtest.h>

#include <string>

#include "engine/check.h"
#include "engine/cuda_api.h"
#include "engine/cuda_backend.h"
#include "engine/device.h"
#include "engine/ops_cuda.h"
#include "engine/tensor.h"
#include "kernels/linear.h"
#include "testing/testing.h"

namespace leantune {
namespace {

TEST(BackendLoader, DeviceQueriesAnswerWithoutThrowing) {
  int n = -1;
  EXPECT_NO_THROW(n = cuda_device_count());
  EXPECT_GE(n, 0);
  EXPECT_EQ(cuda_available(), n > 0);
  if (!cuda_backend_built()) {
    EXPECT_EQ(n, 0);
    EXPECT_FALSE(cuda_backend_loaded());
    EXPECT_NE(cuda_backend_error().find("no CUDA backend"), std::string::npos)
        << cuda_backend_error();
  }
  if (n == 0) {
    EXPECT_FALSE(cuda_backend_error().empty());
  }
}

// Without a device, the forwarders must fail before any CUDA code could run.
template <typename F>
void expect_no_cuda_error(const char* entry_point, F&& call) {
  try {
    call();
    ADD_FAILURE() << entry_point << " did not throw";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kInput) << msg;
    EXPECT_NE(msg.find(entry_point), std::string::npos) << msg;
    EXPECT_TRUE(msg.find("no CUDA backend") != std::string::npos ||
                msg.find("CUDA backend unavailable") != std::string::npos)
        << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST(BackendLoader, ForwardedEntryPointsThrowOneClearErrorWithoutBackend) {
  if (cuda_backend_loaded()) GTEST_SKIP() << "the CUDA backend is loaded here";
  const Tensor x = Tensor::zeros({2, 3}, DType::kF32, Device::cpu());
  expect_no_cuda_error("cuda_stream_create", [] { cuda_stream_create(0); });
  expect_no_cuda_error("cuda_device_name", [] { cuda_device_name(0); });
  expect_no_cuda_error("sum_squares", [&] { cuda_ops::sum_squares(x); });
  expect_no_cuda_error("linear_fwd_cuda", [&] { kernels::linear_fwd_cuda(x, x, Tensor(), x); });
}

// Through the table into libleantune_cuda and back: a name with a device, else the CUDA
// runtime's own error (not the loader's), caught here as leantune::Error.
TEST(BackendLoader, ForwardedCallsReachTheBackend) {
  if (!cuda_backend_loaded()) GTEST_SKIP() << "no CUDA backend: " << cuda_backend_error();
  // A host tensor handed to a kernel's CUDA adapter: its own argument check answers.
  const Tensor x = Tensor::zeros({2, 3}, DType::kF32, Device::cpu());
  try {
    kernels::linear_fwd_cuda(x, x, Tensor(), x);
    ADD_FAILURE() << "linear_fwd_cuda accepted host tensors";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("linear_fwd_cuda: x"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("backend"), std::string::npos) << msg;
  }
  if (cuda_device_count() > 0) {
    EXPECT_FALSE(cuda_device_name(0).empty());
    return;
  }
  try {
    cuda_device_name(0);
    ADD_FAILURE() << "cuda_device_name(0) without a device did not throw";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("CUDA"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("backend"), std::string::npos) << msg;
  }
}

TEST(BackendLoader, UnknownTableIsAnInternalError) {
  if (!cuda_backend_loaded()) GTEST_SKIP() << "no CUDA backend: " << cuda_backend_error();
  try {
    cuda_backend_table("leantune_cuda_no_such_table", 1, 8, "probe");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("leantune_cuda_no_such_table"), std::string::npos);
  }
}

}  // namespace
}  // namespace leantune
