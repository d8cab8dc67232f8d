// embedding on CUDA.
//   weight:[V,H] (f32, bf16, f16, f64), ids:[T] i32|i64 (host or device) -> y:[T,H] contiguous
//   forward:  y[t] = weight[ids[t]]  (cu::gather_rows, the engine's row gather: 16-byte words
//             when rows allow)
//   backward: dweight[v] = sum over t with ids[t] == v of dy[t], dy first rounded to dweight's
//             dtype (as the CPU path converts it), sums in f32 (f64 for f64); rows no id names
//             are zero. dweight is overwritten.
// The backward is deterministic and adds in the CPU path's order: the positions are sorted by id
// with CUB's stable radix sort (so equal ids keep ascending positions), then one block per run of
// equal ids walks its positions in order, each thread owning a slice of columns in registers. No
// atomics. An id outside [0, V) is an Error (kInput) naming it; host ids are checked before any
// launch, device ids by the kernels (bad rows are skipped, the first bad position is recorded and
// the host throws after a stream synchronisation).
// Scratch (backward): keys and positions, sorted copies, CUB temp storage (kWorkspace).
#include <cub/device/device_radix_sort.cuh>

#include "engine/cuda_utils.cuh"
#include "kernels/acc_math.cuh"
#include "kernels/embedding.h"

namespace leantune::kernels {
namespace {

constexpr int kThreads = 256;

// Sort keys (the id, or `vocab` for a bad id so that it sorts last and is skipped) and the
// positions to carry through the sort.
template <typename I>
__global__ void embedding_keys_kernel(const I* __restrict__ ids, int64_t n, int64_t vocab,
                                      uint32_t* __restrict__ keys, int32_t* __restrict__ pos,
                                      unsigned long long* first_bad) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t id = static_cast<int64_t>(ids[i]);
    const bool ok = id >= 0 && id < vocab;
    if (!ok) cu::report_bad_index(first_bad, i);
    keys[i] = static_cast<uint32_t>(ok ? id : vocab);
    pos[i] = static_cast<int32_t>(i);
  }
}

// Block b handles the run of equal keys that starts at sorted index b (other blocks leave at
// once): dweight[key] = sum of dy rows at the run's positions, in sorted (= position) order.
template <typename T, int V>
__global__ void embedding_bwd_kernel(const T* __restrict__ dy, const uint32_t* __restrict__ keys,
                                     const int32_t* __restrict__ pos, int64_t n, int64_t vocab,
                                     int64_t h, T* __restrict__ dweight) {
  using A = cu::acc_of<T>;
  const int64_t nvec = h / V;
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const uint32_t key = keys[i];
    if (key >= vocab || (i > 0 && keys[i - 1] == key)) continue;
    int64_t end = i + 1;
    while (end < n && keys[end] == key) ++end;
    for (int64_t c = threadIdx.x; c < nvec; c += blockDim.x) {
      A acc[V];
#pragma unroll
      for (int e = 0; e < V; ++e) acc[e] = 0;
      int64_t r = i;
      // Four rows in flight, added in order.
      for (; r + 4 <= end; r += 4) {
        A v[4][V];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const T* src = dy + static_cast<int64_t>(pos[r + q]) * h + c * V;
          load_n<T, V>(src, v[q]);
        }
#pragma unroll
        for (int q = 0; q < 4; ++q)
#pragma unroll
          for (int e = 0; e < V; ++e) acc[e] = cu::add_rn(acc[e], v[q][e]);
      }
      for (; r < end; ++r) {
        const T* src = dy + static_cast<int64_t>(pos[r]) * h + c * V;
        A v[V];
        load_n<T, V>(src, v);
#pragma unroll
        for (int e = 0; e < V; ++e) acc[e] = cu::add_rn(acc[e], v[e]);
      }
      T* dst = dweight + static_cast<int64_t>(key) * h + c * V;
      store_n<T, V>(dst, acc);
    }
  }
}

