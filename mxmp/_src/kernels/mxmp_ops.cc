// mxmp's operator library for MXNet 1.9.1 (loaded with mx.library.load; built by
// mxmp/_src/kernels/build.py against the installed wheel's include/mxnet/lib_api.h).
//
// mxmp_layer_norm: layer normalisation over the last axis, written for speed on one core.
//   inputs  data (..., D), gamma (D,), beta (D,)            float32 or float64, one dtype
//   outputs out (..., D); mean (rows,), rstd (rows,)       rows = data.size / D
//   out = (data - mean) * rstd * gamma + beta, rstd = 1 / sqrt(var + eps), var biased.
//   attrs   eps (default 1e-5)
// Backward (inputs: d out, d mean, d rstd, data, gamma, beta, out, mean, rstd; the gradients of
// mean and rstd are ignored: mxmp substitutes the op only where they are not consumed):
//   xhat = (x - mean) * rstd, g = gamma * dy
//   dx = rstd * (g - mean_row(g) - xhat * mean_row(g * xhat))
//   dgamma = sum_rows(dy * xhat), dbeta = sum_rows(dy)
// MXNet passes no OpReqType to a library op: outputs are always written (kWriteTo). mxmp's
// graph rule puts a copy between a graph variable and this op, so a variable's grad_req='add'
// accumulates in MXNet's own copy backward.
//
// mxmp_dropout: Dropout whose mask comes from a counter-based hash (cheap, vectorised).
//   inputs  data (any shape, float32 or float64), flag (1,) float32: 1 in inference (the output
//           of MXNet's own Dropout on a constant 1: 1 at inference, 0 or 2 in training; library
//           ops are not told the training mode)
//   outputs out (data's shape and dtype), mask (data's shape, uint8: 1 kept, 0 dropped; not
//           written in inference, where backward is the identity)
//   attrs   p (drop probability, 0 < p < 1), mode ('training': identity where flag is 1;
//           'always': dropout in inference too)
//   Element i of a call is kept when h(i) >= p * 2**32, h two rounds of a 32-bit integer hash
//   seeded by 64 bits drawn from MXNet's CPU generator (mx.random.seed sets it); kept elements
//   are scaled by 1 / (1 - p), as MXNet's Dropout.
//
// mxmp_softmax: softmax over the last axis, optionally with lengths (MXNet's use_length).
//   inputs  data (..., M) float32 or float64; with use_length, length (data's shape without
//           its last axis; any dtype): row r uses its first length[r] values, the rest are 0
//   output  out (data's shape and dtype)
//   exp is computed here (Cody-Waite reduction by ln 2, degree-7 Taylor polynomial: relative
//   error below 2e-7 on [-87, 0]); below -87 it is 0.
//   Backward: dx = out * (dy - sum_row(dy * out)) over the row's length, 0 beyond it; length
//   gets a zero gradient.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "mxnet/lib_api.h"

using mxnet::ext::MXReturnValue;
using mxnet::ext::MXTensor;
using mxnet::ext::OpResource;
using mxnet::ext::MX_FAIL;
using mxnet::ext::MX_SUCCESS;
typedef std::unordered_map<std::string, std::string> Attrs;

namespace {

double attr_double(const Attrs& attrs, const char* key, double dflt) {
  auto it = attrs.find(key);
  return it == attrs.end() ? dflt : std::stod(it->second);
}

// ---------------------------------------------------------------------------------------------
// LayerNorm kernels
template <typename T, typename Acc>
void ln_forward(const T* x, const T* gamma, const T* beta, T* y, T* mean, T* rstd,
                int64_t rows, int64_t d, Acc eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * d;
    T* yr = y + r * d;
    // one pass over the row, shifted by its first value (no cancellation when the row's
    // mean is large against its spread)
    const Acc k = xr[0];
    Acc s1 = 0, s2 = 0;
#pragma omp simd reduction(+ : s1, s2)
    for (int64_t j = 0; j < d; ++j) {
      const Acc v = static_cast<Acc>(xr[j]) - k;
      s1 += v;
      s2 += v * v;
    }
    const Acc m = s1 / d;
    Acc var = s2 / d - m * m;
    if (var < 0) var = 0;
    const Acc mu = k + m;
    const Acc rs = Acc(1) / std::sqrt(var + eps);
    mean[r] = static_cast<T>(mu);
    rstd[r] = static_cast<T>(rs);
#pragma omp simd
    for (int64_t j = 0; j < d; ++j) {
      yr[j] = static_cast<T>((static_cast<Acc>(xr[j]) - mu) * rs * gamma[j] + beta[j]);
    }
  }
}

