// Tensor: a shape, strides and dtype over a Storage that may be shared between views.
//
// Storage comes from the caching allocator of its device, with a MemTag, or wraps external
// memory (an mmapped file) that is kept alive by the storage. Views (narrow, reshape and view
// of contiguous data, transpose) share storage; contiguous() and clone() copy.
//
// Autograd state lives on the tensor: requires_grad, grad, and grad_fn (the node that produced
// it). View methods record autograd history when the input requires grad and grad mode is on.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/allocator.h"
#include "engine/check.h"
#include "engine/device.h"
#include "engine/dtype.h"
#include "engine/stream.h"

namespace leantune {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);
Shape contiguous_strides(const Shape& s);

class Storage {
 public:
  // Memory from the allocator of `device` (or `alloc` when given), bound to the current stream.
  Storage(size_t nbytes, Device device, MemTag tag, Allocator* alloc = nullptr);
  // External memory, not owned by any allocator; `keepalive` keeps it valid.
  Storage(void* ptr, size_t nbytes, Device device, std::shared_ptr<void> keepalive);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return ptr_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  MemTag tag() const;
  void set_tag(MemTag tag);
  bool is_external() const { return block_ == nullptr && nbytes_ > 0 && keepalive_ != nullptr; }
  bool is_pinned() const { return alloc_ == &pinned_allocator(); }
  Allocator* allocator() const { return alloc_; }
  // The block may be in use on `s` too: its reuse after free waits for `s`.
  void record_stream(const Stream& s);
  // Gives the memory back to its allocator and keeps the Storage, so that every Tensor and saved
  // tensor over it stays valid (ZeRO-3 parameters between uses); data() is nullptr and reading
  // or writing through a Tensor is an Error until restore_memory(). Allocator-backed only.
  void release_memory();
  // A fresh block of the same size and tag, on the current stream (contents undefined).
  void restore_memory();
  bool memory_released() const { return released_; }

 private:
  Allocator* alloc_ = nullptr;
  Block* block_ = nullptr;
  void* ptr_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  MemTag tag_ = MemTag::kOther;
  std::shared_ptr<void> keepalive_;
  bool released_ = false;
};

class Node;
struct TensorImpl;

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- creation
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu(),
                      MemTag tag = current_mem_tag());
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu(),
                      MemTag tag = current_mem_tag());
  static Tensor full(const Shape& shape, double value, DType dtype, Device device = Device::cpu(),
                     MemTag tag = current_mem_tag());
  // Pinned host memory (pinned_allocator()).
  static Tensor empty_pinned(const Shape& shape, DType dtype, MemTag tag = current_mem_tag());
  // Host values of type T (float, double, int32_t, int64_t, uint8_t, ...) -> dtype of T.
  template <typename T>
  static Tensor from_vector(const std::vector<T>& v, const Shape& shape,
                            Device device = Device::cpu(), MemTag tag = MemTag::kOther);
  // Double values converted to any dtype (rounded to nearest even for bf16/f16).
  static Tensor from_doubles(const std::vector<double>& v, const Shape& shape, DType dtype,
                             Device device = Device::cpu(), MemTag tag = MemTag::kOther);
  static Tensor scalar(double v, DType dtype = DType::kF32, Device device = Device::cpu());
  // Wraps external memory without copying (e.g. an mmapped safetensors file).
  static Tensor from_blob(void* ptr, const Shape& shape, DType dtype, Device device,
                          std::shared_ptr<void> keepalive);

  // ---- metadata
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  const Shape& strides() const;
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  int64_t size(int64_t d) const;
  int64_t numel() const;
  int64_t offset() const;  // in elements
  DType dtype() const;
  Device device() const;
  size_t element_size() const { return dtype_size(dtype()); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(); }
  bool is_contiguous() const;
  MemTag tag() const;
  std::string str() const;  // "[2, 3] bf16 cpu"
  const std::string& name() const;
  Tensor& set_name(std::string name);

  void* data_ptr() const;
  template <typename T>
  T* data() const {
    LT_CHECK(dtype() == DTypeOf<T>::value, "tensor ", str(), " accessed as ",
             dtype_name(DTypeOf<T>::value));
    return static_cast<T*>(data_ptr());
  }
  const std::shared_ptr<Storage>& storage() const;
  bool shares_storage(const Tensor& o) const;

  // ---- views (share storage; record autograd when needed)
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  // -1 infers one dimension. A view when contiguous, else a copy.
  Tensor reshape(const Shape& shape) const;
  // Like reshape but requires contiguous data.
  Tensor view(const Shape& shape) const;
  Tensor flatten() const { return reshape({numel()}); }
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor select(int64_t dim, int64_t index) const;  // narrow + drop the dim

  // ---- copies and conversions
  Tensor contiguous() const;
  Tensor clone(MemTag tag = current_mem_tag()) const;
  Tensor to(Device device) const;
  Tensor to(DType dtype) const;
  Tensor to(Device device, DType dtype, MemTag tag) const;
  Tensor& copy_(const Tensor& src);  // converts dtype and device; src may be strided
  Tensor& fill_(double value);
  Tensor& zero_() { return fill_(0.0); }

  // Values copied to the host and converted.
  std::vector<float> to_f32() const;
  std::vector<double> to_f64() const;
  std::vector<int64_t> to_i64() const;
  double item() const;

  // ---- autograd
  bool requires_grad() const;
  Tensor& set_requires_grad(bool on);
  bool is_leaf() const;
  Tensor grad() const;
  void set_grad(const Tensor& g);
  void zero_grad();  // drops the gradient (the next backward allocates it anew)
  const std::shared_ptr<Node>& grad_fn() const;
  uint32_t output_nr() const;
  // Same storage and values, no history, requires_grad false.
  Tensor detach() const;
  void backward(const Tensor& grad = Tensor(), bool retain_graph = false) const;
  // Parameters stay where they are under activation offloading.
  bool is_param() const;
  Tensor& set_param(bool on);

  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

 private:
  void check_defined() const;
  std::shared_ptr<TensorImpl> impl_;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;
  Shape shape;
  Shape strides;
  DType dtype = DType::kF32;
  bool requires_grad = false;
  bool is_param = false;
  std::shared_ptr<Node> grad_fn;
  uint32_t output_nr = 0;
  Tensor grad;
  // Gradients accumulate in this dtype when set (e.g. f32 grads for bf16 weights).
  bool grad_dtype_set = false;
  DType grad_dtype = DType::kF32;
  std::weak_ptr<Node> grad_accumulator;
  std::string name;
};

// Makes a tensor with the given metadata over existing storage (no copy).
Tensor make_view(const Tensor& base, const Shape& shape, const Shape& strides, int64_t offset);

// Whether t is the only handle on its storage (no other tensor, view or saved copy can see a write
// into it) and contiguous: a callee handed t may then reuse its memory for an output.
bool sole_contiguous(const Tensor& t);

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& v, const Shape& shape, Device device, MemTag tag) {
  static_assert(std::is_trivially_copyable_v<T>);
  LT_CHECK(static_cast<int64_t>(v.size()) == shape_numel(shape), "from_vector: ", v.size(),
           " values for shape ", shape_str(shape));
  Tensor host = empty(shape, DTypeOf<T>::value, Device::cpu(), tag);
  if (!v.empty()) std::memcpy(host.data_ptr(), v.data(), v.size() * sizeof(T));
  return device.is_cpu() ? host : host.to(device, host.dtype(), tag);
}

}  // namespace leantune
