// bf16 weights times fp32 or bf16 activations as a torch op: service_bf16::linear, for CPUs without native bf16
// (AVX2, AVX-512 without BF16). In an fp32 engine the linear weights stay bf16 in memory, half the bytes a decode
// step reads; in a bf16 engine this replaces a GEMM that converts bf16 in software. Either way the weights are
// widened to fp32 and the products and sums are fp32's; a bf16 engine's output is rounded to bf16 once, at the end.
// Below `dense_from` rows a GEMV over output rows, one chunk of rows per torch thread; from `dense_from` rows on, the
// weight is widened chunk by chunk and multiplied by torch's fp32 GEMM, whose compute then dominates.
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstring>

namespace {

inline float widen(uint16_t bits) {
  const uint32_t word = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof value);
  return value;
}

// `rows` consecutive bf16 rows times one fp32 vector, in independent lanes the compiler vectorizes (-O3 -march=native:
// 8 lanes of AVX2 or 16 of AVX-512 per instruction), summed at the end. Eight rows at once give eight independent
// accumulator chains and eight memory streams for one load of x: one row at a time read 7.5-8.2 GB/s, eight 11.9-12.1
// (AVX2 and AVX-512 builds, Emerald Rapids guest, where fp32 weights read at 15 GB/s; docs/performance.md).
template <int64_t rows>
void dots(const uint16_t* w, int64_t k, const float* x, float* out) {
  constexpr int64_t lanes = 16;
  float acc[rows][lanes] = {};
  int64_t i = 0;
  for (; i + lanes <= k; i += lanes)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t l = 0; l < lanes; ++l) acc[r][l] += widen(w[r * k + i + l]) * x[i + l];
  for (int64_t r = 0; r < rows; ++r) {
    float sum = 0;
    for (int64_t l = 0; l < lanes; ++l) sum += acc[r][l];
    for (int64_t j = i; j < k; ++j) sum += widen(w[r * k + j]) * x[j];
    out[r] = sum;
  }
}

}  // namespace

// x: [m, k] fp32 or bf16; weight: the layer's own bf16 [n, k], read in place -> [m, n] in x's dtype.
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                  int64_t dense_from) {
  TORCH_CHECK(weight.scalar_type() == at::kBFloat16 && weight.is_contiguous() && weight.dim() == 2,
              "weight: contiguous bf16 2-D");
  const int64_t n = weight.size(0), k = weight.size(1), m = x.size(0);
  TORCH_CHECK(x.dim() == 2 && x.size(1) == k, "x ", x.sizes(), " for a ", n, "x", k, " weight");
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  if (dense_from > 0 && m >= dense_from) {
    at::Tensor y = at::empty({m, n}, xf.options());
    constexpr int64_t chunk = 512;
    const at::ThreadLocalState caller;
    at::parallel_for(0, (n + chunk - 1) / chunk, 1, [&](int64_t begin, int64_t end) {
      // OpenMP's other threads start without the caller's inference mode, and y (made in it) refuses their copy_.
      at::ThreadLocalStateGuard state(caller);
      for (int64_t c = begin; c < end; ++c) {
        const int64_t first = c * chunk, rows = std::min(chunk, n - first);
        y.narrow(1, first, rows).copy_(at::matmul(xf, weight.narrow(0, first, rows).to(at::kFloat).t()));
      }
    });
    if (bias.has_value()) y.add_(bias->to(at::kFloat));
    return y.to(x.scalar_type());
  }
  at::Tensor y = at::empty({m, n}, xf.options());
  const auto* w = reinterpret_cast<const uint16_t*>(weight.data_ptr());
  const float* xs = xf.data_ptr<float>();
  float* ys = y.data_ptr<float>();
  // Each weight row is read from memory once and reused from cache for every row of x.
  at::parallel_for(0, n, 64, [&](int64_t begin, int64_t end) {
    constexpr int64_t block = 8;
    float out[block];
    int64_t r = begin;
    for (; r + block <= end; r += block)
      for (int64_t i = 0; i < m; ++i) {
        dots<block>(w + r * k, k, xs + i * k, out);
        std::memcpy(ys + i * n + r, out, sizeof out);
      }
    for (; r < end; ++r)
      for (int64_t i = 0; i < m; ++i) dots<1>(w + r * k, k, xs + i * k, ys + i * n + r);
  });
  if (bias.has_value()) y.add_(bias->to(at::kFloat));
  return y.to(x.scalar_type());
}

TORCH_LIBRARY(service_bf16, m) { m.def("linear(Tensor x, Tensor weight, Tensor? bias, int dense_from) -> Tensor"); }

TORCH_LIBRARY_IMPL(service_bf16, CPU, m) { m.impl("linear", &linear); }
