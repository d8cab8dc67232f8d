// Attention through cuDNN's fused scaled dot-product attention (the cuDNN frontend's graph API),
// the fast path of kernels/attention.cu for bf16/f16 training shapes. Host-side declarations only:
// no cuDNN type leaks out of attention_cudnn.cu, which builds with or without the frontend's
// headers (LEANTUNE_WITH_CUDNN_FRONTEND); without them every call reports "not built".
//
// The problem is kernels/attention.h's, restricted to what one cuDNN graph expresses:
//   q, k, v:[T,H,D] rows (heads and head_dim dense, row stride >= H*D, 16-byte aligned), one
//   packed batch whose query and key sequences coincide (cu_seqlens_q == cu_seqlens_k, Tq == Tk:
//   training and prefill), bf16/f16, D a multiple of 8 up to 128, causal or not, an optional
//   sliding window, no soft-capping. A batch whose sequences all have the longest length and
//   cover every row (t == batch * max_seqlen == covered) runs on a dense graph, any other on a
//   ragged one (the .cu's comment; LEANTUNE_CUDNN_GRAPH=ragged or ragged_bottom_right forces
//   the ragged form).
//   cu:[B+1] i32 on the device -> out:[T,Hq,D] contiguous, lse:[Hq,T] f32 (natural log).
// Rows outside every sequence are left for the caller to fill (out = 0, lse = -inf, grads 0).
//
// cuDNN itself is loaded at run time (dlopen of libcudnn.so.9, or LEANTUNE_CUDNN_LIBRARY), so
// libleantune_cuda runs where cuDNN is absent: available() then says why and attention.cu uses
// its own kernels.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "engine/tensor.h"

namespace leantune::kernels::cudnn_sdpa {

// One packed batch as cuDNN sees it.
struct Problem {
  DType dtype = DType::kBF16;
  int64_t t = 0;  // rows of q (== rows of k, v)
  int64_t hq = 0, hk = 0, d = 0;
  int batch = 0;  // sequences (cu has batch + 1 entries)
  // The longest sequence. It must bound every sequence: a smaller value leaves the longer ones'
  // rows unspecified (the ragged graph clips them; the dense graph, taken when t == batch *
  // max_seqlen == covered, reads the rows as equal-length sequences).
  int64_t max_seqlen = 0;
  // cu[batch] as read and checked on the host (cu[0] == 0), or -1 when only the device holds cu;
  // the dense graph needs it equal to t (kernels::dense_batch).
  int64_t covered = -1;
  bool causal = true;
  int64_t window = 0;  // 0: none
  float scale = 0.f;
  const int32_t* cu = nullptr;  // device
  Device dev;
  cudaStream_t stream = nullptr;
};

// [T, H, D] rows with a row stride in elements.
struct Rows {
  const void* ptr = nullptr;
  int64_t stride = 0;
};

// Whether cuDNN attention can run on `dev`: frontend built in, library loaded, sm_80 or newer.
// When not, *why says which.
bool available(Device dev, std::string* why);

// Forward: out (contiguous [T,Hq,D]) and lse ([Hq,T] f32 on p.dev). Returns false, with the
// reason in *why, when cuDNN does not support this problem (the caller then runs its own kernel);
// throws leantune::Error on a failure while running.
bool fwd(const Problem& p, Rows q, Rows k, Rows v, void* out, const Tensor& lse, std::string* why);

// Backward: dq, dk, dv (contiguous, overwritten) from dout, out and the forward's lse.
bool bwd(const Problem& p, Rows q, Rows k, Rows v, Rows out, Rows dout, const Tensor& lse, void* dq,
         void* dk, void* dv, std::string* why);

// Forward and backward calls cuDNN ran since the process started, and those on a dense graph
// (tests check the path taken).
int64_t calls();
int64_t dense_calls();

}  // namespace leantune::kernels::cudnn_sdpa