void embedding_bwd_launch(const void* dy, const void* ids, DType id_type, void* dweight, int64_t n,
                          int64_t vocab, int64_t h, DType dt, unsigned long long* first_bad,
                          Device dev, cudaStream_t stream) {
  CUDA_CHECK(cudaMemsetAsync(dweight, 0, static_cast<size_t>(vocab * h) * dtype_size(dt), stream));
  if (n == 0 || h == 0) return;
  // Keys and positions, then CUB's stable radix sort over the bits that vocab needs.
  Tensor keys = cu::workspace(static_cast<size_t>(n) * 4, dev);
  Tensor pos = cu::workspace(static_cast<size_t>(n) * 4, dev);
  Tensor keys_sorted = cu::workspace(static_cast<size_t>(n) * 4, dev);
  Tensor pos_sorted = cu::workspace(static_cast<size_t>(n) * 4, dev);
  uint32_t* pk = static_cast<uint32_t*>(keys.data_ptr());
  int32_t* pp = static_cast<int32_t*>(pos.data_ptr());
  uint32_t* pks = static_cast<uint32_t*>(keys_sorted.data_ptr());
  int32_t* pps = static_cast<int32_t*>(pos_sorted.data_ptr());
  LT_CU_DISPATCH_INDEX(id_type, I, {
    embedding_keys_kernel<I><<<cu::grid_blocks(n, kThreads, dev.index), kThreads, 0, stream>>>(
        static_cast<const I*>(ids), n, vocab, pk, pp, first_bad);
    CUDA_CHECK_LAUNCH();
  });
  int end_bit = 1;
  while (end_bit < 32 && (int64_t{1} << end_bit) <= vocab) ++end_bit;
  size_t temp_bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, pk, pks, pp, pps,
                                             static_cast<int>(n), 0, end_bit, stream));
  Tensor temp = cu::workspace(std::max<size_t>(temp_bytes, 1), dev);
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.data_ptr(), temp_bytes, pk, pks, pp, pps,
                                             static_cast<int>(n), 0, end_bit, stream));
  LT_CU_DISPATCH_FLOAT(dt, T, {
    constexpr int kVec = cu::VecWidth<T>::value;
    const bool vec = h % kVec == 0 && cu::aligned16(dy) && cu::aligned16(dweight);
    const int64_t nvec = vec ? h / kVec : h;
    const int threads = static_cast<int>(std::clamp<int64_t>((nvec + 31) / 32 * 32, 32, kThreads));
    const int64_t blocks =
        std::min<int64_t>(n, static_cast<int64_t>(cu::device_info(dev.index).sm_count) * 32);
    const T* pg = static_cast<const T*>(dy);
    T* pw = static_cast<T*>(dweight);
    if (vec)
      embedding_bwd_kernel<T, kVec>
          <<<static_cast<unsigned>(blocks), threads, 0, stream>>>(pg, pks, pps, n, vocab, h, pw);
    else
      embedding_bwd_kernel<T, 1>
          <<<static_cast<unsigned>(blocks), threads, 0, stream>>>(pg, pks, pps, n, vocab, h, pw);
    CUDA_CHECK_LAUNCH();
  });
}

// Host ids: checked here with the CPU path's message; then uploaded.
Tensor checked_ids(const Tensor& ids, int64_t vocab, Device d, const char* op) {
  LT_CHECK(ids.dim() == 1 && (ids.dtype() == DType::kI32 || ids.dtype() == DType::kI64), op,
           ": ids ", ids.str(), " must be 1-D i32 or i64");
  if (ids.device().is_cpu()) {
    const std::vector<int64_t> v = ids.to_i64();
    for (size_t t = 0; t < v.size(); ++t)
      LT_CHECK_INPUT(v[t] >= 0 && v[t] < vocab, op, ": token id ", v[t], " at position ", t,
                     " is outside the vocabulary [0, ", vocab, ")");
  } else {
    LT_CHECK(ids.device() == d, op, ": ids ", ids.str(), " for a weight on ", d.str());
  }
  return cu::on_device_ws(ids, d);
}

