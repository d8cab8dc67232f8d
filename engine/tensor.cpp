// Tensor and Storage: views, copies and autograd state (see tensor.h).
#include "engine/tensor.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <sstream>

#include "engine/autograd.h"
#include "engine/ops.h"

namespace leantune {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    LT_CHECK(d >= 0, "negative dimension in shape ", shape_str(s));
    LT_CHECK(d == 0 || n <= INT64_MAX / d, "shape ", shape_str(s), " overflows");
    n *= d;
  }
  return n;
}

Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (int64_t i = static_cast<int64_t>(s.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= std::max<int64_t>(s[i], 1);
  }
  return st;
}

// ---------------------------------------------------------------- Storage

Storage::Storage(size_t nbytes, Device device, MemTag tag, Allocator* alloc)
    : nbytes_(nbytes), device_(device), tag_(tag) {
  alloc_ = alloc ? alloc : &::leantune::allocator(device);
  if (nbytes == 0) return;
  block_ = alloc_->allocate(nbytes, tag, current_stream(alloc_->device()));
  ptr_ = Allocator::block_ptr(block_);
}

Storage::Storage(void* ptr, size_t nbytes, Device device, std::shared_ptr<void> keepalive)
    : ptr_(ptr), nbytes_(nbytes), device_(device), keepalive_(std::move(keepalive)) {}

Storage::~Storage() {
  if (block_) alloc_->free(block_);
}

MemTag Storage::tag() const { return block_ ? Allocator::block_tag(block_) : tag_; }

void Storage::set_tag(MemTag tag) {
  tag_ = tag;
  if (block_) alloc_->retag(block_, tag);
}

void Storage::release_memory() {
  LT_CHECK(!is_external(), "release_memory on external memory");
  if (released_) return;
  if (block_) {
    tag_ = Allocator::block_tag(block_);
    alloc_->free(block_);
  }
  block_ = nullptr;
  ptr_ = nullptr;
  released_ = true;
}

void Storage::restore_memory() {
  if (!released_) return;
  released_ = false;
  if (nbytes_ == 0) return;
  block_ = alloc_->allocate(nbytes_, tag_, current_stream(alloc_->device()));
  ptr_ = Allocator::block_ptr(block_);
}

void Storage::record_stream(const Stream& s) {
  if (block_) alloc_->record_stream(block_, s);
}

// ---------------------------------------------------------------- creation

namespace {
std::shared_ptr<TensorImpl> new_impl(const Shape& shape, DType dtype, std::shared_ptr<Storage> st) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(st);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return impl;
}
}  // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device, MemTag tag) {
  const int64_t n = shape_numel(shape);
  const size_t bytes = static_cast<size_t>(n) * dtype_size(dtype);
  return Tensor(new_impl(shape, dtype, std::make_shared<Storage>(bytes, device, tag)));
}

Tensor Tensor::empty_pinned(const Shape& shape, DType dtype, MemTag tag) {
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  return Tensor(new_impl(
      shape, dtype, std::make_shared<Storage>(bytes, Device::cpu(), tag, &pinned_allocator())));
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device, MemTag tag) {
  Tensor t = empty(shape, dtype, device, tag);
  t.fill_(0.0);
  return t;
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device, MemTag tag) {
  Tensor t = empty(shape, dtype, device, tag);
  t.fill_(value);
  return t;
}

Tensor Tensor::from_doubles(const std::vector<double>& v, const Shape& shape, DType dtype,
                            Device device, MemTag tag) {
  Tensor src = from_vector(v, shape, Device::cpu(), tag);
  Tensor out = empty(shape, dtype, device, tag);
  ops::copy(out, src);
  return out;
}

Tensor Tensor::scalar(double v, DType dtype, Device device) {
  return from_doubles({v}, {}, dtype, device, MemTag::kOther);
}

Tensor Tensor::from_blob(void* ptr, const Shape& shape, DType dtype, Device device,
                         std::shared_ptr<void> keepalive) {
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  return Tensor(
      new_impl(shape, dtype, std::make_shared<Storage>(ptr, bytes, device, std::move(keepalive))));
}

// ---------------------------------------------------------------- metadata

