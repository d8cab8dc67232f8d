// The NCCL backend's CUDA entry points (defined in engine/comm_nccl.cu, in libleantune_cuda,
// reached through engine/cuda_entry_points.h) and the host-side communicator that drives them
// (engine/comm_nccl.cpp).
//
// Raw layer: a communicator is an opaque handle (ncclComm_t), buffers are device pointers,
// counts are elements, dtype and op are leantune's DType / ReduceOp as integers, and every call
// is enqueued on `stream` (the communicator's own stream; the host side orders it against the
// caller's stream with events). Communicators are created non-blocking
// (ncclConfig_t.blocking = 0): a call may return while NCCL still works, and nccl_async_error()
// reports ncclInProgress (7) until it is done; nccl_abort() may be called from another thread
// (the watchdog) and unblocks kernels waiting on a dead peer.
//   nccl_fold_rank_order: in:[num_ranks, n] -> out:[n], the rank-order fold of
//   comm_fold.h on the device (f32 accumulation for f32/bf16/f16, f64 for f64), for
//   --deterministic_comm.
// A build without NCCL defines every entry point to throw Error(kInput) saying so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/comm.h"

namespace leantune {

constexpr size_t kNcclUniqueIdBytes = 128;

bool nccl_available();
void nccl_get_unique_id(void* id_out);  // kNcclUniqueIdBytes
void* nccl_comm_init(int size, int rank, const void* id, int device);
// 0 success, 7 in progress, anything else an error (nccl_error_string names it).
int nccl_async_error(void* comm);
std::string nccl_error_string(int code);
void nccl_abort(void* comm);
void nccl_destroy(void* comm);
void nccl_group_start();
void nccl_group_end();
void nccl_all_reduce(void* comm, const void* send, void* recv, size_t count, int dtype, int op,
                     void* stream);
void nccl_reduce_scatter(void* comm, const void* send, void* recv, size_t recv_count, int dtype,
                         int op, void* stream);
void nccl_all_gather(void* comm, const void* send, void* recv, size_t send_count, int dtype,
                     void* stream);
void nccl_broadcast(void* comm, void* buf, size_t count, int dtype, int root, void* stream);
void nccl_send(void* comm, const void* buf, size_t bytes, int peer, void* stream);
void nccl_recv(void* comm, void* buf, size_t bytes, int peer, void* stream);
void nccl_fold_rank_order(const void* in, void* out, int64_t num_ranks, int64_t n, int dtype,
                          int op, void* stream);

namespace comm_detail {
// The NCCL communicator over the ranks of `bootstrap` (an MPI communicator, kept for host
// scalars, barriers and split), on CUDA device `device`.
std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> bootstrap,
                                                     int device, const CommOptions& options);
}  // namespace comm_detail

}  // namespace leantune
