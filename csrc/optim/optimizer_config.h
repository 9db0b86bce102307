// Parses an optimizer name and its options (torch.optim's names and defaults) into OptimizerHyper, with errors
// that name the option and the values it accepts.
#pragma once

#include <ATen/core/Dict.h>

#include <string>

#include "core/row_optimizer_math.h"

namespace speedtorch {

// kind: sgd, adagrad, adam, adamw, adamax, rmsprop, adadelta, asgd, rprop, rowwise_adagrad, rowwise_adam, and
// sparse_adam (torch.optim.SparseAdam: Adam without weight decay or amsgrad, eps added before the bias correction). Options are floats; booleans are 0 or 1; betas are beta1/beta2; Rprop's etas and
// step_sizes are etaminus/etaplus and step_size_min/step_size_max; per_row_step=1 selects per-row bias
// correction; stochastic_rounding=1 rounds updated float16/bfloat16 weights stochastically (every kind).
OptimizerHyper parse_optimizer(const std::string& kind, const c10::Dict<std::string, double>& options);

// Every option `kind` accepts, with its default value (what parse_optimizer uses when the option is not given):
// the complete set a torch.optim-style param group of this optimizer holds.
c10::Dict<std::string, double> optimizer_defaults(const std::string& kind);

// The canonical name of a kind ("adam", ...).
const char* optimizer_name(OptimizerKind kind);
// The canonical name of a configuration: its kind's, or "sparse_adam" for SparseAdam's arithmetic.
const char* optimizer_name(const OptimizerHyper& hyper);

// The one name an optimizer is known by, whatever name it was given ("Adam" is "adam", "SparseAdam" is
// "sparse_adam"): what tables report, files and checkpoints record, and every comparison of optimizers uses. Throws
// for an unknown name, as parse_optimizer does.
std::string canonical_optimizer_name(const std::string& kind);

}  // namespace speedtorch
