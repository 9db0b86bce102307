// Optimizer names and options -> OptimizerHyper (see optimizer_config.h).
#include "optim/optimizer_config.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <initializer_list>
#include <sstream>
#include <vector>

namespace speedtorch {
namespace {

struct KindInfo {
  const char* name;
  OptimizerKind kind;
  float default_lr;
  std::vector<const char*> options;  // accepted besides lr and per_row_step
};

const std::vector<KindInfo>& kinds() {
  static const std::vector<KindInfo> table = {
      {"sgd", OptimizerKind::kSGD, 1e-3f, {"momentum", "dampening", "nesterov", "weight_decay"}},
      {"adagrad", OptimizerKind::kAdagrad, 1e-2f, {"lr_decay", "weight_decay", "initial_accumulator_value", "eps"}},
      {"adam", OptimizerKind::kAdam, 1e-3f, {"beta1", "beta2", "eps", "weight_decay", "amsgrad"}},
      {"adamw", OptimizerKind::kAdamW, 1e-3f, {"beta1", "beta2", "eps", "weight_decay", "amsgrad"}},
      {"adamax", OptimizerKind::kAdamax, 2e-3f, {"beta1", "beta2", "eps", "weight_decay"}},
      {"rmsprop", OptimizerKind::kRMSprop, 1e-2f, {"alpha", "eps", "weight_decay", "momentum", "centered"}},
      {"adadelta", OptimizerKind::kAdadelta, 1.0f, {"rho", "eps", "weight_decay"}},
      {"asgd", OptimizerKind::kASGD, 1e-2f, {"lambd", "alpha", "t0", "weight_decay"}},
      {"rprop", OptimizerKind::kRprop, 1e-2f, {"etaminus", "etaplus", "step_size_min", "step_size_max"}},
      {"rowwise_adagrad", OptimizerKind::kRowwiseAdagrad, 1e-2f, {"eps", "weight_decay", "initial_accumulator_value"}},
      {"rowwise_adam", OptimizerKind::kRowwiseAdam, 1e-3f, {"beta1", "beta2", "eps", "weight_decay"}},
  };
  return table;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// The option names every kind accepts besides its own.
constexpr const char* kCommonOptions[] = {"lr", "per_row_step", "stochastic_rounding"};

bool flag(double v, const char* name) {
  TORCH_CHECK(v == 0.0 || v == 1.0, "speedtorch optimizer: option '", name, "' is a flag: 0 or 1, got ", v);
  return v == 1.0;
}

}  // namespace

const char* optimizer_name(OptimizerKind kind) {
  for (const auto& k : kinds()) {
    if (k.kind == kind) return k.name;
  }
  return "unknown";
}

const char* optimizer_name(const OptimizerHyper& hyper) {
  return hyper.sparse_adam ? "sparse_adam" : optimizer_name(hyper.kind);
}

std::string canonical_optimizer_name(const std::string& kind) {
  return optimizer_name(parse_optimizer(kind, c10::Dict<std::string, double>()));
}

namespace {

// The kind `kind_name` names (sparse_adam: adam, flagged), or an error listing the known ones.
const KindInfo& find_kind(const std::string& kind_name, bool* sparse_adam) {
  std::string name = lower(kind_name);
  *sparse_adam = name == "sparse_adam" || name == "sparseadam";
  if (*sparse_adam) name = "adam";
  for (const auto& k : kinds()) {
    if (name == k.name) return k;
  }
  std::ostringstream known;
  for (const auto& k : kinds()) known << k.name << ", ";
  TORCH_CHECK(false, "speedtorch optimizer: unknown optimizer '", kind_name, "'; known: ", known.str(), "sparse_adam");
}

// torch.optim's defaults for a kind, before any option is applied.
OptimizerHyper default_hyper(const KindInfo& info) {
  OptimizerHyper h;
  h.kind = info.kind;
  h.lr = info.default_lr;
  if (h.kind == OptimizerKind::kRMSprop) h.eps = 1e-8f;
  if (h.kind == OptimizerKind::kAdagrad) h.eps = 1e-10f;
  if (h.kind == OptimizerKind::kRowwiseAdagrad) h.eps = 1e-8f;  // FBGEMM's default
  if (h.kind == OptimizerKind::kAdadelta) h.eps = 1e-6f;
  if (h.kind == OptimizerKind::kAdamW) h.weight_decay = 1e-2f;  // torch.optim.AdamW's default
  return h;
}

// The value of option `key` in `h` (the inverse of parse_optimizer's assignments).
double option_value(const OptimizerHyper& h, const std::string& key) {
  if (key == "lr") return h.lr;
  if (key == "per_row_step") return h.per_row_step ? 1.0 : 0.0;
  if (key == "stochastic_rounding") return h.stochastic_rounding ? 1.0 : 0.0;
  if (key == "momentum") return h.momentum;
  if (key == "dampening") return h.dampening;
  if (key == "nesterov") return h.nesterov ? 1.0 : 0.0;
  if (key == "weight_decay") return h.weight_decay;
  if (key == "beta1") return h.beta1;
  if (key == "beta2") return h.beta2;
  if (key == "eps") return h.eps;
  if (key == "amsgrad") return h.amsgrad ? 1.0 : 0.0;
  if (key == "alpha") return h.kind == OptimizerKind::kASGD ? h.asgd_alpha : h.alpha;
  if (key == "centered") return h.centered ? 1.0 : 0.0;
  if (key == "rho") return h.rho;
  if (key == "lr_decay") return h.lr_decay;
  if (key == "initial_accumulator_value") return h.initial_accumulator_value;
  if (key == "lambd") return h.lambd;
  if (key == "t0") return h.t0;
  if (key == "etaminus") return h.etaminus;
  if (key == "etaplus") return h.etaplus;
  if (key == "step_size_min") return h.step_size_min;
  if (key == "step_size_max") return h.step_size_max;
  TORCH_CHECK(false, "speedtorch optimizer: no option named '", key, "'");
}

}  // namespace

c10::Dict<std::string, double> optimizer_defaults(const std::string& kind_name) {
  bool sparse_adam = false;
  const KindInfo& info = find_kind(kind_name, &sparse_adam);
  const OptimizerHyper h = default_hyper(info);
  c10::Dict<std::string, double> out;
  for (const char* key : kCommonOptions) out.insert(key, option_value(h, key));
  for (const char* key : info.options) {
    if (sparse_adam && (std::string(key) == "weight_decay" || std::string(key) == "amsgrad")) continue;
    out.insert(key, option_value(h, key));
  }
  return out;
}

OptimizerHyper parse_optimizer(const std::string& kind_name, const c10::Dict<std::string, double>& options) {
  bool sparse_adam = false;
  const KindInfo* info = &find_kind(kind_name, &sparse_adam);
  OptimizerHyper h = default_hyper(*info);
  h.sparse_adam = sparse_adam;
  for (const auto& entry : options) {
    const std::string key = entry.key();
    const double v = entry.value();
    const bool accepted = std::any_of(std::begin(kCommonOptions), std::end(kCommonOptions),
                                      [&](const char* o) { return key == o; }) ||
                          std::any_of(info->options.begin(), info->options.end(),
                                      [&](const char* o) { return key == o; });
    if (!accepted || (sparse_adam && (key == "weight_decay" || key == "amsgrad"))) {
      std::ostringstream valid;
      valid << "lr, per_row_step, stochastic_rounding";
      for (const char* o : info->options) valid << ", " << o;
      TORCH_CHECK(false, "speedtorch optimizer: option '", key, "' does not apply to ", kind_name,
                  "; valid options: ", valid.str());
    }
    const auto f = static_cast<float>(v);
    if (key == "lr") h.lr = f;
    else if (key == "per_row_step") h.per_row_step = flag(v, "per_row_step");
    else if (key == "stochastic_rounding") h.stochastic_rounding = flag(v, "stochastic_rounding");
    else if (key == "momentum") h.momentum = f;
    else if (key == "dampening") h.dampening = f;
    else if (key == "nesterov") h.nesterov = flag(v, "nesterov");
    else if (key == "weight_decay") h.weight_decay = f;
    else if (key == "beta1") h.beta1 = f;
    else if (key == "beta2") h.beta2 = f;
    else if (key == "eps") h.eps = f;
    else if (key == "amsgrad") h.amsgrad = flag(v, "amsgrad");
    else if (key == "alpha") (h.kind == OptimizerKind::kASGD ? h.asgd_alpha : h.alpha) = f;
    else if (key == "centered") h.centered = flag(v, "centered");
    else if (key == "rho") h.rho = f;
    else if (key == "lr_decay") h.lr_decay = f;
    else if (key == "initial_accumulator_value") h.initial_accumulator_value = f;
    else if (key == "lambd") h.lambd = f;
    else if (key == "t0") h.t0 = f;
    else if (key == "etaminus") h.etaminus = f;
    else if (key == "etaplus") h.etaplus = f;
    else if (key == "step_size_min") h.step_size_min = f;
    else if (key == "step_size_max") h.step_size_max = f;
  }
  TORCH_CHECK(h.lr >= 0, "speedtorch optimizer: lr must be >= 0, got ", h.lr);
  TORCH_CHECK(h.eps >= 0, "speedtorch optimizer: eps must be >= 0, got ", h.eps);
  TORCH_CHECK(h.weight_decay >= 0, "speedtorch optimizer: weight_decay must be >= 0, got ", h.weight_decay);
  TORCH_CHECK(h.momentum >= 0, "speedtorch optimizer: momentum must be >= 0, got ", h.momentum);
  TORCH_CHECK(h.beta1 >= 0 && h.beta1 < 1 && h.beta2 >= 0 && h.beta2 < 1,
              "speedtorch optimizer: betas must be in [0, 1), got (", h.beta1, ", ", h.beta2, ")");
  TORCH_CHECK(!h.nesterov || (h.momentum > 0 && h.dampening == 0),
              "speedtorch optimizer: nesterov needs momentum > 0 and dampening == 0");
  TORCH_CHECK(h.rho >= 0 && h.rho <= 1, "speedtorch optimizer: rho must be in [0, 1], got ", h.rho);
  TORCH_CHECK(h.alpha >= 0, "speedtorch optimizer: alpha must be >= 0, got ", h.alpha);
  TORCH_CHECK(h.etaminus > 0 && h.etaminus < 1 && h.etaplus > 1,
              "speedtorch optimizer: Rprop needs 0 < etaminus < 1 < etaplus, got (", h.etaminus, ", ", h.etaplus, ")");
  return h;
}

}  // namespace speedtorch
