// The NCCL backend's device side (engine/comm_nccl.h): thin, checked wrappers over NCCL, and
// the rank-order fold kernel of --deterministic_comm.
//   fold: in:[R, n] (f32 | f64 | bf16 | f16 | i32 | i64) -> out:[n], one thread per element,
//   accumulating rows 0..R-1 in order (f32 for 16-bit floats, rounded once; int64 for integers).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstring>

#include "engine/check.h"
#include "engine/comm_nccl.h"
#include "engine/dtype.h"
#include "engine/enum_names.h"

#ifdef LEANTUNE_WITH_NCCL
#include <nccl.h>
#endif

namespace leantune {
namespace {

// Integers fold in 64 bits, floats as float arithmetic does (engine/dtype.h).
template <typename T>
using fold_acc_t = std::conditional_t<std::is_integral_v<T>, long long, float_acc_t<T>>;

template <typename T>
__device__ fold_acc_t<T> fold_load(T v) {
  return static_cast<fold_acc_t<T>>(v);
}
template <>
__device__ float fold_load<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <>
__device__ float fold_load<__half>(__half v) {
  return __half2float(v);
}
template <typename T, typename A>
__device__ T fold_store(A v) {
  return static_cast<T>(v);
}
template <>
__device__ __nv_bfloat16 fold_store<__nv_bfloat16, float>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __half fold_store<__half, float>(float v) {
  return __float2half_rn(v);
}

// op: 0 sum, 1 avg, 2 max, 3 min (ReduceOp). NaN wins max/min, as on the host.
template <typename T>
__global__ void fold_kernel(const T* __restrict__ in, T* __restrict__ out, int64_t num_ranks,
                            int64_t n, int op) {
  using A = fold_acc_t<T>;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  A acc = fold_load<T>(in[i]);
  for (int64_t r = 1; r < num_ranks; ++r) {
    const A v = fold_load<T>(in[r * n + i]);
    if (op <= 1) {
      acc = acc + v;
    } else if (acc == acc) {
      if (v != v)
        acc = v;
      else
        acc = op == 2 ? (v > acc ? v : acc) : (v < acc ? v : acc);
    }
  }
  if (op == 1) acc = acc / static_cast<A>(num_ranks);
  out[i] = fold_store<T, A>(acc);
}

template <typename T>
void launch_fold(const void* in, void* out, int64_t num_ranks, int64_t n, int op, cudaStream_t s) {
  if (n == 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  LT_CHECK(blocks <= 0x7fffffff, "nccl_fold_rank_order: ", n, " elements is too many blocks");
  fold_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(
      static_cast<const T*>(in), static_cast<T*>(out), num_ranks, n, op);
  CUDA_CHECK_LAUNCH();
}

#ifdef LEANTUNE_WITH_NCCL
ncclDataType_t nccl_type(int dtype) {
  switch (static_cast<DType>(dtype)) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF64:
      return ncclFloat64;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
    // Moved, never reduced (comm_dtype_movable): a type of the same width carries the bytes.
    case DType::kI8:
      return ncclInt8;
    case DType::kU8:
    case DType::kBool:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
      return ncclUint8;
    case DType::kU32:
      return ncclUint32;
    case DType::kU64:
      return ncclUint64;
    default:
      LT_THROW(ErrorKind::kInternal, "nccl: unsupported dtype ",
               dtype_name(static_cast<DType>(dtype)));
  }
}

ncclRedOp_t nccl_op(int op) {
  static constexpr ncclRedOp_t kOps[] = {ncclSum, ncclAvg, ncclMax, ncclMin};
  static_assert(std::size(kOps) == static_cast<size_t>(ReduceOp::kMin) + 1);
  return enum_lookup(static_cast<ReduceOp>(op), kOps, ncclSum);
}

// Non-blocking communicators may answer ncclInProgress: that is not an error.
void nccl_ok(ncclResult_t r, const char* what) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  LT_THROW(ErrorKind::kComm, "NCCL ", what, ": ", ncclGetErrorString(r));
}

ncclComm_t as_comm(void* c) { return static_cast<ncclComm_t>(c); }
cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
#endif

}  // namespace

#ifdef LEANTUNE_WITH_NCCL

bool nccl_available() { return true; }

void nccl_get_unique_id(void* id_out) {
  static_assert(sizeof(ncclUniqueId) == kNcclUniqueIdBytes, "NCCL unique id size");
  ncclUniqueId id;
  NCCL_CHECK(ncclGetUniqueId(&id));
  std::memcpy(id_out, &id, sizeof id);
}

void* nccl_comm_init(int size, int rank, const void* id_bytes, int device) {
  CUDA_CHECK(cudaSetDevice(device));
  ncclUniqueId id;
  std::memcpy(&id, id_bytes, sizeof id);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t comm = nullptr;
  nccl_ok(ncclCommInitRankConfig(&comm, size, id, rank, &cfg), "init");
  return comm;
}