template <typename T, typename Acc>
void ln_backward(const T* dy, const T* x, const T* gamma, const T* mean, const T* rstd,
                 T* dx, T* dgamma, T* dbeta, Acc* acc_g, Acc* acc_b, int64_t rows, int64_t d) {
  for (int64_t j = 0; j < d; ++j) {
    acc_g[j] = 0;
    acc_b[j] = 0;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * d;
    const T* dyr = dy + r * d;
    const Acc mu = mean[r], rs = rstd[r];
    Acc a = 0, b = 0;
#pragma omp simd reduction(+ : a, b)
    for (int64_t j = 0; j < d; ++j) {
      const Acc xh = (static_cast<Acc>(xr[j]) - mu) * rs;
      const Acc g = static_cast<Acc>(gamma[j]) * dyr[j];
      a += g;
      b += g * xh;
      acc_g[j] += static_cast<Acc>(dyr[j]) * xh;
      acc_b[j] += dyr[j];
    }
    a /= d;
    b /= d;
    if (dx != nullptr) {
      T* dxr = dx + r * d;
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) {
        const Acc xh = (static_cast<Acc>(xr[j]) - mu) * rs;
        dxr[j] = static_cast<T>(rs * (static_cast<Acc>(gamma[j]) * dyr[j] - a - xh * b));
      }
    }
  }
  for (int64_t j = 0; j < d; ++j) {
    if (dgamma != nullptr) dgamma[j] = static_cast<T>(acc_g[j]);
    if (dbeta != nullptr) dbeta[j] = static_cast<T>(acc_b[j]);
  }
}

int64_t last_dim(const MXTensor& t) { return t.shape.empty() ? 1 : t.shape.back(); }

bool is_float(int dtype) {
  return dtype == mxnet::ext::kFloat32 || dtype == mxnet::ext::kFloat64;
}

MXReturnValue ln_parse(const Attrs& attrs, int* num_in, int* num_out) {
  *num_in = 3;
  *num_out = 3;
  return MX_SUCCESS;
}

MXReturnValue ln_infer_type(const Attrs& attrs, std::vector<int>* in, std::vector<int>* out) {
  int t = (*in)[0];
  if (!is_float(t)) {
    MX_ERROR_MSG << "mxmp_layer_norm: data must be float32 or float64 (dtype enum "
                 << t << ")";
    return MX_FAIL;
  }
  for (size_t i = 1; i < in->size(); ++i) {
    if ((*in)[i] != -1 && (*in)[i] != t) {
      MX_ERROR_MSG << "mxmp_layer_norm: gamma and beta must have data's dtype";
      return MX_FAIL;
    }
    (*in)[i] = t;
  }
  for (auto& o : *out) o = t;
  return MX_SUCCESS;
}

MXReturnValue ln_infer_shape(const Attrs& attrs, std::vector<std::vector<unsigned>>* in,
                             std::vector<std::vector<unsigned>>* out) {
  const auto& ds = (*in)[0];
  if (ds.empty()) {
    MX_ERROR_MSG << "mxmp_layer_norm: data must have at least one axis";
    return MX_FAIL;
  }
  unsigned d = ds.back();
  unsigned rows = 1;
  for (size_t i = 0; i + 1 < ds.size(); ++i) rows *= ds[i];
  for (size_t i = 1; i < 3; ++i) {
    // a Gluon Parameter whose size is still deferred arrives as (-1,) (MXNet's unknown
    // dimension, 0xFFFFFFFF here) or (0,) (the legacy unknown): it takes data's last axis
    const bool unknown = (*in)[i].size() == 1 && ((*in)[i][0] == 0 || (*in)[i][0] == 0xFFFFFFFFu);
    if (!(*in)[i].empty() && !unknown && !((*in)[i].size() == 1 && (*in)[i][0] == d)) {
      MX_ERROR_MSG << "mxmp_layer_norm: gamma and beta must have shape (" << d << ",)";
      return MX_FAIL;
    }
    (*in)[i] = std::vector<unsigned>{d};
  }
  (*out)[0] = ds;
  (*out)[1] = std::vector<unsigned>{rows};
  (*out)[2] = std::vector<unsigned>{rows};
  return MX_SUCCESS;
}

