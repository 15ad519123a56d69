// ggml's CPU matrix multiplication (llama.cpp's kernels) as a torch op: service_ggml::linear; and the row lookup of a
// token embedding kept in ggml blocks (service_ggml::embedding), for a head whose weight is that embedding.
//
// A weight goes into ggml once, at load, as ggml blocks (Q4_0, Q4_1, Q8_0). Q4_0 goes through ggml's CPU_REPACK
// buffer, which interleaves it for the 8x8 GEMV/GEMM that llama.cpp runs on AVX2 and AVX-512. Q4_1, which ggml does
// not repack, goes there too, split without loss: a Q4_1 value n * d + m is the Q4_0 value (n - 8) * d of the same
// nibble plus the block's offset m + 8 * d, so a row is a repacked Q4_0 row plus the offsets times the activations'
// sums per 32-block (kept in fp32; on a Zen 4 this ran SmolLM2's layers in x0.70-0.77 of ggml's Q4_1 GEMV time,
// docs/quantization.md). The weight is split by output rows into one slice per torch thread. Each call runs the
// slices in torch's own thread pool (at::parallel_for), and each slice is a one-thread ggml graph: ggml starts no
// threads of its own, and the engine keeps its thread binding.
// From `dense_from` rows on (prefill), the slices are dequantized instead and multiplied by torch's GEMM.
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

namespace {

struct Weight {
  ggml_context* ctx = nullptr;
  ggml_backend_buffer_t buffer = nullptr;
  std::vector<ggml_tensor*> slices;
  std::vector<int64_t> first_row;
  int64_t k = 0, n = 0;
  bool repacked = false;
  // A Q4_1 weight held as Q4_0: per slice, its blocks' offsets m + 8 * d, block-major ([k / 32][slice rows]) so
  // that adding them is a run of contiguous multiply-adds over a slice's outputs.
  std::vector<std::vector<float>> offsets;
};

std::mutex registry_lock;
std::vector<std::unique_ptr<Weight>> registry;  // lives as long as the process: vLLM never unloads a model

// ggml logs each tensor it repacks; only its warnings and errors reach the engine's log.
void quiet_log(ggml_log_level level, const char* text, void*) {
  if (level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

void init() {
  static const bool done = [] {
    ggml_log_set(quiet_log, nullptr);
    ggml_cpu_init();
    return true;
  }();
  (void)done;
}

ggml_backend_buffer_type_t repack_buffer_type() {
  static ggml_backend_buffer_type_t found = [] {
    init();
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    auto get = reinterpret_cast<ggml_backend_dev_get_extra_bufts_t>(
        ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(dev), "ggml_backend_dev_get_extra_bufts"));
    for (auto* b = get ? get(dev) : nullptr; b && *b; ++b)
      if (std::string(ggml_backend_buft_name(*b)) == "CPU_REPACK") return *b;
    return static_cast<ggml_backend_buffer_type_t>(nullptr);
  }();
  return found;
}

// Q4_0 is repacked, in slices of whole 8-row groups. ggml (and llama.cpp) would also repack Q4_K with AVX2 and Q2_K
// with AVX-512; on a Zen 4 that decoded one row x0.86 / x0.92 of the plain layout's time but took x1.74 / x2.85 of it
// at 128 rows (python -m bench.tools.ggml_prefill --type Q4_K|Q2_K, docs/quantization.md), so they stay as stored.
bool repackable(ggml_type type, const std::vector<int64_t>& rows) {
  if (type != GGML_TYPE_Q4_0 || !ggml_cpu_has_avx2() || repack_buffer_type() == nullptr) return false;
  for (int64_t r : rows)
    if (r % 8) return false;
  return true;
}

// Q4_1 rows [rows, k / 32 blocks of (fp16 d, fp16 m, 16 nibble bytes)] -> Q4_0 rows of the same nibbles and d
// (written to `q4_0`), and the blocks' offsets m + 8 * d, block-major. Empty when an offset is not exact in fp32 (an
// m and d of exponents more than 12 apart): then (n - 8) * d + offset would not be n * d + m, and the rows stay Q4_1.
std::vector<float> split_q4_1(const uint8_t* q4_1, int64_t rows, int64_t k, uint8_t* q4_0) {
  const int64_t blocks = k / 32;
  std::vector<float> offsets(static_cast<size_t>(blocks * rows));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* in = q4_1 + (r * blocks + b) * 20;
      uint8_t* out = q4_0 + (r * blocks + b) * 18;
      uint16_t d_bits, m_bits;
      std::memcpy(&d_bits, in, 2);
      std::memcpy(&m_bits, in + 2, 2);
      std::memcpy(out, in, 2);
      std::memcpy(out + 2, in + 4, 16);
      const float d = c10::Half(d_bits, c10::Half::from_bits()), m = c10::Half(m_bits, c10::Half::from_bits());
      offsets[b * rows + r] = m + 8.0f * d;
      if (static_cast<double>(offsets[b * rows + r]) != static_cast<double>(m) + 8.0 * d) return {};
    }
  return offsets;
}

}  // namespace

