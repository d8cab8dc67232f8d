// Rank-order folds (engine/comm_fold.h): the arithmetic of every deterministic reduction.
#include "engine/comm_fold.h"

#include <algorithm>
#include <cstring>

#include "engine/check.h"
#include "engine/enum_names.h"

namespace leantune::comm_detail {
namespace {

template <typename Acc>
Acc combine(Acc a, Acc b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return a + b;
    case ReduceOp::kMax:
      // NaN wins, as torch.maximum: a max that hides a NaN would hide a broken rank.
      if (a != a) return a;
      if (b != b) return b;
      return std::max(a, b);
    case ReduceOp::kMin:
      if (a != a) return a;
      if (b != b) return b;
      return std::min(a, b);
  }
  return a;
}

// Load/Store convert between the stored type and the accumulator.
template <typename Stored, typename Acc, typename Load, typename Store>
void fold(const void* in, int64_t num_ranks, int64_t n, ReduceOp op, void* out, Load load,
          Store store) {
  const Stored* src = static_cast<const Stored*>(in);
  Stored* dst = static_cast<Stored*>(out);
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    Acc acc = load(src[i]);
    for (int64_t r = 1; r < num_ranks; ++r) acc = combine<Acc>(acc, load(src[r * n + i]), op);
    if (op == ReduceOp::kAvg) acc = acc / static_cast<Acc>(num_ranks);
    dst[i] = store(acc);
  }
}

}  // namespace

bool comm_dtype_reducible(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kF64:
    case DType::kBF16:
    case DType::kF16:
    case DType::kI64:
    case DType::kI32:
      return true;
    default:
      return false;
  }
}

bool comm_dtype_movable(DType dtype) {
  if (comm_dtype_reducible(dtype)) return true;
  switch (dtype) {
    case DType::kI8:
    case DType::kU8:
    case DType::kBool:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kU32:
    case DType::kU64:
      return true;
    default:
      return false;  // 16-bit integers: NCCL has no integer type of that width
  }
}

void check_comm_dtype(DType dtype, const char* what, CommUse use) {
  const bool reduces = use == CommUse::kReduce;
  LT_CHECK(reduces ? comm_dtype_reducible(dtype) : comm_dtype_movable(dtype), "comm ", what,
           ": unsupported dtype ", dtype_name(dtype),
           reduces && comm_dtype_movable(dtype) ? " (it can be moved, not reduced)" : "");
}

void check_scatter_blocks(const Tensor& in, const Tensor& out, int size, const char* what) {
  LT_CHECK(in.dtype() == out.dtype() && in.numel() == out.numel() * size, what, ": in ", in.str(),
           " must hold ", size, " blocks of out ", out.str());
}

void check_gather_blocks(const Tensor& in, const Tensor& out, int size, const char* what) {
  LT_CHECK(in.dtype() == out.dtype() && out.numel() == in.numel() * size, what, ": out ", out.str(),
           " must hold ", size, " blocks of in ", in.str());
}

const char* reduce_op_name(ReduceOp op) {
  static constexpr const char* kNames[] = {"sum", "avg", "max", "min"};
  static_assert(std::size(kNames) == static_cast<size_t>(ReduceOp::kMin) + 1);
  return enum_name(op, kNames, "?");
}

void fold_rank_order(const void* in, int64_t num_ranks, int64_t n, DType dtype, ReduceOp op,
                     void* out) {
  LT_CHECK(num_ranks >= 1 && n >= 0, "fold_rank_order: ", num_ranks, " ranks, ", n, " elements");
  switch (dtype) {
    case DType::kF32:
      fold<float, float>(
          in, num_ranks, n, op, out, [](float v) { return v; }, [](float v) { return v; });
      return;
    case DType::kF64:
      fold<double, double>(
          in, num_ranks, n, op, out, [](double v) { return v; }, [](double v) { return v; });
      return;
    case DType::kBF16:
      fold<uint16_t, float>(
          in, num_ranks, n, op, out, [](uint16_t v) { return bf16_to_f32(v); },
          [](float v) { return f32_to_bf16(v); });
      return;
    case DType::kF16:
      fold<uint16_t, float>(
          in, num_ranks, n, op, out, [](uint16_t v) { return f16_to_f32(v); },
          [](float v) { return f32_to_f16(v); });
      return;
    case DType::kI64:
      LT_CHECK(op != ReduceOp::kAvg, "comm: avg of an integer tensor");
      fold<int64_t, int64_t>(
          in, num_ranks, n, op, out, [](int64_t v) { return v; }, [](int64_t v) { return v; });
      return;
    case DType::kI32:
      LT_CHECK(op != ReduceOp::kAvg, "comm: avg of an integer tensor");
      fold<int32_t, int64_t>(
          in, num_ranks, n, op, out, [](int32_t v) { return int64_t{v}; },
          [](int64_t v) { return static_cast<int32_t>(v); });
      return;
    default:
      LT_THROW(ErrorKind::kInternal, "comm: unsupported dtype ", dtype_name(dtype));
  }
}

}  // namespace leantune::comm_detail