MXReturnValue ln_forward_cpu(const Attrs& attrs, std::vector<MXTensor>* in,
                             std::vector<MXTensor>* out, const OpResource& res) {
  MXTensor& x = (*in)[0];
  const int64_t d = last_dim(x);
  const int64_t rows = d == 0 ? 0 : x.size() / d;
  const double eps = attr_double(attrs, "eps", 1e-5);
  if (x.dtype == mxnet::ext::kFloat32) {
    ln_forward<float, float>((*in)[0].data<float>(), (*in)[1].data<float>(),
                             (*in)[2].data<float>(), (*out)[0].data<float>(),
                             (*out)[1].data<float>(), (*out)[2].data<float>(), rows, d,
                             static_cast<float>(eps));
  } else {
    ln_forward<double, double>((*in)[0].data<double>(), (*in)[1].data<double>(),
                               (*in)[2].data<double>(), (*out)[0].data<double>(),
                               (*out)[1].data<double>(), (*out)[2].data<double>(), rows, d,
                               eps);
  }
  return MX_SUCCESS;
}

template <typename T>
T* out_ptr(std::vector<MXTensor>* out, size_t i) {
  // an output MXNet does not need may come without memory
  return (*out)[i].data_ptr == nullptr ? nullptr : (*out)[i].data<T>();
}

MXReturnValue ln_backward_cpu(const Attrs& attrs, std::vector<MXTensor>* in,
                              std::vector<MXTensor>* out, const OpResource& res) {
  // in: d out, d mean, d rstd, data, gamma, beta, out, mean, rstd
  MXTensor& x = (*in)[3];
  const int64_t d = last_dim(x);
  const int64_t rows = d == 0 ? 0 : x.size() / d;
  if (x.dtype == mxnet::ext::kFloat32) {
    std::vector<float> acc(2 * d);
    ln_backward<float, float>((*in)[0].data<float>(), x.data<float>(), (*in)[4].data<float>(),
                              (*in)[7].data<float>(), (*in)[8].data<float>(),
                              out_ptr<float>(out, 0), out_ptr<float>(out, 1),
                              out_ptr<float>(out, 2), acc.data(), acc.data() + d, rows, d);
  } else {
    std::vector<double> acc(2 * d);
    ln_backward<double, double>((*in)[0].data<double>(), x.data<double>(),
                                (*in)[4].data<double>(), (*in)[7].data<double>(),
                                (*in)[8].data<double>(), out_ptr<double>(out, 0),
                                out_ptr<double>(out, 1), out_ptr<double>(out, 2), acc.data(),
                                acc.data() + d, rows, d);
  }
  return MX_SUCCESS;
}

// ---------------------------------------------------------------------------------------------
// Dropout kernels
inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

bool inference(MXTensor& flag, const Attrs& attrs) {
  auto it = attrs.find("mode");
  if (it != attrs.end() && it->second == "always") return false;
  return flag.data<float>()[0] == 1.0f;
}

template <typename T>
void dropout_forward(const T* x, T* y, uint8_t* mask, int64_t n, uint32_t threshold, T scale,
                     uint32_t s1, uint32_t s2) {
  const int64_t block = 1 << 16;
  for (int64_t start = 0; start < n; start += block) {
    const int64_t end = start + block < n ? start + block : n;
    const uint32_t base = static_cast<uint32_t>(start) + s1;
    const uint32_t s2b = s2 ^ static_cast<uint32_t>(start >> 32);
#pragma omp simd
    for (int64_t i = start; i < end; ++i) {
      const uint32_t h = mix32(mix32(base + static_cast<uint32_t>(i - start)) ^ s2b);
      const bool keep = h >= threshold;
      mask[i] = keep;
      y[i] = keep ? x[i] * scale : T(0);
    }
  }
}

