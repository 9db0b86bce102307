// The element-wise math of every fused row optimizer, written once for the CPU loops (cpu/row_optimizer_cpu.cpp)
// and the CUDA kernel (cuda/row_optimizer_kernel.cu). Each update follows torch.optim's single-tensor code for one
// element, so a row updated here equals torch.optim applied to the touched rows (maximize=False).
//
// A row's optimizer state is float32: a 4-float header (the row's own step count, as int32 bits; then row-wise
// Adagrad's accumulator; then spare) and `slots` vectors of `dim` floats. Rows never touched keep zero state, so
// first-touch initialisation (Adagrad's initial accumulator, Rprop's step sizes) keys on the row's step count.
//
// Row-wise Adagrad (FBGEMM's EXACT_ROWWISE_ADAGRAD, the default of TorchRec's tables) keeps one float per row: the
// sum over steps of the mean over the row of the squared gradient. Its update needs that mean before any element
// moves, so the loops call rowwise_adagrad_scale() once per row (with the row's sum of squares) and then
// update_element() per element.
//
// Row-wise Adam (FBGEMM's PARTIAL_ROWWISE_ADAM) keeps Adam's first moment per element but its second moment as one
// float per row (in the header, where row-wise Adagrad keeps its sum): beta2-weighted means of the row's mean
// squared gradient. The loops call rowwise_adam_denominator() once per row, then update_element() per element.
//
// 16-bit tables: an update smaller than half the spacing of float16/bfloat16 values around a weight is lost when the
// result is rounded to nearest (bfloat16 keeps 8 bits: 1.0 - 1e-4 rounds back to 1.0). With stochastic_rounding
// the result rounds up or down with the probabilities that make its expected value exact (as FBGEMM's 16-bit
// tables do): rounded_weight() below, its random bits a hash of (global step, row, element), the same on the CPU
// and the GPU.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__CUDACC__)
#define SPEEDTORCH_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SPEEDTORCH_HOST_DEVICE inline
#endif

