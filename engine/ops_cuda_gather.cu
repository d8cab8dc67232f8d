// CUDA row gather: index_rows (contract in engine/ops_cuda_internal.cuh) and cu::gather_rows, the
// one row-gather kernel, shared with the embedding forward (kernels/embedding.cu).
#include "engine/ops_cuda_internal.cuh"

namespace leantune::cuda_ops {
namespace {

// out[i, :] = table[ids[i], :], moved as raw words of kBytes; a bad id leaves its row unwritten
// and is reported.
template <typename I, int kBytes>
__global__ void gather_rows_kernel(const void* __restrict__ table, const I* __restrict__ ids,
                                   void* __restrict__ out, int64_t n, int64_t v_rows,
                                   int64_t words_per_row, unsigned long long* first_bad) {
  using R = typename RawOf<kBytes>::type;
  const R* t = static_cast<const R*>(table);
  R* o = static_cast<R*>(out);
  const int64_t total = n * words_per_row;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e / words_per_row, w = e % words_per_row;
    const int64_t id = static_cast<int64_t>(ids[i]);
    if (id < 0 || id >= v_rows) {
      if (w == 0) cu::report_bad_index(first_bad, i);
      continue;
    }
    o[e] = t[id * words_per_row + w];
  }
}

}  // namespace
}  // namespace leantune::cuda_ops

namespace leantune::cu {

void gather_rows(const void* table, const void* ids, DType id_type, void* out, int64_t n,
                 int64_t v_rows, int64_t row_bytes, size_t elem_bytes,
                 unsigned long long* first_bad, Device dev, cudaStream_t stream) {
  using cuda_ops::gather_rows_kernel;
  using cuda_ops::detail::kThreads;
  if (n == 0 || row_bytes == 0) return;
  const bool w16 = row_bytes % 16 == 0 && aligned16(table) && aligned16(out);
  const int word = w16 ? 16 : static_cast<int>(elem_bytes);
  const int64_t words = row_bytes / word;
  const unsigned blocks = cuda_ops::detail::blocks_for(n * words, dev);
  LT_CU_DISPATCH_INDEX(id_type, I, {
    const I* pi = static_cast<const I*>(ids);
    switch (word) {
      case 16:
        gather_rows_kernel<I, 16>
            <<<blocks, kThreads, 0, stream>>>(table, pi, out, n, v_rows, words, first_bad);
        break;
      case 8:
        gather_rows_kernel<I, 8>
            <<<blocks, kThreads, 0, stream>>>(table, pi, out, n, v_rows, words, first_bad);
        break;
      case 4:
        gather_rows_kernel<I, 4>
            <<<blocks, kThreads, 0, stream>>>(table, pi, out, n, v_rows, words, first_bad);
        break;
      case 2:
        gather_rows_kernel<I, 2>
            <<<blocks, kThreads, 0, stream>>>(table, pi, out, n, v_rows, words, first_bad);
        break;
      case 1:
        gather_rows_kernel<I, 1>
            <<<blocks, kThreads, 0, stream>>>(table, pi, out, n, v_rows, words, first_bad);
        break;
      default:
        LT_THROW(ErrorKind::kInternal, "gather_rows: element size ", word);
    }
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace leantune::cu

namespace leantune::cuda_ops {

Tensor index_rows(const Tensor& table0, const Tensor& ids0) {
  LT_CHECK(table0.dim() == 2 && ids0.dim() == 1, "index_rows: table ", table0.str(), ", ids ",
           ids0.str());
  const Device d = table0.device();
  cu::DeviceGuard g(d);
  cudaStream_t s = cu::stream_of(d);
  Tensor table = contiguous_on_device(table0, current_mem_tag());
  Tensor ids = ids0;
  if (ids.device().is_cpu()) {
    // Host ids: check them here (no device flag and no synchronisation needed).
    Tensor hi = ids.dtype() == DType::kI64 ? ids.contiguous() : ids.to(DType::kI64);
    const int64_t* p = hi.data<int64_t>();
    for (int64_t i = 0; i < hi.numel(); ++i)
      LT_CHECK(p[i] >= 0 && p[i] < table.size(0), "index_rows: id ", p[i], " out of range [0, ",
               table.size(0), ")");
    ids = hi.to(d);
  } else {
    check_same_device(table, ids, "index_rows");
    ids = contiguous_on_device(ids);
  }
  const int64_t n = ids.numel(), h = table.size(1), v = table.size(0);
  Tensor out = Tensor::empty({n, h}, table.dtype(), d, current_mem_tag());
  const int64_t row_bytes = h * static_cast<int64_t>(table.element_size());
  if (n == 0 || row_bytes == 0) return out;
  cu::BadIndexFlag flag(d, s);
  cu::gather_rows(table.data_ptr(), ids.data_ptr(), ids.dtype(), out.data_ptr(), n, v, row_bytes,
                  table.element_size(), flag.ptr(), d, s);
  const int64_t bad = flag.first_bad();
  if (bad >= 0) {
    const int64_t id = ids.narrow(0, bad, 1).to_i64()[0];
    LT_THROW(ErrorKind::kInternal, "index_rows: id ", id, " at position ", bad,
             " out of range [0, ", v, ")");
  }
  return out;
}

}  // namespace leantune::cuda_ops
