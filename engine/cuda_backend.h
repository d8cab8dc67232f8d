// The CUDA backend as a separate library, libleantune_cuda.so, loaded on first CUDA use.
//
// libleantune links no CUDA library, so a CPU run never maps libcudart/libcublasLt (hundreds of
// MB of address space and start-up time). Each layer with CUDA code lists its CUDA entry points
// ONCE in an X-macro (engine/cuda_entry_points.h, kernels/cuda_entry_points.h); from that list
//   - LT_CUDA_TABLE_FIELD builds the layer's table of function pointers,
//   - LT_CUDA_FORWARD defines, in libleantune, each entry point as a call through the table
//     (a qualified definition, so a list that disagrees with the header does not compile),
//   - LT_CUDA_TABLE_ENTRY fills the table that libleantune_cuda exports (extern "C").
// The op headers keep declaring the entry points; the .cu files keep defining them. Both
// libraries are linked with -Bsymbolic-functions, so each binds calls to its own definitions.
//
// Without the backend (a build with LEANTUNE_CUDA=OFF, or a library that cannot be loaded, e.g.
// no driver or too little address space) every forwarded call throws Error(kInput) naming the
// entry point and the reason; device queries report 0 devices instead of throwing.
// The library is looked for in $LEANTUNE_CUDA_LIBRARY, then next to libleantune, then on the
// loader's search path. It is never unloaded (its objects may outlive any user).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace leantune {

// Leads every exported table: the version of the layout and its size in bytes.
struct CudaTableHeader {
  uint32_t abi_version;
  uint32_t size;
};

// True when this build has a CUDA backend (LEANTUNE_CUDA=ON).
bool cuda_backend_built();
// Loads the backend on first call; true when it is loaded. Never throws.
bool cuda_backend_loaded();
// Why CUDA cannot be used: no backend in this build, no CUDA driver, or why loading the backend
// failed ("" when it is loaded).
std::string cuda_backend_error();
// Devices visible to the backend; 0 without a driver or backend. Never loads the backend on a
// machine without the CUDA driver (libcuda.so.1). Never throws.
int cuda_backend_device_count();
// The table libleantune_cuda exports as `symbol`, checked against abi_version and size. Throws
// Error(kInput) "<op>: ..." when the backend is absent or does not match this libleantune.
const void* cuda_backend_table(const char* symbol, uint32_t abi_version, size_t size,
                               const char* op);

}  // namespace leantune

#define LT_CUDA_STR_(x) #x
#define LT_CUDA_STR(x) LT_CUDA_STR_(x)

// X-macro callbacks; an entry point is X(return type, namespace, name, (parameters), (args)).
#define LT_CUDA_TABLE_FIELD(ret, ns, name, params, args) ret(*name) params;
#define LT_CUDA_TABLE_ENTRY(ret, ns, name, params, args) &ns::name,
// Defines the entry point in libleantune, at global scope after `using namespace leantune;` and
// a `#define LT_CUDA_TABLE_FN(op)` that returns the layer's table.
#define LT_CUDA_FORWARD(ret, ns, name, params, args) \
  ret ns::name params { return LT_CUDA_TABLE_FN(#name).name args; }
// A table entry that is null or points back at libleantune's own forwarder (libleantune_cuda
// lacks a definition that matches the header): the name of the first such entry, else nullptr.
#define LT_CUDA_CHECK_ENTRY(ret, ns, name, params, args) \
  if (!bad && (t->name == nullptr || t->name == static_cast<ret(*) params>(&ns::name))) bad = #name;