namespace speedtorch {

enum class OptimizerKind : int32_t {
  kSGD, kAdagrad, kAdam, kAdamW, kAdamax, kRMSprop, kAdadelta, kASGD, kRprop, kRowwiseAdagrad, kRowwiseAdam
};

// Floats before the first state vector of a state row.
constexpr int64_t kStateHeaderFloats = 4;
// Where row-wise Adagrad keeps its accumulator, and row-wise Adam its second moment, in the header.
constexpr int64_t kRowwiseAccumulatorFloat = 1;

// Kinds whose update needs a reduction over the row (its squared gradient) before any element moves.
inline constexpr bool is_rowwise(OptimizerKind kind) {
  return kind == OptimizerKind::kRowwiseAdagrad || kind == OptimizerKind::kRowwiseAdam;
}

enum class WeightType : int32_t { kFloat, kHalf, kBFloat16 };

// Where a table's rows and their optimizer state live (host memory mapped for the GPU, device memory, or host
// memory for the CPU path). Weights and state may share one allocation (side by side per row) or not.
struct OptimizerRows {
  char* weights;  // row 0
  int64_t weight_stride_bytes;
  WeightType weight_type;
  float* state;  // header of row 0's state
  int64_t state_stride_floats;
  int64_t dim;
  int64_t num_rows;
  // Optional (GPU kernels only): the updated weights of the i-th row of the batch also go to updated + i x dim
  // elements (device memory, the table's dtype), so the next forward can take them without reading the host again.
  char* updated = nullptr;
  // GPU kernels only: the rows were claimed strictly increasing (sorted_unique) and nobody checked it on the host
  // (deferred index checks): a row not above the one before it is flagged in the device's error record and skipped.
  bool rows_must_increase = false;
};

// Hyper-parameters of every kind (each kind reads its own), with torch.optim's defaults.
struct OptimizerHyper {
  OptimizerKind kind = OptimizerKind::kAdam;
  float lr = 1e-3f;
  float weight_decay = 0.f;
  // SGD
  float momentum = 0.f;
  float dampening = 0.f;
  bool nesterov = false;
  // Adam, AdamW, Adamax (beta1, beta2), RMSprop (alpha), Adadelta (rho)
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  bool amsgrad = false;
  float alpha = 0.99f;
  bool centered = false;
  float rho = 0.9f;
  // Adagrad
  float lr_decay = 0.f;
  float initial_accumulator_value = 0.f;
  // ASGD
  float lambd = 1e-4f;
  float asgd_alpha = 0.75f;
  float t0 = 1e6f;
  // Rprop
  float etaminus = 0.5f;
  float etaplus = 1.2f;
  float step_size_min = 1e-6f;
  float step_size_max = 50.f;
  // Bias correction from each row's own step count instead of the table-wide step.
  bool per_row_step = false;
  // float16/bfloat16 weights rounded stochastically after each update (rounded_weight()); float32 tables ignore it.
  bool stochastic_rounding = false;
  // Adam as torch.optim.SparseAdam computes it ("sparse_adam"): eps is added to sqrt(v) before the bias correction,
  // (sqrt(v) + eps) / sqrt(1 - beta2^k), where torch.optim.Adam adds it after, sqrt(v) / sqrt(1 - beta2^k) + eps.
  // Early steps and small gradients tell the two apart (eps is 30x larger in effect at step 1).
  bool sparse_adam = false;
};

// State vectors per row for a configuration.
inline int64_t state_slots(const OptimizerHyper& h) {
  switch (h.kind) {
    case OptimizerKind::kSGD: return h.momentum != 0.f ? 1 : 0;
    case OptimizerKind::kAdagrad: return 1;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW: return h.amsgrad ? 3 : 2;
    case OptimizerKind::kAdamax: return 2;
    case OptimizerKind::kRMSprop: return 1 + (h.momentum != 0.f ? 1 : 0) + (h.centered ? 1 : 0);
    case OptimizerKind::kAdadelta: return 2;
    case OptimizerKind::kASGD: return 1;
    case OptimizerKind::kRprop: return 2;
    case OptimizerKind::kRowwiseAdagrad: return 0;  // its one float lives in the header
    case OptimizerKind::kRowwiseAdam: return 1;     // the first moment; the second lives in the header
  }
  return 0;
}

// The gradient element the update uses (weight decay added, as torch.optim's L2 penalty).
SPEEDTORCH_HOST_DEVICE float decayed_gradient(const OptimizerHyper& h, float w, float g) {
  return h.weight_decay != 0.f ? g + h.weight_decay * w : g;
}

// Row-wise Adagrad, once per row: adds the row's mean squared gradient (`sum_squares` over `dim` elements of
// decayed_gradient) to its accumulator and returns the step's scale lr / (sqrt(accumulator) + eps).
SPEEDTORCH_HOST_DEVICE float rowwise_adagrad_scale(const OptimizerHyper& h, float accumulator, bool first,
                                                   float sum_squares, int64_t dim, float* new_accumulator) {
  const float sum = (first ? h.initial_accumulator_value : accumulator) + sum_squares / static_cast<float>(dim);
  *new_accumulator = sum;
  return h.lr / (sqrtf(sum) + h.eps);
}

// Per-row scalars a step needs, computed once per row from its step count k (1 on a row's first update).
struct RowStep {
  float k;          // step used for bias correction / schedules
  bool first;       // the row's first update
  float bc1 = 1.f;  // 1 - beta1^k
  float bc2_sqrt = 1.f;
  float clr = 0.f;  // Adagrad: lr / (1 + (k - 1) * lr_decay); Adamax: lr / (1 - beta1^k); ASGD: eta
  float mu = 1.f;   // ASGD averaging weight
  float denom = 1.f;  // row-wise Adam: rowwise_adam_denominator() of this row
  float adam_eps = 0.f;  // Adam: the eps added to the bias-corrected sqrt(v) (h.eps, or SparseAdam's h.eps / bc2_sqrt)
};

// Row-wise Adam, once per row: moves the row's second moment (`second`, one float) on by the row's mean squared
// gradient (`sum_squares` over `dim` elements of decayed_gradient) and returns the update's denominator,
// sqrt(second) / sqrt(1 - beta2^k) + eps, shared by every element of the row.
SPEEDTORCH_HOST_DEVICE float rowwise_adam_denominator(const OptimizerHyper& h, const RowStep& r, float second,
                                                      float sum_squares, int64_t dim, float* new_second) {
  const float v = h.beta2 * second + (1.f - h.beta2) * (sum_squares / static_cast<float>(dim));
  *new_second = v;
  return sqrtf(v) / r.bc2_sqrt + h.eps;
}

SPEEDTORCH_HOST_DEVICE RowStep row_step(const OptimizerHyper& h, int32_t row_k, int64_t global_k) {
  RowStep s;
  s.first = row_k == 1;
  s.k = h.per_row_step ? static_cast<float>(row_k) : static_cast<float>(global_k);
  const double k = s.k;
  switch (h.kind) {
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
    case OptimizerKind::kRowwiseAdam:
      s.bc1 = static_cast<float>(1.0 - pow(static_cast<double>(h.beta1), k));
      s.bc2_sqrt = static_cast<float>(sqrt(1.0 - pow(static_cast<double>(h.beta2), k)));
      s.adam_eps = h.sparse_adam ? h.eps / s.bc2_sqrt : h.eps;
      break;
    case OptimizerKind::kAdamax:
      s.clr = static_cast<float>(h.lr / (1.0 - pow(static_cast<double>(h.beta1), k)));
      break;
    case OptimizerKind::kAdagrad:
      s.clr = static_cast<float>(h.lr / (1.0 + (k - 1.0) * h.lr_decay));
      break;
    case OptimizerKind::kASGD:
      // torch.optim.ASGD uses eta and mu from the previous step's schedule: lr and 1 on the first step.
      s.clr = k <= 1 ? h.lr : static_cast<float>(h.lr / pow(1.0 + h.lambd * h.lr * (k - 1.0), h.asgd_alpha));
      s.mu = k <= 1 ? 1.f : static_cast<float>(1.0 / fmax(1.0, (k - 1.0) - h.t0));
      break;
    default:
      break;
  }
  return s;
}

// Updates element j of one row: w (the weight, as float), g (its summed gradient), state vectors s0..s2 at j.
// `kind` is h.kind, or h.kind as a compile-time constant (std::integral_constant, as the CPU loops pass it): then
// the switch folds away and each kind's element loop has no branch on the kind, so the compiler vectorises it.
template <typename Kind>
SPEEDTORCH_HOST_DEVICE float update_element_of_kind(Kind kind, const OptimizerHyper& h, const RowStep& r, float w,
                                                    float g, float* s0, float* s1, float* s2) {
  switch (static_cast<OptimizerKind>(kind)) {
    case OptimizerKind::kSGD: {
      if (h.weight_decay != 0.f) g += h.weight_decay * w;
      if (h.momentum != 0.f) {
        const float buf = r.first ? g : h.momentum * *s0 + (1.f - h.dampening) * g;
        *s0 = buf;
        g = h.nesterov ? g + h.momentum * buf : buf;
      }
      return w - h.lr * g;
    }
    case OptimizerKind::kAdagrad: {
      if (h.weight_decay != 0.f) g += h.weight_decay * w;
      const float sum = (r.first ? h.initial_accumulator_value : *s0) + g * g;
      *s0 = sum;
      return w - r.clr * g / (sqrtf(sum) + h.eps);
    }
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW: {
      if (static_cast<OptimizerKind>(kind) == OptimizerKind::kAdamW) {
        w *= 1.f - h.lr * h.weight_decay;
      } else if (h.weight_decay != 0.f) {
        g += h.weight_decay * w;
      }
      const float m = h.beta1 * *s0 + (1.f - h.beta1) * g;
      const float v = h.beta2 * *s1 + (1.f - h.beta2) * g * g;
      *s0 = m;
      *s1 = v;
      float v_hat = v;
      if (h.amsgrad) {
        v_hat = fmaxf(*s2, v);
        *s2 = v_hat;
      }
      const float denom = sqrtf(v_hat) / r.bc2_sqrt + r.adam_eps;
      return w - (h.lr / r.bc1) * (m / denom);
    }
    case OptimizerKind::kAdamax: {
      if (h.weight_decay != 0.f) g += h.weight_decay * w;
      const float m = h.beta1 * *s0 + (1.f - h.beta1) * g;
      const float u = fmaxf(h.beta2 * *s1, fabsf(g) + h.eps);
      *s0 = m;
      *s1 = u;
      return w - r.clr * m / u;
    }
    case OptimizerKind::kRMSprop: {
      if (h.weight_decay != 0.f) g += h.weight_decay * w;
      const float sq = h.alpha * *s0 + (1.f - h.alpha) * g * g;
      *s0 = sq;
      float* next = s1;
      float avg;
      if (h.centered) {
        // grad_avg is the last slot.
        float* ga = h.momentum != 0.f ? s2 : s1;
        const float gav = h.alpha * *ga + (1.f - h.alpha) * g;
        *ga = gav;
        avg = sqrtf(sq - gav * gav) + h.eps;
      } else {
        avg = sqrtf(sq) + h.eps;
      }
      if (h.momentum != 0.f) {
        const float buf = h.momentum * *next + g / avg;
        *next = buf;
        return w - h.lr * buf;
      }
      return w - h.lr * g / avg;
    }
    case OptimizerKind::kAdadelta: {
      if (h.weight_decay != 0.f) g += h.weight_decay * w;
      const float sq = h.rho * *s0 + (1.f - h.rho) * g * g;
      *s0 = sq;
      const float delta = sqrtf(*s1 + h.eps) / sqrtf(sq + h.eps) * g;
      *s1 = h.rho * *s1 + (1.f - h.rho) * delta * delta;
      return w - h.lr * delta;
    }
    case OptimizerKind::kASGD: {
      if (h.weight_decay != 0.f) g += h.weight_decay * w;
      w *= 1.f - h.lambd * r.clr;
      w -= r.clr * g;
      // ax, the running average of the weights (torch.optim.ASGD's state "ax").
      *s0 = r.mu != 1.f ? *s0 + (w - *s0) * r.mu : w;
      return w;
    }
    case OptimizerKind::kRowwiseAdagrad:
      return w - r.clr * decayed_gradient(h, w, g);  // r.clr: rowwise_adagrad_scale() of this row
    case OptimizerKind::kRowwiseAdam: {
      const float m = h.beta1 * *s0 + (1.f - h.beta1) * decayed_gradient(h, w, g);
      *s0 = m;
      return w - (h.lr / r.bc1) * (m / r.denom);  // r.denom: rowwise_adam_denominator() of this row
    }
    case OptimizerKind::kRprop: {
      // s0: prev, s1: step size (lr on a row's first update).
      float step_size = r.first ? h.lr : *s1;
      const float prod = g * *s0;
      float factor = 1.f;
      if (prod > 0.f) factor = h.etaplus;
      if (prod < 0.f) factor = h.etaminus;
      step_size = fminf(fmaxf(step_size * factor, h.step_size_min), h.step_size_max);
      *s1 = step_size;
      if (prod < 0.f) g = 0.f;
      *s0 = g;
      const float sign = g > 0.f ? 1.f : (g < 0.f ? -1.f : 0.f);
      return w - sign * step_size;
    }
  }
  return w;
}

SPEEDTORCH_HOST_DEVICE float update_element(const OptimizerHyper& h, const RowStep& r, float w, float g, float* s0,
                                            float* s1, float* s2) {
  return update_element_of_kind(h.kind, h, r, w, g, s0, s1, s2);
}

// 32 random bits for element j of `row` at `global_step` (murmur3's finaliser over the three, in 32-bit arithmetic
// so that CPU loops vectorise it): reproducible, independent of thread and block layout, identical on CPU and GPU.
SPEEDTORCH_HOST_DEVICE uint32_t mix_bits(uint32_t x) {
  x ^= x >> 16;
  x *= 0x85EBCA6Bu;
  x ^= x >> 13;
  x *= 0xC2B2AE35u;
  x ^= x >> 16;
  return x;
}

SPEEDTORCH_HOST_DEVICE uint32_t rounding_bits(int64_t global_step, int64_t row, int64_t j) {
  const uint32_t r = mix_bits(static_cast<uint32_t>(row) * 0x9E3779B1u + static_cast<uint32_t>(row >> 32) +
                              static_cast<uint32_t>(global_step) * 0xC2B2AE3Du);
  return mix_bits(r ^ (static_cast<uint32_t>(j) * 0x85EBCA77u));
}

SPEEDTORCH_HOST_DEVICE uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
#endif
}