// blocks: uint8 [n, row bytes] in ggml's layout of `type`; returns a handle for `linear`.
int64_t load(const at::Tensor& blocks, int64_t type, int64_t k, int64_t n, int64_t parts) {
  init();
  auto t = static_cast<ggml_type>(type);
  const size_t row = ggml_row_size(t, k);
  TORCH_CHECK(blocks.dtype() == at::kByte && blocks.is_contiguous() && blocks.dim() == 2, "blocks: contiguous uint8 2-D");
  TORCH_CHECK(blocks.size(0) == n && static_cast<size_t>(blocks.size(1)) == row, "blocks: ", blocks.sizes(),
              " for ", n, " rows of ", row, " bytes");
  std::vector<int64_t> rows;
  const int64_t per = ((n + parts - 1) / parts + 7) / 8 * 8;
  for (int64_t r = 0; r < n; r += per) rows.push_back(std::min(per, n - r));
  auto w = std::make_unique<Weight>();
  w->k = k;
  w->n = n;
  const auto* src = static_cast<const uint8_t*>(blocks.data_ptr());
  std::vector<uint8_t> as_q4_0;
  if (t == GGML_TYPE_Q4_1 && repackable(GGML_TYPE_Q4_0, rows)) {
    const size_t q4_0_row = ggml_row_size(GGML_TYPE_Q4_0, k);
    as_q4_0.resize(static_cast<size_t>(n) * q4_0_row);
    int64_t first = 0;
    for (int64_t r : rows) {
      w->offsets.push_back(split_q4_1(src + first * row, r, k, as_q4_0.data() + first * q4_0_row));
      first += r;
    }
    const bool exact = std::none_of(w->offsets.begin(), w->offsets.end(), [](const auto& o) { return o.empty(); });
    if (exact) {
      t = GGML_TYPE_Q4_0;
      src = as_q4_0.data();
    } else {
      w->offsets.clear();
    }
  }
  const size_t stored_row = ggml_row_size(t, k);
  w->repacked = repackable(t, rows);
  w->ctx = ggml_init({ggml_tensor_overhead() * rows.size() + 256, nullptr, true});
  int64_t first = 0;
  for (int64_t r : rows) {
    w->slices.push_back(ggml_new_tensor_2d(w->ctx, t, k, r));
    w->first_row.push_back(first);
    first += r;
  }
  w->buffer = ggml_backend_alloc_ctx_tensors_from_buft(
      w->ctx, w->repacked ? repack_buffer_type() : ggml_backend_cpu_buffer_type());
  TORCH_CHECK(w->buffer != nullptr, "ggml could not allocate ", blocks.numel(), " bytes");
  for (size_t s = 0; s < rows.size(); ++s)
    ggml_backend_tensor_set(w->slices[s], src + w->first_row[s] * stored_row, 0, ggml_nbytes(w->slices[s]));
  std::lock_guard<std::mutex> guard(registry_lock);
  registry.push_back(std::move(w));
  return static_cast<int64_t>(registry.size()) - 1;
}

bool repacked(int64_t handle) { return registry.at(handle)->repacked; }