void throw_if_bad(const cu::BadIndexFlag& flag, const Tensor& ids, int64_t vocab, const char* op) {
  const int64_t bad = flag.first_bad();
  if (bad < 0) return;
  const int64_t id = ids.narrow(0, bad, 1).to_i64()[0];
  LT_THROW(ErrorKind::kInput, op, ": token id ", id, " at position ", bad,
           " is outside the vocabulary [0, ", vocab, ")");
}

}  // namespace

void embedding_fwd_cuda(const Tensor& weight, const Tensor& ids, const Tensor& y) {
  const char* op = "embedding";
  const Device d = weight.device();
  LT_CHECK(d.is_cuda() && weight.dim() == 2, op, ": weight ", weight.str());
  const int64_t vocab = weight.size(0), h = weight.size(1), n = ids.numel();
  cu::check_operand(y, d, op, "y");
  LT_CHECK(y.shape() == (Shape{n, h}) && y.dtype() == weight.dtype(), op, ": y ", y.str(),
           " for weight ", weight.str(), " and ids ", ids.str());
  LT_CHECK(n < (int64_t{1} << 31) && vocab < (int64_t{1} << 31), op, ": sizes out of range");
  cu::DeviceGuard g(d);
  cudaStream_t s = cu::stream_of(d);
  const Tensor idd = checked_ids(ids, vocab, d, op);
  const Tensor wc = cu::contiguous_ws(weight);
  if (n == 0 || h == 0) return;
  cu::BadIndexFlag flag(d, s);
  cu::gather_rows(wc.data_ptr(), idd.data_ptr(), idd.dtype(), y.data_ptr(), n, vocab,
                  h * static_cast<int64_t>(wc.element_size()), wc.element_size(), flag.ptr(), d, s);
  if (ids.device().is_cuda()) throw_if_bad(flag, idd, vocab, op);
}

void embedding_bwd_cuda(const Tensor& dy, const Tensor& ids, const Tensor& dweight) {
  const char* op = "embedding_bwd";
  const Device d = dweight.device();
  LT_CHECK(d.is_cuda() && dweight.dim() == 2 && dtype_is_floating(dweight.dtype()), op,
           ": dweight ", dweight.str());
  cu::check_contiguous(dweight, op, "dweight");
  cu::check_on(dy, d, op, "dy");
  const int64_t vocab = dweight.size(0), h = dweight.size(1), n = ids.numel();
  LT_CHECK(dy.shape() == (Shape{n, h}) && dtype_is_floating(dy.dtype()), op, ": dy ", dy.str(),
           " for ids ", ids.str(), " and dweight ", dweight.str());
  LT_CHECK(n < (int64_t{1} << 31) && vocab < (int64_t{1} << 31) - 1, op, ": sizes out of range");
  cu::DeviceGuard g(d);
  cudaStream_t s = cu::stream_of(d);
  const Tensor idd = checked_ids(ids, vocab, d, op);
  // The CPU path rounds dy to dweight's dtype before summing; so does this one.
  Tensor gc;
  if (dy.dtype() == dweight.dtype()) {
    gc = cu::contiguous_ws(dy);
  } else {
    gc = Tensor::empty(dy.shape(), dweight.dtype(), d, MemTag::kWorkspace);
    ops::copy(gc, dy);
  }
  cu::BadIndexFlag flag(d, s);
  embedding_bwd_launch(gc.data_ptr(), idd.data_ptr(), idd.dtype(), dweight.data_ptr(), n, vocab, h,
                       dweight.dtype(), flag.ptr(), d, s);
  if (ids.device().is_cuda()) throw_if_bad(flag, idd, vocab, op);
}

}  // namespace leantune::kernels
