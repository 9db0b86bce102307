// ContiguousParams (contiguous_params.h): builds the flat buffers, re-points parameters and grads to views of
// them, and checks that they still do.
#include "contiguous/contiguous_params.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/strides.h>

#include <sstream>
#include <unordered_set>

namespace speedtorch {
namespace {

constexpr const char* kWho = "speedtorch.ContiguousParams: ";
// Every view starts on a 64-byte boundary, as a freshly allocated tensor would: vectorized kernels (16-byte loads,
// cuBLAS) keep their fast paths. The padding between views stays zero in both buffers.
constexpr int64_t kAlignBytes = 64;

int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// True when t is exactly `view`: same storage, offset, sizes, strides, dtype and device.
bool occupies(const at::Tensor& t, const at::Tensor& view) {
  return t.defined() && t.layout() == at::kStrided && t.has_storage() && t.device() == view.device() &&
         t.scalar_type() == view.scalar_type() &&
         t.storage().unsafeGetStorageImpl() == view.storage().unsafeGetStorageImpl() &&
         t.storage_offset() == view.storage_offset() && t.sizes() == view.sizes() && t.strides() == view.strides();
}

std::string describe_tensor(const at::Tensor& t) {
  std::ostringstream out;
  out << "a " << t.sizes() << " " << t.scalar_type() << " tensor on " << t.device();
  return out.str();
}

}  // namespace

ContiguousParams::ContiguousParams(std::vector<at::Tensor> params, std::vector<std::string> names)
    : params_(std::move(params)), names_(std::move(names)) {
  TORCH_CHECK(!params_.empty(), kWho, "params must hold at least one tensor, got none");
  TORCH_CHECK(names_.empty() || names_.size() == params_.size(), kWho,
              "names must be empty or give one name per parameter: expected ", params_.size(), " names, got ",
              names_.size());
  std::unordered_set<const c10::TensorImpl*> seen;
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& p = params_[i];
    TORCH_CHECK(p.defined(), kWho, describe(i), " is an undefined tensor");
    TORCH_CHECK(p.layout() == at::kStrided, kWho, describe(i), " must be a dense (strided) tensor, got layout ",
                p.layout());
    TORCH_CHECK(p.is_cpu() || p.is_cuda(), kWho, describe(i), " must be on a CPU or CUDA device, got ", p.device());
    TORCH_CHECK(at::isFloatingType(p.scalar_type()) || at::isComplexType(p.scalar_type()), kWho, describe(i),
                " must be floating point or complex, got ", p.scalar_type());
    TORCH_CHECK(p.requires_grad(), kWho, describe(i),
                " does not require grad: a frozen parameter would be updated by the optimizer through the flat "
                "buffer (e.g. by weight decay); pass only trainable ones (p for p in params if p.requires_grad)");
    TORCH_CHECK(p.is_leaf(), kWho, describe(i),
                " must be a leaf tensor (a parameter), got a tensor computed by an operation that autograd records");
    TORCH_CHECK(!p.is_inference(), kWho, describe(i), " is an inference tensor and cannot be re-pointed");
    TORCH_CHECK(seen.insert(p.unsafeGetTensorImpl()).second, kWho, describe(i),
                " appears more than once in params; give each parameter once");
    const at::Tensor& g = p.grad();
    TORCH_CHECK(!g.defined() || (g.layout() == at::kStrided && g.sizes() == p.sizes()), kWho, describe(i),
                ".grad must be None or a dense tensor of the parameter's shape ", p.sizes(), ", got ",
                describe_tensor(g), " with layout ", g.layout());
  }

  // Groups by (device, dtype) in order of first appearance; offsets aligned.
  slots_.resize(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& p = params_[i];
    size_t g = 0;
    while (g < groups_.size() && (groups_[g].device != p.device() || groups_[g].dtype != p.scalar_type())) ++g;
    if (g == groups_.size()) groups_.emplace_back(p.device(), p.scalar_type());
    const int64_t align = std::max<int64_t>(1, kAlignBytes / static_cast<int64_t>(p.element_size()));
    slots_[i].group = static_cast<int64_t>(g);
    slots_[i].offset = round_up(groups_[g].numel, align);
    groups_[g].numel = slots_[i].offset + p.numel();
  }

  // Copies that must not be recorded by autograd; the flat buffers start zeroed so the padding is zero.
  at::NoGradGuard no_grad;
  for (Group& g : groups_) {
    const auto options = at::TensorOptions().device(g.device).dtype(g.dtype);
    g.data = at::zeros({g.numel}, options);
    g.flat = g.data.detach();  // the leaf handed out; g.data keeps the buffer's place for the checks
    g.grad = at::zeros({g.numel}, options);
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i];
    Slot& s = slots_[i];
    Group& g = groups_[s.group];
    // Keep the parameter's memory format (e.g. channels_last convolution weights) when it is dense.
    const c10::DimVector strides =
        p.is_non_overlapping_and_dense() ? c10::DimVector(p.strides()) : c10::contiguous_strides(p.sizes());
    s.data_view = g.data.as_strided(p.sizes(), strides, s.offset);
    s.grad_view = g.grad.as_strided(p.sizes(), strides, s.offset);
    s.data_view.copy_(p.detach());
    if (p.grad().defined()) s.grad_view.copy_(p.grad().detach());
    p.set_data(s.data_view);
    // The parameter is now a view of the flat buffer: like a real view, it shares the buffer's version counter, so
    // an optimizer step between forward and backward is caught by autograd instead of giving wrong gradients.
    p.unsafeGetTensorImpl()->set_version_counter(g.data.unsafeGetTensorImpl()->version_counter());
    // An existing dense .grad is accumulated into in place by autograd (AccumulateGrad), so gradients land here.
    p.mutable_grad() = s.grad_view;
  }
  for (Group& g : groups_) {
    g.flat.requires_grad_(true);
    g.flat.mutable_grad() = g.grad;
  }
}