SPEEDTORCH_HOST_DEVICE float bits_float(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float x;
  std::memcpy(&x, &b, sizeof(x));
  return x;
#endif
}

// x rounded to T (c10::Half or c10::BFloat16) up or down in magnitude, the far neighbour with probability
// (distance to the near one) / (spacing), so that the expected result is x. Non-finite values and values T
// represents exactly stay as they are; float16's largest value never rounds up to infinity. The general case; the
// specialisations below take the common ranges with bit arithmetic and the same result.
template <typename T>
SPEEDTORCH_HOST_DEVICE T round_stochastic_general(float x, uint32_t random_bits) {
  const T nearest(x);
  const float n = static_cast<float>(nearest);
  if (n == x || !((n - n) == 0.f)) return nearest;  // exact, NaN or infinite
  // Sign and magnitude: one step of the bit pattern moves the magnitude by one spacing, up (+1) or down (-1).
  const bool x_beyond = fabsf(x) > fabsf(n);
  const T other(static_cast<uint16_t>(x_beyond ? nearest.x + 1 : nearest.x - 1), T::from_bits());
  const float o = static_cast<float>(other);
  const float low = x_beyond ? fabsf(n) : fabsf(o);
  const float high = x_beyond ? fabsf(o) : fabsf(n);
  const float p_high = (fabsf(x) - low) / (high - low);  // 0 when high is infinite
  const float u = static_cast<float>(random_bits >> 8) * (1.f / 16777216.f);  // uniform in [0, 1), 24 bits
  const bool take_high = u < p_high;
  return take_high == x_beyond ? other : nearest;
}