// Rows [first, first + rows) of slice `s` as floats [rows, k]. ggml's repacked Q4_0 (block_q4_0x8, repack.cpp
// make_block_q4_0x8) holds 8 rows per block: their 8 scales, then 16 chunks of 8 bytes, chunk c from row c % 8 at
// byte offset (c / 8) * 8 of its 16, each nibble stored xor 8. Other types go through ggml's own to_float.
void dequantize_rows(const Weight* w, int64_t s, int64_t first, int64_t rows, float* dst) {
  const ggml_tensor* t = w->slices[s];
  const int64_t k = w->k, blocks = k / 32;
  if (!w->repacked) {
    const size_t row_bytes = ggml_row_size(t->type, k);
    const auto to_float = ggml_get_type_traits(t->type)->to_float;
    for (int64_t r = 0; r < rows; ++r)
      to_float(static_cast<const uint8_t*>(t->data) + (first + r) * row_bytes, dst + r * k, k);
    return;
  }
  constexpr size_t group_bytes = 8 * sizeof(ggml_fp16_t) + 128;  // sizeof(block_q4_0x8)
  for (int64_t r = first; r < first + rows; ++r) {
    const int64_t group = r / 8, lane = r % 8;
    float* out = dst + (r - first) * k;
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* block = static_cast<const uint8_t*>(t->data) + (group * blocks + b) * group_bytes;
      const float d = c10::Half(reinterpret_cast<const uint16_t*>(block)[lane], c10::Half::from_bits());  // inline
      const float offset = w->offsets.empty() ? 0.0f : w->offsets[s][b * t->ne[1] + r];
      // Copies: bytes may alias the floats written, which would keep the compiler from vectorizing the loop.
      uint8_t low[8], high[8];  // bytes 0-7 and 8-15 of the row's 16
      std::memcpy(low, block + 8 * sizeof(ggml_fp16_t) + lane * 8, 8);
      std::memcpy(high, block + 8 * sizeof(ggml_fp16_t) + 64 + lane * 8, 8);
      float* o = out + b * 32;
      for (int j = 0; j < 8; ++j) {
        o[j] = static_cast<float>(((low[j] & 15) ^ 8) - 8) * d + offset;
        o[8 + j] = static_cast<float>(((high[j] & 15) ^ 8) - 8) * d + offset;
        o[16 + j] = static_cast<float>(((low[j] >> 4) ^ 8) - 8) * d + offset;
        o[24 + j] = static_cast<float>(((high[j] >> 4) ^ 8) - 8) * d + offset;
      }
    }
  }
}

// Each slice in chunks of rows: dequantized to floats, converted to x's dtype, multiplied by torch's GEMM. A CPU
// without bf16 arithmetic (AVX2, AVX-512 without BF16) converts a bf16 GEMM in software, about 4x slower than fp32's
// (docs/performance.md): there bf16 activations are widened once and the products summed in fp32, and only y is bf16.
void dense(const Weight* w, const at::Tensor& x_in, at::Tensor& y) {
  static const bool bf16_arithmetic = __builtin_cpu_supports("avx512bf16");
  const at::Tensor x = x_in.scalar_type() == at::kBFloat16 && !bf16_arithmetic ? x_in.to(at::kFloat) : x_in;
  const int64_t slices = static_cast<int64_t>(w->slices.size());
  const at::ThreadLocalState caller;
  at::parallel_for(0, slices, 1, [&](int64_t begin, int64_t end) {
    // OpenMP's other threads start without the caller's inference mode, and y (made in it) refuses their copy_.
    at::ThreadLocalStateGuard state(caller);
    constexpr int64_t chunk = 512;
    at::Tensor floats = at::empty({chunk, w->k}, x.options().dtype(at::kFloat));
    at::Tensor weight = at::empty({chunk, w->k}, x.options());
    for (int64_t s = begin; s < end; ++s) {
      const int64_t rows = w->slices[s]->ne[1];
      for (int64_t first = 0; first < rows; first += chunk) {
        const int64_t count = std::min(chunk, rows - first);
        dequantize_rows(w, s, first, count, floats.data_ptr<float>());
        at::Tensor part = weight.narrow(0, 0, count);
        part.copy_(floats.narrow(0, 0, count));
        y.narrow(1, w->first_row[s] + first, count).copy_(at::matmul(x, part.t()));
      }
    }
  });
}