MXReturnValue dropout_parse(const Attrs& attrs, int* num_in, int* num_out) {
  const double p = attr_double(attrs, "p", 0.5);
  if (!(p > 0 && p < 1)) {
    MX_ERROR_MSG << "mxmp_dropout: p must be in (0, 1), got " << p;
    return MX_FAIL;
  }
  *num_in = 2;
  *num_out = 2;
  return MX_SUCCESS;
}

MXReturnValue dropout_infer_type(const Attrs& attrs, std::vector<int>* in,
                                 std::vector<int>* out) {
  if (!is_float((*in)[0])) {
    MX_ERROR_MSG << "mxmp_dropout: data must be float32 or float64 (dtype enum " << (*in)[0]
                 << ")";
    return MX_FAIL;
  }
  (*in)[1] = mxnet::ext::kFloat32;
  (*out)[0] = (*in)[0];
  (*out)[1] = mxnet::ext::kUint8;
  return MX_SUCCESS;
}

MXReturnValue dropout_infer_shape(const Attrs& attrs, std::vector<std::vector<unsigned>>* in,
                                  std::vector<std::vector<unsigned>>* out) {
  (*in)[1] = std::vector<unsigned>{1};
  (*out)[0] = (*in)[0];
  (*out)[1] = (*in)[0];
  return MX_SUCCESS;
}

MXReturnValue dropout_forward_cpu(const Attrs& attrs, std::vector<MXTensor>* in,
                                  std::vector<MXTensor>* out, const OpResource& res) {
  MXTensor& x = (*in)[0];
  const int64_t n = x.size();
  uint8_t* mask = (*out)[1].data<uint8_t>();
  if (inference((*in)[1], attrs)) {   // the mask is not written: backward reads the flag
    std::memcpy((*out)[0].data_ptr, x.data_ptr, n * (x.dtype == mxnet::ext::kFloat32 ? 4 : 8));
    return MX_SUCCESS;
  }
  const double p = attr_double(attrs, "p", 0.5);
  const uint32_t threshold = static_cast<uint32_t>(std::ldexp(p, 32) < 4294967295.0 ?
                                                   std::ldexp(p, 32) : 4294967295.0);
  mxnet::ext::mx_cpu_rand_t* gen = res.get_cpu_rand_states();
  const uint32_t s1 = (*gen)(), s2 = (*gen)();
  if (x.dtype == mxnet::ext::kFloat32) {
    dropout_forward<float>(x.data<float>(), (*out)[0].data<float>(), mask, n, threshold,
                           static_cast<float>(1.0 / (1.0 - p)), s1, s2);
  } else {
    dropout_forward<double>(x.data<double>(), (*out)[0].data<double>(), mask, n, threshold,
                            1.0 / (1.0 - p), s1, s2);
  }
  return MX_SUCCESS;
}

template <typename T>
void dropout_backward(const T* dy, const uint8_t* mask, T* dx, int64_t n, T scale) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dx[i] = mask[i] ? dy[i] * scale : T(0);
}

MXReturnValue dropout_backward_cpu(const Attrs& attrs, std::vector<MXTensor>* in,
                                   std::vector<MXTensor>* out, const OpResource& res) {
  // in: d out, d mask, data, flag, out, mask; out: d data, d flag
  MXTensor& dy = (*in)[0];
  const int64_t n = dy.size();
  if ((*out)[1].data_ptr != nullptr) (*out)[1].data<float>()[0] = 0.0f;
  if ((*out)[0].data_ptr == nullptr) return MX_SUCCESS;
  const double p = attr_double(attrs, "p", 0.5);
  if (inference((*in)[3], attrs)) {   // the identity; the mask was not written
    std::memcpy((*out)[0].data_ptr, dy.data_ptr, n * (dy.dtype == mxnet::ext::kFloat32 ? 4 : 8));
    return MX_SUCCESS;
  }
  const uint8_t* mask = (*in)[5].data<uint8_t>();
  if (dy.dtype == mxnet::ext::kFloat32) {
    dropout_backward<float>(dy.data<float>(), mask, (*out)[0].data<float>(), n,
                            static_cast<float>(1.0 / (1.0 - p)));
  } else {
    dropout_backward<double>(dy.data<double>(), mask, (*out)[0].data<double>(), n,
                             1.0 / (1.0 - p));
  }
  return MX_SUCCESS;
}