int nccl_async_error(void* comm) {
  ncclResult_t r = ncclSuccess;
  const ncclResult_t q = ncclCommGetAsyncError(as_comm(comm), &r);
  return q != ncclSuccess ? static_cast<int>(q) : static_cast<int>(r);
}

std::string nccl_error_string(int code) {
  return ncclGetErrorString(static_cast<ncclResult_t>(code));
}

void nccl_abort(void* comm) {
  if (comm) ncclCommAbort(as_comm(comm));
}

void nccl_destroy(void* comm) {
  if (comm) ncclCommDestroy(as_comm(comm));
}

void nccl_group_start() { nccl_ok(ncclGroupStart(), "group start"); }
void nccl_group_end() { nccl_ok(ncclGroupEnd(), "group end"); }

void nccl_all_reduce(void* comm, const void* send, void* recv, size_t count, int dtype, int op,
                     void* stream) {
  nccl_ok(ncclAllReduce(send, recv, count, nccl_type(dtype), nccl_op(op), as_comm(comm),
                        as_stream(stream)),
          "all_reduce");
}

void nccl_reduce_scatter(void* comm, const void* send, void* recv, size_t recv_count, int dtype,
                         int op, void* stream) {
  nccl_ok(ncclReduceScatter(send, recv, recv_count, nccl_type(dtype), nccl_op(op), as_comm(comm),
                            as_stream(stream)),
          "reduce_scatter");
}

void nccl_all_gather(void* comm, const void* send, void* recv, size_t send_count, int dtype,
                     void* stream) {
  nccl_ok(ncclAllGather(send, recv, send_count, nccl_type(dtype), as_comm(comm), as_stream(stream)),
          "all_gather");
}

void nccl_broadcast(void* comm, void* buf, size_t count, int dtype, int root, void* stream) {
  nccl_ok(ncclBroadcast(buf, buf, count, nccl_type(dtype), root, as_comm(comm), as_stream(stream)),
          "broadcast");
}

void nccl_send(void* comm, const void* buf, size_t bytes, int peer, void* stream) {
  nccl_ok(ncclSend(buf, bytes, ncclUint8, peer, as_comm(comm), as_stream(stream)), "send");
}

void nccl_recv(void* comm, void* buf, size_t bytes, int peer, void* stream) {
  nccl_ok(ncclRecv(buf, bytes, ncclUint8, peer, as_comm(comm), as_stream(stream)), "recv");
}

#else

bool nccl_available() { return false; }
#define LT_NO_NCCL(name) LT_THROW(ErrorKind::kInput, name ": this build of leantune has no NCCL")
void nccl_get_unique_id(void*) { LT_NO_NCCL("nccl_get_unique_id"); }
void* nccl_comm_init(int, int, const void*, int) { LT_NO_NCCL("nccl_comm_init"); }
int nccl_async_error(void*) { LT_NO_NCCL("nccl_async_error"); }
std::string nccl_error_string(int) { return "no NCCL"; }
void nccl_abort(void*) {}
void nccl_destroy(void*) {}
void nccl_group_start() { LT_NO_NCCL("nccl_group_start"); }
void nccl_group_end() { LT_NO_NCCL("nccl_group_end"); }
void nccl_all_reduce(void*, const void*, void*, size_t, int, int, void*) {
  LT_NO_NCCL("nccl_all_reduce");
}
void nccl_reduce_scatter(void*, const void*, void*, size_t, int, int, void*) {
  LT_NO_NCCL("nccl_reduce_scatter");
}
void nccl_all_gather(void*, const void*, void*, size_t, int, void*) {
  LT_NO_NCCL("nccl_all_gather");
}
void nccl_broadcast(void*, void*, size_t, int, int, void*) { LT_NO_NCCL("nccl_broadcast"); }
void nccl_send(void*, const void*, size_t, int, void*) { LT_NO_NCCL("nccl_send"); }
void nccl_recv(void*, void*, size_t, int, void*) { LT_NO_NCCL("nccl_recv"); }
#undef LT_NO_NCCL

#endif

void nccl_fold_rank_order(const void* in, void* out, int64_t num_ranks, int64_t n, int dtype,
                          int op, void* stream) {
  LT_CHECK(num_ranks >= 1 && n >= 0, "nccl_fold_rank_order: ", num_ranks, " ranks, ", n);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (static_cast<DType>(dtype)) {
    case DType::kF32:
      return launch_fold<float>(in, out, num_ranks, n, op, s);
    case DType::kF64:
      return launch_fold<double>(in, out, num_ranks, n, op, s);
    case DType::kBF16:
      return launch_fold<__nv_bfloat16>(in, out, num_ranks, n, op, s);
    case DType::kF16:
      return launch_fold<__half>(in, out, num_ranks, n, op, s);
    case DType::kI32:
      return launch_fold<int32_t>(in, out, num_ranks, n, op, s);
    case DType::kI64:
      return launch_fold<long long>(in, out, num_ranks, n, op, s);
    default:
      LT_THROW(ErrorKind::kInternal, "nccl_fold_rank_order: unsupported dtype");
  }
}

}  // namespace leantune