// x: [m, k] in any float dtype -> [m, n] in x's dtype. From `dense_from` rows on, each slice is dequantized in
// chunks to x's dtype and multiplied by torch's GEMM (oneDNN), which is faster than ggml's int8 dot products once the
// weight's reads are shared by enough rows.
at::Tensor linear(const at::Tensor& x, int64_t handle, int64_t n, const c10::optional<at::Tensor>& bias,
                  int64_t dense_from) {
  const Weight* w;
  {
    std::lock_guard<std::mutex> guard(registry_lock);
    w = registry.at(handle).get();
  }
  TORCH_CHECK(x.dim() == 2 && x.size(1) == w->k && n == w->n, "x ", x.sizes(), " for a ", w->n, "x", w->k, " weight");
  const int64_t m = x.size(0);
  const int64_t slices = static_cast<int64_t>(w->slices.size());
  if (dense_from > 0 && m >= dense_from) {
    const at::Tensor xc = x.contiguous();
    at::Tensor y = at::empty({m, w->n}, x.options());
    dense(w, xc, y);
    if (bias.has_value()) y.add_(*bias);
    return y;
  }
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor y = at::empty({m, w->n}, xf.options());
  // A split Q4_1 weight: the activations' sums per 32-block, [m][k / 32], for its offsets.
  const int64_t blocks = w->k / 32;
  std::vector<float> sums;
  if (!w->offsets.empty()) {
    sums.resize(static_cast<size_t>(m * blocks));
    const float* xp = xf.data_ptr<float>();
    for (int64_t i = 0; i < m * blocks; ++i) {
      float sum = 0.0f;
      for (int j = 0; j < 32; ++j) sum += xp[i * 32 + j];
      sums[i] = sum;
    }
  }
  at::parallel_for(0, slices, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<uint8_t> meta(ggml_tensor_overhead() * 4 + ggml_graph_overhead_custom(4, false) + 1024);
    thread_local std::vector<uint8_t> work;
    thread_local std::vector<float> out;
    for (int64_t s = begin; s < end; ++s) {
      ggml_tensor* weight = w->slices[s];
      const int64_t rows = weight->ne[1];
      out.resize(static_cast<size_t>(rows * m));
      ggml_context* ctx = ggml_init({meta.size(), meta.data(), true});
      ggml_tensor* in = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, w->k, m);
      in->data = xf.data_ptr<float>();
      ggml_tensor* product = ggml_mul_mat(ctx, weight, in);
      product->data = out.data();
      ggml_cgraph* graph = ggml_new_graph_custom(ctx, 4, false);
      ggml_build_forward_expand(graph, product);
      ggml_cplan plan = ggml_graph_plan(graph, 1, nullptr);
      if (work.size() < plan.work_size) work.resize(plan.work_size);
      plan.work_data = work.data();
      const ggml_status status = ggml_graph_compute(graph, &plan);
      ggml_free(ctx);
      TORCH_CHECK(status == GGML_STATUS_SUCCESS, "ggml_graph_compute failed: ", ggml_status_to_string(status));
      if (!w->offsets.empty()) {
        const float* offset = w->offsets[s].data();
        for (int64_t i = 0; i < m; ++i) {
          float* o = out.data() + i * rows;
          for (int64_t b = 0; b < blocks; ++b) {
            const float sum = sums[i * blocks + b];
            const float* column = offset + b * rows;
            for (int64_t r = 0; r < rows; ++r) o[r] += sum * column[r];
          }
        }
      }
      float* dst = y.data_ptr<float>() + w->first_row[s];
      for (int64_t i = 0; i < m; ++i) std::memcpy(dst + i * w->n, out.data() + i * rows, rows * sizeof(float));
    }
  });
  if (bias.has_value()) y.add_(bias->to(at::kFloat));
  return y.to(x.scalar_type());
}

// ids: int64 [t] rows of the weight -> floats [t, k], each row dequantized as ggml stores it (the token embedding of a
// model whose LM head reads the same blocks).
at::Tensor embedding(const at::Tensor& ids, int64_t handle, int64_t k) {
  const Weight* w;
  {
    std::lock_guard<std::mutex> guard(registry_lock);
    w = registry.at(handle).get();
  }
  TORCH_CHECK(ids.dim() == 1 && k == w->k, "ids ", ids.sizes(), " of a ", w->n, "x", w->k, " weight, k ", k);
  const at::Tensor rows = ids.to(at::kLong).contiguous();
  const int64_t* row = rows.data_ptr<int64_t>();
  const int64_t t = rows.size(0);
  for (int64_t i = 0; i < t; ++i) TORCH_CHECK(row[i] >= 0 && row[i] < w->n, "row ", row[i], " of ", w->n);
  at::Tensor out = at::empty({t, k}, rows.options().dtype(at::kFloat));
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, t, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      // The slice holding the row: the last whose first row is at or before it.
      const auto s = std::upper_bound(w->first_row.begin(), w->first_row.end(), row[i]) - w->first_row.begin() - 1;
      dequantize_rows(w, s, row[i] - w->first_row[s], 1, dst + i * k);
    }
  });
  return out;
}

// load and repacked run at load time, outside any graph; linear and embedding are the ones torch.compile traces (their
// fake implementations are in ggml_linear.py).
TORCH_LIBRARY(service_ggml, m) {
  m.def("load(Tensor blocks, int type, int k, int n, int parts) -> int", &load);
  m.def("repacked(int handle) -> bool", &repacked);
  m.def("linear(Tensor x, int handle, int n, Tensor? bias, int dense_from) -> Tensor");
  m.def("embedding(Tensor ids, int handle, int k) -> Tensor");
}

TORCH_LIBRARY_IMPL(service_ggml, CPU, m) {
  m.impl("linear", &linear);
  m.impl("embedding", &embedding);
}