std::vector<at::Tensor> ContiguousParams::contiguous() const {
  std::vector<at::Tensor> out;
  out.reserve(groups_.size());
  for (const Group& g : groups_) out.push_back(g.flat);
  return out;
}

std::vector<at::Tensor> ContiguousParams::grad_buffers() const {
  std::vector<at::Tensor> out;
  out.reserve(groups_.size());
  for (const Group& g : groups_) out.push_back(g.grad);
  return out;
}

int64_t ContiguousParams::group_of(int64_t i) const {
  TORCH_CHECK(i >= 0 && i < num_params(), kWho, "parameter index must be in [0, ", num_params(), "), got ", i);
  return slots_[i].group;
}

int64_t ContiguousParams::offset_of(int64_t i) const {
  TORCH_CHECK(i >= 0 && i < num_params(), kWho, "parameter index must be in [0, ", num_params(), "), got ", i);
  return slots_[i].offset;
}

std::string ContiguousParams::describe(size_t i) const {
  std::ostringstream out;
  out << "parameter " << i;
  if (!names_.empty()) out << " ('" << names_[i] << "')";
  return out.str();
}

std::string ContiguousParams::data_problem(size_t i) const {
  const at::Tensor& p = params_[i];
  const Slot& s = slots_[i];
  if (occupies(p, s.data_view)) return {};
  const Group& g = groups_[s.group];
  std::ostringstream out;
  out << kWho << describe(i);
  if (p.device() != g.device || p.scalar_type() != g.dtype) {
    out << " was moved or converted after wrapping (module.to(), .cuda(), .double() ... replace parameter data): it "
        << "is now " << describe_tensor(p) << " and no longer a view of the flat buffer of group " << s.group << " ("
        << g.device << ", " << g.dtype << "). Move or convert the model first, then create ContiguousParams.";
  } else {
    out << " was replaced instead of updated in place (p.data = t, load_state_dict(assign=True) ... do this): it "
        << "is " << describe_tensor(p) << " outside the flat buffer of group " << s.group
        << ". Update parameters in place (p.copy_(t) under torch.no_grad()).";
  }
  return out.str();
}

std::optional<std::string> ContiguousParams::first_invalid() const {
  for (size_t i = 0; i < params_.size(); ++i) {
    std::string problem = data_problem(i);
    if (!problem.empty()) return problem;
    const at::Tensor& grad = params_[i].grad();
    const Slot& s = slots_[i];
    if (occupies(grad, s.grad_view)) continue;
    std::ostringstream out;
    out << kWho << describe(i);
    if (!grad.defined()) {
      out << ".grad is None: it was set to None (module.zero_grad() and optimizer.zero_grad() do so by default), "
          << "so the next backward writes a new tensor outside the flat gradient buffer. Call "
          << "ContiguousParams.zero_grad() instead (or zero_grad(set_to_none=False)).";
    } else {
      out << ".grad was replaced instead of accumulated in place, so it is outside the flat gradient buffer of group "
          << s.group << " (backward(create_graph=True), DDP with gradient_as_bucket_view=True, or p.grad = t do "
          << "this); it is " << describe_tensor(grad) << ".";
    }
    return out.str();
  }
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const Group& g = groups_[gi];
    std::ostringstream out;
    out << kWho << "the flat parameter of group " << gi << " (" << g.device << ", " << g.dtype << ")";
    if (!occupies(g.flat, g.data)) {
      out << " was replaced instead of updated in place (flat.data = t does this): it is " << describe_tensor(g.flat)
          << " and no longer holds the parameters. Update it in place.";
      return out.str();
    }
    const at::Tensor& grad = g.flat.grad();
    if (occupies(grad, g.grad)) continue;
    if (!grad.defined()) {
      out << " has .grad None: it was set to None (optimizer.zero_grad() does so by default), so the optimizer "
          << "skips it. Call ContiguousParams.zero_grad() instead (or optimizer.zero_grad(set_to_none=False)).";
    } else {
      out << " has a .grad that is not the flat gradient buffer (it was replaced: " << describe_tensor(grad)
          << "); update gradients in place.";
    }
    return out.str();
  }
  return std::nullopt;
}

void ContiguousParams::assert_buffer_is_valid() const {
  std::optional<std::string> problem = first_invalid();
  TORCH_CHECK(!problem.has_value(), *problem);
}

void ContiguousParams::zero_grad() {
  // Re-pointing a .grad at a buffer of another device or dtype would only move the error elsewhere.
  for (size_t i = 0; i < params_.size(); ++i) {
    std::string problem = data_problem(i);
    TORCH_CHECK(problem.empty(), problem);
  }
  at::NoGradGuard no_grad;
  for (Group& g : groups_) {
    g.grad.zero_();
    if (!occupies(g.flat.grad(), g.grad)) g.flat.mutable_grad() = g.grad;
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!occupies(params_[i].grad(), slots_[i].grad_view)) params_[i].mutable_grad() = slots_[i].grad_view;
  }
}

}  // namespace speedtorch
