// libleantune's side of the kernels' CUDA entry points (kernels/cuda_entry_points.h): each is a
// call through the table libleantune_cuda exports. This is the one place where a build or a
// machine without CUDA shows: the table lookup throws Error(kInput) naming the entry point, so
// the op dispatchers call the *_cuda functions without #ifdefs.
#include "engine/check.h"
#include "kernels/cuda_entry_points.h"

namespace leantune::kernels {
namespace {

const KernelsCudaTable& kernels_cuda_table(const char* op) {
  // A failed lookup throws, so the next call tries again (and reports the same reason).
  static const KernelsCudaTable* table = [op] {
    const auto* t = static_cast<const KernelsCudaTable*>(cuda_backend_table(
        kKernelsCudaTableSymbol, kKernelsCudaAbiVersion, sizeof(KernelsCudaTable), op));
    const char* bad = nullptr;
    LT_KERNELS_CUDA_ENTRY_POINTS(LT_CUDA_CHECK_ENTRY)
    LT_CHECK(bad == nullptr, "libleantune_cuda does not define ", bad,
             " as declared (its table entry is missing or points back into libleantune)");
    return t;
  }();
  return *table;
}

}  // namespace
}  // namespace leantune::kernels

using namespace leantune;  // the list's return types are spelled relative to leantune
#define LT_CUDA_TABLE_FN(op) ::leantune::kernels::kernels_cuda_table(op)
LT_KERNELS_CUDA_ENTRY_POINTS(LT_CUDA_FORWARD)
