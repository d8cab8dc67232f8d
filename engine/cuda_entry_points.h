// The engine's CUDA entry points, listed once (see engine/cuda_backend.h): the device door of
// engine/cuda_api.h, the CUDA ops of engine/ops_cuda.h, the Philox fills of engine/rng.h and the
// fused AdamW of engine/optim.h. Declared in those headers, defined in engine/*.cu, reached from
// libleantune through EngineCudaTable. Changing the list or a signature: bump the ABI version.
#pragma once

#include "engine/comm_nccl.h"
#include "engine/cuda_api.h"
#include "engine/cuda_backend.h"
#include "engine/ops_cuda.h"
#include "engine/optim.h"
#include "engine/rng.h"

// The exported table's name.
#define LT_ENGINE_CUDA_TABLE leantune_cuda_engine_table

// clang-format off
#define LT_ENGINE_CUDA_ENTRY_POINTS(X)                                                            \
  X(int, leantune, cuda_device_count_impl, (), ())                                                \
  X(std::unique_ptr<MemoryBacking>, leantune, cuda_make_device_backing, (int device), (device))   \
  X(std::unique_ptr<MemoryBacking>, leantune, cuda_make_pinned_backing, (), ())                   \
  X(void, leantune, cuda_set_device, (int device), (device))                                      \
  X(void*, leantune, cuda_stream_create, (int device), (device))                                  \
  X(void, leantune, cuda_stream_synchronize, (void* stream), (stream))                            \
  X(void, leantune, cuda_stream_wait_stream, (void* stream, void* other), (stream, other))        \
  X(void*, leantune, cuda_event_create, (int device), (device))                                   \
  X(void, leantune, cuda_event_destroy, (void* ev), (ev))                                         \
  X(void, leantune, cuda_event_record, (void* ev, void* stream), (ev, stream))                    \
  X(bool, leantune, cuda_event_query, (void* ev), (ev))                                           \
  X(void, leantune, cuda_event_synchronize, (void* ev), (ev))                                     \
  X(void, leantune, cuda_stream_wait_event, (void* stream, void* ev), (stream, ev))               \
  X(float, leantune, cuda_event_elapsed_ms, (void* start, void* end), (start, end))               \
  X(void, leantune, cuda_device_synchronize, (int device), (device))                              \
  X(void, leantune, cuda_memcpy_async,                                                            \
    (void* dst, const void* src, size_t bytes, CopyKind kind, void* stream),                      \
    (dst, src, bytes, kind, stream))                                                              \
  X(void, leantune, cuda_memset_async, (void* dst, int value, size_t bytes, void* stream),        \
    (dst, value, bytes, stream))                                                                  \
  X(void, leantune, cuda_mem_get_info, (int device, size_t* free_bytes, size_t* total_bytes),     \
    (device, free_bytes, total_bytes))                                                            \
  X(std::string, leantune, cuda_device_name, (int device), (device))                              \
  X(void, leantune, nvtx_range_push, (const char* name), (name))                                  \
  X(void, leantune, nvtx_range_pop, (), ())                                                       \
  X(void, leantune::cuda_ops, copy, (const Tensor& dst, const Tensor& src), (dst, src))           \
  X(void, leantune::cuda_ops, fill, (const Tensor& t, double value), (t, value))                  \
  X(Tensor, leantune::cuda_ops, add, (const Tensor& a, const Tensor& b, double alpha),            \
    (a, b, alpha))                                                                                \
  X(void, leantune::cuda_ops, add_, (const Tensor& a, const Tensor& b, double alpha),             \
    (a, b, alpha))                                                                                \
  X(Tensor, leantune::cuda_ops, mul, (const Tensor& a, const Tensor& b), (a, b))                  \
  X(void, leantune::cuda_ops, mul_, (const Tensor& a, const Tensor& b), (a, b))                   \
  X(Tensor, leantune::cuda_ops, div, (const Tensor& a, const Tensor& b), (a, b))                  \
  X(Tensor, leantune::cuda_ops, affine, (const Tensor& a, double alpha, double beta),             \
    (a, alpha, beta))                                                                             \
  X(void, leantune::cuda_ops, scale_, (const Tensor& a, double s), (a, s))                        \
  X(Tensor, leantune::cuda_ops, unary, (const Tensor& x, ops::Unary op), (x, op))                 \
  X(Tensor, leantune::cuda_ops, sum, (const Tensor& x), (x))                                      \
  X(Tensor, leantune::cuda_ops, sum_dim, (const Tensor& x, int64_t dim, bool keepdim),            \
    (x, dim, keepdim))                                                                            \
  X(Tensor, leantune::cuda_ops, max_last, (const Tensor& x), (x))                                 \
  X(Tensor, leantune::cuda_ops, argmax_last, (const Tensor& x), (x))                              \
  X(double, leantune::cuda_ops, sum_squares, (const Tensor& x), (x))                              \
  X(double, leantune::cuda_ops, max_abs, (const Tensor& x), (x))                                  \
  X(bool, leantune::cuda_ops, all_finite, (const Tensor& x), (x))                                 \
  X(void, leantune::cuda_ops, gemm,                                                               \
    (const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c, double alpha,           \
     double beta),                                                                                \
    (a, ta, b, tb, c, alpha, beta))                                                               \
  X(Tensor, leantune::cuda_ops, softmax_last, (const Tensor& x, bool log), (x, log))              \
  X(Tensor, leantune::cuda_ops, index_rows, (const Tensor& table, const Tensor& ids),             \
    (table, ids))                                                                                 \
  X(void, leantune::cuda_ops, philox_fill,                                                        \
    (const Tensor& t, const PhiloxParams& p, int kind, double a, double b), (t, p, kind, a, b))   \
  X(void, leantune, adamw_step_cuda,                                                              \
    (const std::vector<AdamWTensor>& tensors, const AdamWStepArgs& args), (tensors, args))                \
  X(bool, leantune, nccl_available, (), ())                                                       \
  X(void, leantune, nccl_get_unique_id, (void* id_out), (id_out))                                 \
  X(void*, leantune, nccl_comm_init, (int size, int rank, const void* id, int device),            \
    (size, rank, id, device))                                                                     \
  X(int, leantune, nccl_async_error, (void* comm), (comm))                                        \
  X(std::string, leantune, nccl_error_string, (int code), (code))                                 \
  X(void, leantune, nccl_abort, (void* comm), (comm))                                             \
  X(void, leantune, nccl_destroy, (void* comm), (comm))                                           \
  X(void, leantune, nccl_group_start, (), ())                                                     \
  X(void, leantune, nccl_group_end, (), ())                                                       \
  X(void, leantune, nccl_all_reduce,                                                              \
    (void* comm, const void* send, void* recv, size_t count, int dtype, int op, void* stream),    \
    (comm, send, recv, count, dtype, op, stream))                                                 \
  X(void, leantune, nccl_reduce_scatter,                                                          \
    (void* comm, const void* send, void* recv, size_t recv_count, int dtype, int op,              \
     void* stream),                                                                               \
    (comm, send, recv, recv_count, dtype, op, stream))                                            \
  X(void, leantune, nccl_all_gather,                                                              \
    (void* comm, const void* send, void* recv, size_t send_count, int dtype, void* stream),       \
    (comm, send, recv, send_count, dtype, stream))                                                \
  X(void, leantune, nccl_broadcast,                                                               \
    (void* comm, void* buf, size_t count, int dtype, int root, void* stream),                     \
    (comm, buf, count, dtype, root, stream))                                                      \
  X(void, leantune, nccl_send, (void* comm, const void* buf, size_t bytes, int peer, void* stream),\
    (comm, buf, bytes, peer, stream))                                                             \
  X(void, leantune, nccl_recv, (void* comm, void* buf, size_t bytes, int peer, void* stream),     \
    (comm, buf, bytes, peer, stream))                                                             \
  X(void, leantune, nccl_fold_rank_order,                                                         \
    (const void* in, void* out, int64_t num_ranks, int64_t n, int dtype, int op, void* stream),   \
    (in, out, num_ranks, n, dtype, op, stream))
// clang-format on

namespace leantune {

inline constexpr uint32_t kEngineCudaAbiVersion = 3;
inline constexpr const char* kEngineCudaTableSymbol = LT_CUDA_STR(LT_ENGINE_CUDA_TABLE);

struct EngineCudaTable {
  CudaTableHeader header;
  LT_ENGINE_CUDA_ENTRY_POINTS(LT_CUDA_TABLE_FIELD)
};

}  // namespace leantune
