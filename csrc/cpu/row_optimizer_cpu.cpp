// Fused row optimizer on CPU threads (see row_optimizer_cpu.h). Rows are split across threads; the element loop is
// compiled once per optimizer kind (the kind a compile-time constant), so it has no branch on the kind and the
// compiler vectorises it: each lane does the same IEEE float operations as the scalar code, so the bits are the same.
#include "cpu/row_optimizer_cpu.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <type_traits>

namespace speedtorch {
namespace {

// Elements (rows x dim) a thread must have before a second one is woken. Waking OpenMP threads for a batch of a few
// thousand narrow rows costs more than it saves, and on a loaded machine far more: a parallel region waits for its
// slowest thread, which the scheduler may not run for milliseconds (bench/RESULTS.md, issue 16's CPU runs: a demo
// step took 343 ms with 2 threads against 9 ms with 1). Twice ATen's grain size: an element here is a few
// multiply-adds on a row and its state, reached with a cache miss per row.
constexpr int64_t kGrainElements = 1 << 16;

// A batch of fewer elements is updated by the calling thread alone (about half a millisecond of Adam): a second
// thread saves a fraction of that on an idle machine and costs milliseconds on a loaded one (issue 23 item 7: the
// demo's item table, 3,400 rows x 32, took 2 grains).
constexpr int64_t kSerialElements = 1 << 17;

// The rows of a batch lie anywhere in a table of many megabytes: each is a cache (and often TLB) miss, and a thread
// that waits for each row in turn is bound by memory latency, not arithmetic. Asking for the rows a few ahead keeps
// their misses in flight while the current row is updated.
constexpr int64_t kPrefetchRows = 6;

inline void prefetch_for_write(const char* p, int64_t bytes) {
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off, /*rw=*/1, /*locality=*/3);
}

// One row's elements. A row, its state and its gradient never overlap; __restrict says so, so the vectorised loop
// needs no run-time overlap checks.
template <OptimizerKind K, typename T>
void update_row_elements(const OptimizerHyper h, const RowStep r, T* __restrict w, const float* __restrict g,
                         float* __restrict s0, float* __restrict s1, float* __restrict s2, int64_t dim) {
  const std::integral_constant<OptimizerKind, K> kind;
  for (int64_t j = 0; j < dim; ++j) {
    w[j] = static_cast<T>(update_element_of_kind(kind, h, r, static_cast<float>(w[j]), g[j], s0 + j, s1 + j, s2 + j));
  }
}

// The same, each updated 16-bit weight rounded stochastically (rounded_weight: a hash of step, row and element).
template <OptimizerKind K, typename T>
void update_row_elements_rounded(const OptimizerHyper h, const RowStep r, T* __restrict w, const float* __restrict g,
                                 float* __restrict s0, float* __restrict s1, float* __restrict s2, int64_t dim,
                                 int64_t global_step, int64_t row) {
  const std::integral_constant<OptimizerKind, K> kind;
  for (int64_t j = 0; j < dim; ++j) {
    w[j] = rounded_weight<T>(
        h, update_element_of_kind(kind, h, r, static_cast<float>(w[j]), g[j], s0 + j, s1 + j, s2 + j), global_step,
        row, j);
  }
}

template <OptimizerKind K, typename T>
void update_rows(const OptimizerRows& t, const OptimizerHyper& h, int64_t global_step, const int64_t* rows,
                 const float* grads, int64_t begin, int64_t end) {
  const int64_t dim = t.dim;
  // With the table-wide step, every row shares its bias corrections and schedules: computed once here, not per row
  // (two pow() in double precision per row).
  const RowStep shared = row_step(h, 1, global_step);
  const int64_t weight_bytes = dim * static_cast<int64_t>(sizeof(T));
  const int64_t state_bytes = t.state_stride_floats * static_cast<int64_t>(sizeof(float));
  for (int64_t i = begin; i < end; ++i) {
    if (i + kPrefetchRows < end) {
      const int64_t ahead = rows[i + kPrefetchRows];
      prefetch_for_write(t.weights + ahead * t.weight_stride_bytes, weight_bytes);
      prefetch_for_write(reinterpret_cast<const char*>(t.state + ahead * t.state_stride_floats), state_bytes);
    }
    const int64_t row = rows[i];
    T* w = reinterpret_cast<T*>(t.weights + row * t.weight_stride_bytes);
    float* header = t.state + row * t.state_stride_floats;
    auto* step = reinterpret_cast<int32_t*>(header);
    const int32_t k = *step + 1;
    *step = k;
    RowStep r = shared;
    if (h.per_row_step) {
      r = row_step(h, k, global_step);
    } else {
      r.first = k == 1;
    }
    float* s0 = header + kStateHeaderFloats;
    float* s1 = s0 + dim;
    float* s2 = s1 + dim;
    const float* g = grads + i * dim;
    if (is_rowwise(K)) {  // the row's squared gradient, before any element moves
      float sum_squares = 0.f;
      for (int64_t j = 0; j < dim; ++j) {
        const float gj = decayed_gradient(h, static_cast<float>(w[j]), g[j]);
        sum_squares += gj * gj;
      }
      float* row_scalar = header + kRowwiseAccumulatorFloat;
      if (K == OptimizerKind::kRowwiseAdagrad) {
        r.clr = rowwise_adagrad_scale(h, *row_scalar, r.first, sum_squares, dim, row_scalar);
      } else {
        r.denom = rowwise_adam_denominator(h, r, *row_scalar, sum_squares, dim, row_scalar);
      }
    }
    if (!h.stochastic_rounding) {  // two loops, so that the common one stays branch-free (vectorised)
      update_row_elements<K>(h, r, w, g, s0, s1, s2, dim);
    } else {
      update_row_elements_rounded<K>(h, r, w, g, s0, s1, s2, dim, global_step, row);
    }
  }
}

// fn(std::integral_constant<OptimizerKind, kind>{}): the kind as a compile-time constant.
template <typename Fn>
void with_kind_constant(OptimizerKind kind, Fn&& fn) {
  using K = OptimizerKind;
  switch (kind) {
    case K::kSGD: return fn(std::integral_constant<K, K::kSGD>{});
    case K::kAdagrad: return fn(std::integral_constant<K, K::kAdagrad>{});
    case K::kAdam: return fn(std::integral_constant<K, K::kAdam>{});
    case K::kAdamW: return fn(std::integral_constant<K, K::kAdamW>{});
    case K::kAdamax: return fn(std::integral_constant<K, K::kAdamax>{});
    case K::kRMSprop: return fn(std::integral_constant<K, K::kRMSprop>{});
    case K::kAdadelta: return fn(std::integral_constant<K, K::kAdadelta>{});
    case K::kASGD: return fn(std::integral_constant<K, K::kASGD>{});
    case K::kRprop: return fn(std::integral_constant<K, K::kRprop>{});
    case K::kRowwiseAdagrad: return fn(std::integral_constant<K, K::kRowwiseAdagrad>{});
    case K::kRowwiseAdam: return fn(std::integral_constant<K, K::kRowwiseAdam>{});
  }
}

}  // namespace

void apply_row_optimizer_cpu(const OptimizerRows& table, const OptimizerHyper& hyper, int64_t global_step,
                             const int64_t* rows, const float* grads, int64_t count) {
  const int64_t grain_rows = std::max<int64_t>(1, kGrainElements / std::max<int64_t>(1, table.dim));
  auto update = [&](int64_t begin, int64_t end) {
    with_kind_constant(hyper.kind, [&](auto kind) {
      constexpr OptimizerKind K = decltype(kind)::value;
      switch (table.weight_type) {
        case WeightType::kFloat: return update_rows<K, float>(table, hyper, global_step, rows, grads, begin, end);
        case WeightType::kHalf: return update_rows<K, c10::Half>(table, hyper, global_step, rows, grads, begin, end);
        case WeightType::kBFloat16:
          return update_rows<K, c10::BFloat16>(table, hyper, global_step, rows, grads, begin, end);
      }
    });
  };
  if (count * table.dim < kSerialElements) return update(0, count);
  at::parallel_for(0, count, grain_rows, update);
}

}  // namespace speedtorch