void Tensor::check_defined() const { LT_CHECK(impl_ != nullptr, "use of an undefined tensor"); }
const Shape& Tensor::shape() const {
  check_defined();
  return impl_->shape;
}
const Shape& Tensor::strides() const {
  check_defined();
  return impl_->strides;
}
int64_t Tensor::size(int64_t d) const {
  const int64_t nd = dim();
  if (d < 0) d += nd;
  LT_CHECK(d >= 0 && d < nd, "dimension ", d, " out of range for ", str());
  return impl_->shape[d];
}
int64_t Tensor::numel() const { return shape_numel(shape()); }
int64_t Tensor::offset() const {
  check_defined();
  return impl_->offset;
}
DType Tensor::dtype() const {
  check_defined();
  return impl_->dtype;
}
Device Tensor::device() const {
  check_defined();
  return impl_->storage->device();
}
MemTag Tensor::tag() const {
  check_defined();
  return impl_->storage->tag();
}
bool Tensor::is_contiguous() const {
  check_defined();
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (impl_->shape[i] == 1) continue;
    if (impl_->strides[i] != expected) return false;
    expected *= impl_->shape[i];
  }
  return true;
}
std::string Tensor::str() const {
  if (!impl_) return "<undefined>";
  std::string s = shape_str(impl_->shape) + " " + dtype_name(impl_->dtype) + " " + device().str();
  if (!impl_->name.empty()) s = impl_->name + " " + s;
  return s;
}
const std::string& Tensor::name() const {
  check_defined();
  return impl_->name;
}
Tensor& Tensor::set_name(std::string name) {
  check_defined();
  impl_->name = std::move(name);
  return *this;
}
void* Tensor::data_ptr() const {
  check_defined();
  if (!impl_->storage->data()) {
    LT_CHECK(!impl_->storage->memory_released(), "tensor ", str(),
             ": its memory is released (a ZeRO-3 parameter used outside its gathered unit)");
    return nullptr;
  }
  return static_cast<char*>(impl_->storage->data()) +
         impl_->offset * static_cast<int64_t>(dtype_size(impl_->dtype));
}
const std::shared_ptr<Storage>& Tensor::storage() const {
  check_defined();
  return impl_->storage;
}
bool Tensor::shares_storage(const Tensor& o) const {
  return defined() && o.defined() && impl_->storage == o.impl_->storage;
}

bool sole_contiguous(const Tensor& t) {
  return t.defined() && t.impl_ptr().use_count() == 1 && t.storage().use_count() == 1 &&
         t.is_contiguous();
}

Tensor make_view(const Tensor& base, const Shape& shape, const Shape& strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = base.dtype();
  impl->is_param = base.is_param();
  return Tensor(impl);
}

// ---------------------------------------------------------------- views

namespace {
// Backward of a view: maps the output gradient to the input's shape.
class ViewBackward final : public Node {
 public:
  using Fn = std::function<Tensor(const Tensor&)>;
  ViewBackward(std::string name, Fn fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override { return {fn_(grads[0])}; }
  std::string name() const override { return name_; }

 private:
  std::string name_;
  Fn fn_;
};

Tensor with_view_history(const Tensor& in, Tensor out, std::string name, ViewBackward::Fn fn) {
  if (node_needed({in})) {
    auto node = std::make_shared<ViewBackward>(std::move(name), std::move(fn));
    node->set_next_edges({in});
    set_history(out, node);
  }
  return out;
}

int64_t wrap_dim(int64_t d, int64_t nd, const Tensor& t) {
  if (d < 0) d += nd;
  LT_CHECK(d >= 0 && d < nd, "dimension ", d, " out of range for ", t.str());
  return d;
}

Shape infer_shape(const Shape& shape, int64_t numel, const Tensor& t) {
  Shape out = shape;
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      LT_CHECK(infer < 0, "reshape of ", t.str(), " to ", shape_str(shape), ": two -1");
      infer = static_cast<int>(i);
    } else {
      LT_CHECK(out[i] >= 0, "reshape to ", shape_str(shape));
      known *= out[i];
    }
  }
  if (infer >= 0) {
    LT_CHECK(known > 0 && numel % known == 0, "cannot reshape ", t.str(), " to ", shape_str(shape));
    out[infer] = numel / known;
  }
  LT_CHECK(shape_numel(out) == numel, "cannot reshape ", t.str(), " to ", shape_str(shape));
  return out;
}
}  // namespace

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  d = wrap_dim(d, dim(), *this);
  LT_CHECK(start >= 0 && length >= 0 && start + length <= impl_->shape[d], "narrow(", d, ", ",
           start, ", ", length, ") out of range for ", str());
  Shape shape = impl_->shape;
  shape[d] = length;
  Tensor out = make_view(*this, shape, impl_->strides, impl_->offset + start * impl_->strides[d]);
  Shape in_shape = impl_->shape;
  return with_view_history(*this, out, "NarrowBackward", [=](const Tensor& g) {
    Tensor gi = Tensor::zeros(in_shape, g.dtype(), g.device(), g.tag());
    gi.narrow(d, start, length).copy_(g);
    return gi;
  });
}

Tensor Tensor::view(const Shape& shape) const {
  LT_CHECK(is_contiguous(), "view of non-contiguous ", str(), "; use reshape");
  Shape s = infer_shape(shape, numel(), *this);
  Tensor out = make_view(*this, s, contiguous_strides(s), impl_->offset);
  Shape in_shape = impl_->shape;
  return with_view_history(*this, out, "ViewBackward",
                           [in_shape](const Tensor& g) { return g.reshape(in_shape); });
}