// ---------------------------------------------------------------------------------------------
// Softmax kernels
inline float exp_nonpositive(float x) {
  // x <= 0: e^x = 2^n e^r, n = round(x / ln 2), |r| <= ln 2 / 2
  const bool tiny = x < -87.0f;
  x = tiny ? -87.0f : x;
  const float t = x * 1.44269504088896341f;
  const int n = static_cast<int>(t - 0.5f);   // t <= 0: truncation of t - 1/2 rounds
  const float fn = static_cast<float>(n);
  const float r = (x - fn * 0.693145751953125f) - fn * 1.42860682030941723e-06f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  union { int32_t i; float f; } scale;
  scale.i = (n + 127) << 23;
  return tiny ? 0.0f : p * scale.f;
}

inline double exp_nonpositive(double x) { return std::exp(x); }

template <typename T>
void softmax_row(const T* x, T* y, int64_t m, int64_t len) {
  if (len <= 0) {
    for (int64_t j = 0; j < m; ++j) y[j] = 0;
    return;
  }
  T mx = x[0];
#pragma omp simd reduction(max : mx)
  for (int64_t j = 1; j < len; ++j) mx = x[j] > mx ? x[j] : mx;
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < len; ++j) {
    const T e = exp_nonpositive(x[j] - mx);
    y[j] = e;
    sum += e;
  }
  const T inv = T(1) / sum;
#pragma omp simd
  for (int64_t j = 0; j < len; ++j) y[j] *= inv;
  for (int64_t j = len; j < m; ++j) y[j] = 0;
}

template <typename T>
void softmax_grad_row(const T* dy, const T* y, T* dx, int64_t m, int64_t len) {
  if (len < 0) len = 0;
  T dot = 0;
#pragma omp simd reduction(+ : dot)
  for (int64_t j = 0; j < len; ++j) dot += dy[j] * y[j];
#pragma omp simd
  for (int64_t j = 0; j < len; ++j) dx[j] = y[j] * (dy[j] - dot);
  for (int64_t j = len; j < m; ++j) dx[j] = 0;
}

bool use_length(const Attrs& attrs) {
  auto it = attrs.find("use_length");
  return it != attrs.end() && (it->second == "True" || it->second == "1" ||
                               it->second == "true");
}

int64_t length_at(MXTensor& length, int64_t r, int64_t m) {
  int64_t v;
  switch (length.dtype) {
    case mxnet::ext::kFloat32: v = static_cast<int64_t>(length.data<float>()[r]); break;
    case mxnet::ext::kFloat64: v = static_cast<int64_t>(length.data<double>()[r]); break;
    case mxnet::ext::kInt32: v = length.data<int32_t>()[r]; break;
    case mxnet::ext::kInt64: v = length.data<int64_t>()[r]; break;
    case mxnet::ext::kUint8: v = length.data<uint8_t>()[r]; break;
    case mxnet::ext::kInt8: v = length.data<int8_t>()[r]; break;
    default: v = m;
  }
  return v < m ? v : m;
}

MXReturnValue softmax_parse(const Attrs& attrs, int* num_in, int* num_out) {
  *num_in = use_length(attrs) ? 2 : 1;
  *num_out = 1;
  return MX_SUCCESS;
}

MXReturnValue softmax_infer_type(const Attrs& attrs, std::vector<int>* in,
                                 std::vector<int>* out) {
  if (!is_float((*in)[0])) {
    MX_ERROR_MSG << "mxmp_softmax: data must be float32 or float64 (dtype enum " << (*in)[0]
                 << ")";
    return MX_FAIL;
  }
  if (in->size() > 1 && (*in)[1] == -1) (*in)[1] = mxnet::ext::kInt32;
  (*out)[0] = (*in)[0];
  return MX_SUCCESS;
}