template <typename T>
SPEEDTORCH_HOST_DEVICE T round_stochastic(float x, uint32_t random_bits) {
  return round_stochastic_general<T>(x, random_bits);
}

// bfloat16 keeps float32's top 16 bits: adding 16 random bits below them and truncating rounds the magnitude up
// with the probability the dropped bits give (NaNs aside, whose payload must not carry into the sign).
template <>
SPEEDTORCH_HOST_DEVICE c10::BFloat16 round_stochastic<c10::BFloat16>(float x, uint32_t random_bits) {
  const uint32_t b = float_bits(x);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return c10::BFloat16(x);
  return c10::BFloat16(static_cast<uint16_t>((b + (random_bits >> 16)) >> 16), c10::BFloat16::from_bits());
}

// float16's normal range below its largest value, [2^-14, 65504): it keeps 10 of float32's 23 mantissa bits, so the
// same addition and truncation of 13 bits gives a float32 value float16 holds exactly. Elsewhere (subnormals,
// the top of the range, non-finite values) the general case.
template <>
SPEEDTORCH_HOST_DEVICE c10::Half round_stochastic<c10::Half>(float x, uint32_t random_bits) {
  const uint32_t b = float_bits(x);
  const uint32_t magnitude = b & 0x7FFFFFFFu;
  if (magnitude >= 0x38800000u && magnitude < 0x477FE000u) {
    return c10::Half(bits_float((b + (random_bits >> 19)) & ~0x1FFFu));
  }
  return round_stochastic_general<c10::Half>(x, random_bits);
}

// The value a kernel stores for an updated weight w of element j of `row`: w itself in a float32 table; in a 16-bit
// table rounded to nearest, or stochastically (round_stochastic) when the optimizer asks for it.
template <typename T>
SPEEDTORCH_HOST_DEVICE T rounded_weight(const OptimizerHyper& h, float w, int64_t global_step, int64_t row,
                                        int64_t j) {
  if constexpr (std::is_same_v<T, float>) {
    return w;
  } else {
    return h.stochastic_rounding ? round_stochastic<T>(w, rounding_bits(global_step, row, j)) : static_cast<T>(w);
  }
}

}  // namespace speedtorch