Tensor Tensor::reshape(const Shape& shape) const {
  if (is_contiguous()) return view(shape);
  return contiguous().view(shape);
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  d0 = wrap_dim(d0, dim(), *this);
  d1 = wrap_dim(d1, dim(), *this);
  Shape shape = impl_->shape, strides = impl_->strides;
  std::swap(shape[d0], shape[d1]);
  std::swap(strides[d0], strides[d1]);
  Tensor out = make_view(*this, shape, strides, impl_->offset);
  return with_view_history(*this, out, "TransposeBackward",
                           [d0, d1](const Tensor& g) { return g.transpose(d0, d1); });
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  d = wrap_dim(d, dim(), *this);
  Tensor n = narrow(d, index, 1);
  Shape shape = n.shape();
  shape.erase(shape.begin() + d);
  if (n.is_contiguous()) return n.view(shape);
  Shape strides = n.strides();
  strides.erase(strides.begin() + d);
  Tensor out = make_view(n, shape, strides, n.offset());
  Shape nshape = n.shape();
  return with_view_history(n, out, "SelectBackward",
                           [nshape](const Tensor& g) { return g.reshape(nshape); });
}

// ---------------------------------------------------------------- copies

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  Tensor out = Tensor::empty(shape(), dtype(), device(), current_mem_tag());
  ops::copy(out, detach());
  return with_view_history(*this, out, "ContiguousBackward", [](const Tensor& g) { return g; });
}

Tensor Tensor::clone(MemTag tag) const {
  Tensor out = Tensor::empty(shape(), dtype(), device(), tag);
  ops::copy(out, *this);
  return with_view_history(*this, out, "CloneBackward", [](const Tensor& g) { return g; });
}

Tensor Tensor::to(Device device) const {
  if (device == this->device()) return *this;
  return to(device, dtype(), tag());
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == this->dtype()) return *this;
  return to(device(), dtype, tag());
}

Tensor Tensor::to(Device device, DType dtype, MemTag tag) const {
  Tensor out = Tensor::empty(shape(), dtype, device, tag);
  ops::copy(out, *this);
  if (dtype_is_floating(dtype) && dtype_is_floating(this->dtype())) {
    DType src_dt = this->dtype();
    Device src_dev = this->device();
    MemTag src_tag = this->tag();
    return with_view_history(*this, out, "ToBackward",
                             [=](const Tensor& g) { return g.to(src_dev, src_dt, src_tag); });
  }
  return out;
}

Tensor& Tensor::copy_(const Tensor& src) {
  ops::copy(*this, src);
  return *this;
}

Tensor& Tensor::fill_(double value) {
  ops::fill(*this, value);
  return *this;
}

std::vector<double> Tensor::to_f64() const {
  Tensor host = Tensor::empty(shape(), DType::kF64, Device::cpu(), MemTag::kOther);
  ops::copy(host, *this);
  const double* p = host.data<double>();
  return std::vector<double>(p, p + host.numel());
}

std::vector<float> Tensor::to_f32() const {
  Tensor host = Tensor::empty(shape(), DType::kF32, Device::cpu(), MemTag::kOther);
  ops::copy(host, *this);
  const float* p = host.data<float>();
  return std::vector<float>(p, p + host.numel());
}

std::vector<int64_t> Tensor::to_i64() const {
  Tensor host = Tensor::empty(shape(), DType::kI64, Device::cpu(), MemTag::kOther);
  ops::copy(host, *this);
  const int64_t* p = host.data<int64_t>();
  return std::vector<int64_t>(p, p + host.numel());
}

double Tensor::item() const {
  LT_CHECK(numel() == 1, "item() of ", str(), " with ", numel(), " elements");
  return to_f64()[0];
}

// ---------------------------------------------------------------- autograd

bool Tensor::requires_grad() const {
  return impl_ && (impl_->requires_grad || impl_->grad_fn != nullptr);
}
Tensor& Tensor::set_requires_grad(bool on) {
  check_defined();
  LT_CHECK(!impl_->grad_fn || on, "cannot clear requires_grad of a non-leaf tensor ", str());
  if (on) LT_CHECK(dtype_is_floating(dtype()), "requires_grad on non-float tensor ", str());
  impl_->requires_grad = on;
  return *this;
}
bool Tensor::is_leaf() const { return impl_ && impl_->grad_fn == nullptr; }
Tensor Tensor::grad() const {
  check_defined();
  return impl_->grad;
}
void Tensor::set_grad(const Tensor& g) {
  check_defined();
  if (g.defined()) LT_CHECK(g.shape() == shape(), "grad ", g.str(), " does not match ", str());
  impl_->grad = g;
}
void Tensor::zero_grad() {
  check_defined();
  impl_->grad = Tensor();
}
const std::shared_ptr<Node>& Tensor::grad_fn() const {
  check_defined();
  return impl_->grad_fn;
}
uint32_t Tensor::output_nr() const {
  check_defined();
  return impl_->output_nr;
}
Tensor Tensor::detach() const {
  check_defined();
  return make_view(*this, impl_->shape, impl_->strides, impl_->offset);
}
void Tensor::backward(const Tensor& grad, bool retain_graph) const {
  leantune::backward({*this}, {grad}, retain_graph);
}
bool Tensor::is_param() const { return impl_ && impl_->is_param; }
Tensor& Tensor::set_param(bool on) {
  check_defined();
  impl_->is_param = on;
  return *this;
}

}  // namespace leantune