MXReturnValue softmax_infer_shape(const Attrs& attrs, std::vector<std::vector<unsigned>>* in,
                                  std::vector<std::vector<unsigned>>* out) {
  const auto& ds = (*in)[0];
  if (ds.empty()) {
    MX_ERROR_MSG << "mxmp_softmax: data must have at least one axis";
    return MX_FAIL;
  }
  if (in->size() > 1) (*in)[1] = std::vector<unsigned>(ds.begin(), ds.end() - 1);
  (*out)[0] = ds;
  return MX_SUCCESS;
}

template <typename T>
void softmax_all(std::vector<MXTensor>* in, T* y) {
  MXTensor& x = (*in)[0];
  const int64_t m = last_dim(x);
  const int64_t rows = m == 0 ? 0 : x.size() / m;
  const T* xd = x.data<T>();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t len = in->size() > 1 ? length_at((*in)[1], r, m) : m;
    softmax_row<T>(xd + r * m, y + r * m, m, len);
  }
}

MXReturnValue softmax_forward_cpu(const Attrs& attrs, std::vector<MXTensor>* in,
                                  std::vector<MXTensor>* out, const OpResource& res) {
  if ((*in)[0].dtype == mxnet::ext::kFloat32) {
    softmax_all<float>(in, (*out)[0].data<float>());
  } else {
    softmax_all<double>(in, (*out)[0].data<double>());
  }
  return MX_SUCCESS;
}

template <typename T>
void softmax_grad_all(std::vector<MXTensor>* in, T* dx, bool with_length) {
  // in: d out, data, [length], out
  MXTensor& dy = (*in)[0];
  MXTensor& y = (*in)[with_length ? 3 : 2];
  const int64_t m = last_dim(dy);
  const int64_t rows = m == 0 ? 0 : dy.size() / m;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t len = with_length ? length_at((*in)[2], r, m) : m;
    softmax_grad_row<T>(dy.data<T>() + r * m, y.data<T>() + r * m, dx + r * m, m, len);
  }
}

MXReturnValue softmax_backward_cpu(const Attrs& attrs, std::vector<MXTensor>* in,
                                   std::vector<MXTensor>* out, const OpResource& res) {
  const bool with_length = use_length(attrs);
  if (with_length && out->size() > 1 && (*out)[1].data_ptr != nullptr) {
    MXTensor& dl = (*out)[1];
    const int bytes = dl.dtype == mxnet::ext::kFloat64 || dl.dtype == mxnet::ext::kInt64 ? 8 :
                      dl.dtype == mxnet::ext::kUint8 || dl.dtype == mxnet::ext::kInt8 ? 1 :
                      dl.dtype == mxnet::ext::kFloat16 ? 2 : 4;
    std::memset(dl.data_ptr, 0, dl.size() * bytes);
  }
  if ((*out)[0].data_ptr == nullptr) return MX_SUCCESS;
  if ((*in)[0].dtype == mxnet::ext::kFloat32) {
    softmax_grad_all<float>(in, (*out)[0].data<float>(), with_length);
  } else {
    softmax_grad_all<double>(in, (*out)[0].data<double>(), with_length);
  }
  return MX_SUCCESS;
}

}  // namespace

REGISTER_OP(mxmp_softmax)
    .setParseAttrs(softmax_parse)
    .setInferType(softmax_infer_type)
    .setInferShape(softmax_infer_shape)
    .setForward(softmax_forward_cpu, "cpu")
    .setBackward(softmax_backward_cpu, "cpu");

REGISTER_OP(mxmp_dropout)
    .setParseAttrs(dropout_parse)
    .setInferType(dropout_infer_type)
    .setInferShape(dropout_infer_shape)
    .setForward(dropout_forward_cpu, "cpu")
    .setBackward(dropout_backward_cpu, "cpu");

REGISTER_OP(mxmp_layer_norm)
    .setParseAttrs(ln_parse)
    .setInferType(ln_infer_type)
    .setInferShape(ln_infer_shape)
    .setForward(ln_forward_cpu, "cpu")
    .setBackward(ln_backward_cpu, "cpu");

MXReturnValue initialize(int version) {
  if (version < 10900) {
    MX_ERROR_MSG << "mxmp_ops needs MXNet >= 1.9.0, this is " << version;
    return MX_FAIL;
  }
  return MX_SUCCESS;
}
