// mxmp's operator library for MXNet 1.9.1 (loaded with mx.library.load; built by
// mxmp/_src/kernels/build.py against the installed wheel's include/mxnet/lib_api.h).
//
// Threads: every kernel splits its rows (or blocks of elements) over an OpenMP parallel loop.
// The library is built with -fopenmp and so uses libgomp, the runtime libmxnet.so links: one
// thread pool per calling thread, shared with MXNet's own operators, sized by OMP_NUM_THREADS
// as theirs are (libgomp's default: every CPU of the process). Results do not depend on the
// number of threads: rows are independent, and the one reduction across rows (LayerNorm's
// dgamma/dbeta) sums fixed blocks of rows, whose number depends on the shape only, in double
// precision, and adds the blocks in a fixed order.
//
// mxmp_layer_norm: layer normalisation over the last axis.
//   inputs  data (..., D), gamma (D,), beta (D,)            float32 or float64, one dtype
//   outputs out (..., D); mean (rows,), rstd (rows,)       rows = data.size / D
//   out = (data - mean) * rstd * gamma + beta, rstd = 1 / sqrt(var + eps), var biased.
//   attrs   eps (default 1e-5)
//   Numerics: a row's mean and variance are two passes in double (sum, then the sum of
//   squared deviations from that mean): exact to double rounding whatever the row's mean,
//   spread or outliers; the output is computed in double and rounded once.
// Backward (inputs: d out, d mean, d rstd, data, gamma, beta, out, mean, rstd; the gradients of
// mean and rstd are ignored: mxmp substitutes the op only where they are not consumed):
//   xhat = (x - mean) * rstd, g = gamma * dy
//   dx = rstd * (g - mean_row(g) - xhat * mean_row(g * xhat))
//   dgamma = sum_rows(dy * xhat), dbeta = sum_rows(dy)
//   Numerics: row sums in double; xhat uses the row's mean to double precision (the float32
//   mean output is corrected by mean_row(x - mean) in the same pass); dgamma/dbeta are sums
//   over fixed blocks of rows in double, the blocks added in order.
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
//   seeded by 64 bits drawn from MXNet's CPU generator (mx.random.seed sets it); out = x * s,
//   s = 1 / (1 - p) where kept and 0 where dropped, as MXNet's x * mask: a NaN or inf that is
//   dropped gives NaN, as in MXNet. Backward: dx = dy * s.
//
// mxmp_softmax: softmax over the last axis, optionally with lengths (MXNet's use_length).
//   inputs  data (..., M) float32 or float64; with use_length, length (data's shape without
//           its last axis, (1,) for 1-D data, as MXNet's softmax; an integer dtype, or float32
//           or float64 (truncated), which MXNet's softmax refuses at run time): row r uses its
//           first length[r] values (clamped to [0, M]), the rest are 0
//   output  out (data's shape and dtype)
//   exp is computed here (Cody-Waite reduction by ln 2, degree-7 Taylor polynomial: relative
//   error below 2e-7 on [-87, 0]); below -87 it is 0. The row sum is in double.
//   Backward: dx = out * (dy - sum_row(dy * out)) over the row's length (the sum in double),
//   0 beyond it; length gets a zero gradient.
//
// In mxmp's graphs (the kernel rule) every input but data is one of MXNet's "extra inputs"
// (attribute __ext_extra_inputs__): MXNet's wrapper then passes data alone to the shape and type
// functions below, and MXNet's own ops shape the rest; softmax then takes one more input, which
// it ignores (the rule's shape tie: docs/pass.md, "Kernel rule"). Called without the attribute,
// every input is the library's to infer.
//
// Every entry point catches exceptions (nothing is thrown across the C interface) and reports
// errors with dtype names; attributes are parsed independently of the C locale.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <locale>
#include <sstream>
#include <string>
#include <vector>

#include "mxnet/lib_api.h"

using mxnet::ext::MXReturnValue;
using mxnet::ext::MXTensor;
using mxnet::ext::OpResource;
using mxnet::ext::MX_FAIL;
using mxnet::ext::MX_SUCCESS;
typedef std::unordered_map<std::string, std::string> Attrs;
typedef std::vector<std::vector<unsigned>> Shapes;

namespace {

// Parallel loops run where a call has at least this many elements (below it one thread is
// faster than waking the team).
const int64_t kParallelMin = 1 << 15;
// MXNet's unknown dimension (-1) as the library's shape functions receive it.
const unsigned kUnknownDim = 0xFFFFFFFFu;

// ---------------------------------------------------------------------------------------------
// Attributes, dtypes, shapes, errors
bool parse_double(const std::string& text, double* value) {
  // the "C" locale whatever the process's (std::stod follows setlocale: "0.5" is 0 in de_DE)
  std::istringstream in(text);
  in.imbue(std::locale::classic());
  double v;
  in >> v;
  if (in.fail()) return false;
  in >> std::ws;
  if (!in.eof()) return false;
  *value = v;
  return true;
}

bool attr_double(const Attrs& attrs, const char* key, double dflt, double* value,
                 const char* op) {
  auto it = attrs.find(key);
  if (it == attrs.end()) {
    *value = dflt;
    return true;
  }
  if (!parse_double(it->second, value)) {
    MX_ERROR_MSG << op << ": attribute " << key << "='" << it->second << "' is not a number";
    return false;
  }
  return true;
}

// The number of inputs the library's parse reports: ``natural`` (data and the op's other
// inputs), or 1 where the node carries MXNet's extra-inputs attribute (the kernel rule's
// graphs): MXNet's wrapper then counts every input but data as extra and leaves it out of the
// library's shape and type inference, whose buffer it sizes by the sum of the inputs' numbers
// of axes (an unknown shape counting -1; docs/pass.md, "Kernel rule"). Compute functions get
// every input either way.
int parsed_inputs(const Attrs& attrs, int natural) {
  return attrs.count(MX_STR_EXTRA_INPUTS) ? 1 : natural;
}

const char* dtype_name(int dtype) {
  // MXNet's dtype enum (mshadow's TypeFlag; lib_api's MXDType names the first seven)
  switch (dtype) {
    case 0: return "float32";
    case 1: return "float64";
    case 2: return "float16";
    case 3: return "uint8";
    case 4: return "int32";
    case 5: return "int8";
    case 6: return "int64";
    case 7: return "bool";
    case 12: return "bfloat16";
    case -1: return "unknown";
    default: return "an unsupported dtype";
  }
}

bool is_float(int dtype) {
  return dtype == mxnet::ext::kFloat32 || dtype == mxnet::ext::kFloat64;
}

bool is_integer(int dtype) {
  return dtype == mxnet::ext::kInt32 || dtype == mxnet::ext::kInt64 ||
         dtype == mxnet::ext::kUint8 || dtype == mxnet::ext::kInt8;
}

// A shape the library's shape functions can use: at least one axis, no unknown dimension.
// (MXNet's wrapper passes an unknown shape as no axes and an unknown dimension as 2**32 - 1,
// and turns the dimensions returned into int64 as they are: an unknown dimension cannot be
// returned, so a shape holding one is never written back.)
bool known(const std::vector<unsigned>& s) {
  if (s.empty()) return false;
  for (unsigned v : s) {
    if (v == kUnknownDim) return false;
  }
  return true;
}

bool has_unknown_dim(const std::vector<unsigned>& s) {
  for (unsigned v : s) {
    if (v == kUnknownDim) return true;
  }
  return false;
}

std::string shape_str(const std::vector<unsigned>& s) {
  std::ostringstream o;
  o << '(';
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == kUnknownDim) {
      o << '?';
    } else {
      o << s[i];
    }
    o << (s.size() == 1 ? "," : i + 1 < s.size() ? ", " : "");
  }
  o << ')';
  return o.str();
}

// The error of a library op asked about shapes while data's shape is wholly unknown (partial
// inference): MXNet's wrapper writes back every shape the library returns, so an unknown one
// would come back as () (a known scalar) that the next op misreads; the library cannot leave
// it unknown, so it names the fix instead.
// The error for a data shape that is not wholly known (call it only then): an unknown
// dimension, or no shape at all.
MXReturnValue unknown_data(const char* op, const char* mxnet_op,
                           const std::vector<unsigned>& ds) {
  if (has_unknown_dim(ds)) {
    MX_ERROR_MSG << op << ": data's shape " << shape_str(ds) << " has an unknown dimension; the "
                 << "library op needs it whole (MXNet's wrapper of library ops cannot return "
                 << "unknown dimensions)";
    return MX_FAIL;
  }
  MX_ERROR_MSG << op << ": data's shape is unknown; give it (e.g. infer_shape_partial(data=...)"
               << "), or keep MXNet's " << mxnet_op << " with mxmp.Policy(kernels='mxnet') "
               << "(MXNet's wrapper of library ops cannot leave a shape unknown)";
  return MX_FAIL;
}

// Runs fn, turning any C++ exception into MX_FAIL with its message: nothing may be thrown
// across the C interface of lib_api.
template <typename Fn>
MXReturnValue guarded(const char* what, Fn fn) {
  try {
    return fn();
  } catch (const std::exception& err) {
    MX_ERROR_MSG << what << ": " << err.what();
  } catch (...) {
    MX_ERROR_MSG << what << ": unknown C++ exception";
  }
  return MX_FAIL;
}

int64_t last_dim(const MXTensor& t) { return t.shape.empty() ? 1 : t.shape.back(); }

template <typename T>
T* out_ptr(std::vector<MXTensor>* out, size_t i) {
  // an output MXNet does not need may come without memory
  return (*out)[i].data_ptr == nullptr ? nullptr : (*out)[i].data<T>();
}

// ---------------------------------------------------------------------------------------------
// LayerNorm kernels
template <typename T>
void ln_forward(const T* x, const T* gamma, const T* beta, T* y, T* mean, T* rstd,
                int64_t rows, int64_t d, double eps) {
#pragma omp parallel for schedule(static) if (rows * d >= kParallelMin && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * d;
    T* yr = y + r * d;
    double s1 = 0;
#pragma omp simd reduction(+ : s1)
    for (int64_t j = 0; j < d; ++j) s1 += static_cast<double>(xr[j]);
    const double mu = s1 / d;
    double s2 = 0;
#pragma omp simd reduction(+ : s2)
    for (int64_t j = 0; j < d; ++j) {
      const double v = static_cast<double>(xr[j]) - mu;
      s2 += v * v;
    }
    const double rs = 1.0 / std::sqrt(s2 / d + eps);
    mean[r] = static_cast<T>(mu);
    rstd[r] = static_cast<T>(rs);
#pragma omp simd
    for (int64_t j = 0; j < d; ++j) {
      yr[j] = static_cast<T>((static_cast<double>(xr[j]) - mu) * rs *
                             static_cast<double>(gamma[j]) + static_cast<double>(beta[j]));
    }
  }
}

// The number of fixed blocks of rows whose dgamma/dbeta partial sums are kept: a function of
// the shape only (so the result is the same at every thread count), at most 64, at most
// 16 MiB of partial sums.
int64_t ln_blocks(int64_t rows, int64_t d) {
  int64_t n = rows < 64 ? rows : 64;
  const int64_t cap = (int64_t(1) << 20) / (d > 0 ? d : 1);
  if (n > cap) n = cap;
  return n < 1 ? 1 : n;
}

template <typename T>
void ln_backward(const T* dy, const T* x, const T* gamma, const T* mean, const T* rstd,
                 T* dx, T* dgamma, T* dbeta, int64_t rows, int64_t d) {
  const bool params = dgamma != nullptr || dbeta != nullptr;
  const int64_t blocks = ln_blocks(rows, d);
  const int64_t per = (rows + blocks - 1) / blocks;
  // the calling thread's scratch, kept between calls (no page faults per call)
  thread_local std::vector<double> part;
  if (params && part.size() < static_cast<size_t>(2 * blocks * d)) part.resize(2 * blocks * d);
  double* const buf = part.data();   // the team's threads use this pointer (a thread_local
                                     // named inside the loop would be each thread's own)
#pragma omp parallel for schedule(static) if (rows * d >= kParallelMin && blocks > 1)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    double* acc_g = params ? buf + 2 * blk * d : nullptr;
    double* acc_b = params ? acc_g + d : nullptr;
    if (params) {
      for (int64_t j = 0; j < 2 * d; ++j) acc_g[j] = 0;
    }
    const int64_t end = (blk + 1) * per < rows ? (blk + 1) * per : rows;
    for (int64_t r = blk * per; r < end; ++r) {
      const T* xr = x + r * d;
      const T* dyr = dy + r * d;
      const double mf = static_cast<double>(mean[r]), rs = static_cast<double>(rstd[r]);
      // xhat' = (x - mean_f) * rs; the row's exact mean is mean_f + mean_row(x - mean_f)
      double sg = 0, sgx = 0, sx = 0;
#pragma omp simd reduction(+ : sg, sgx, sx)
      for (int64_t j = 0; j < d; ++j) {
        const double v = static_cast<double>(xr[j]) - mf;
        const double g = static_cast<double>(gamma[j]) * static_cast<double>(dyr[j]);
        sg += g;
        sgx += g * v;
        sx += v;
      }
      const double c = sx / d;   // exact mean - mean_f
      const double a = sg / d;
      const double b = (sgx - c * sg) * rs / d;   // mean_row(g * xhat)
      const double shift = mf + c;
      if (dx != nullptr) {
        T* dxr = dx + r * d;
#pragma omp simd
        for (int64_t j = 0; j < d; ++j) {
          const double xh = (static_cast<double>(xr[j]) - shift) * rs;
          const double g = static_cast<double>(gamma[j]) * static_cast<double>(dyr[j]);
          dxr[j] = static_cast<T>(rs * (g - a - xh * b));
        }
      }
      if (params) {
#pragma omp simd
        for (int64_t j = 0; j < d; ++j) {
          const double xh = (static_cast<double>(xr[j]) - shift) * rs;
          acc_g[j] += static_cast<double>(dyr[j]) * xh;
          acc_b[j] += static_cast<double>(dyr[j]);
        }
      }
    }
  }
  if (!params) return;
#pragma omp parallel for schedule(static) if (blocks * d >= kParallelMin)
  for (int64_t j = 0; j < d; ++j) {
    double sg = 0, sb = 0;
    for (int64_t blk = 0; blk < blocks; ++blk) {   // in block order: deterministic
      sg += buf[2 * blk * d + j];
      sb += buf[2 * blk * d + d + j];
    }
    if (dgamma != nullptr) dgamma[j] = static_cast<T>(sg);
    if (dbeta != nullptr) dbeta[j] = static_cast<T>(sb);
  }
}

MXReturnValue ln_parse(const Attrs& attrs, int* num_in, int* num_out) {
  return guarded("mxmp_layer_norm", [&] {
    double eps;
    if (!attr_double(attrs, "eps", 1e-5, &eps, "mxmp_layer_norm")) return MX_FAIL;
    if (!(eps >= 0)) {
      MX_ERROR_MSG << "mxmp_layer_norm: eps must be >= 0, got " << attrs.at("eps");
      return MX_FAIL;
    }
    *num_in = parsed_inputs(attrs, 3);
    *num_out = 3;
    return MX_SUCCESS;
  });
}

MXReturnValue ln_infer_type(const Attrs& attrs, std::vector<int>* in, std::vector<int>* out) {
  return guarded("mxmp_layer_norm", [&] {
    // as MXNet's LayerNorm: one dtype for data, gamma, beta and the outputs, taken from
    // whichever input knows it; all unknown: a partial answer (all stay unknown)
    int t = -1;
    for (int v : *in) {
      if (v == -1) continue;
      if (!is_float(v)) {
        MX_ERROR_MSG << "mxmp_layer_norm: data, gamma and beta must be float32 or float64, "
                     << "got " << dtype_name(v);
        return MX_FAIL;
      }
      if (t != -1 && v != t) {
        MX_ERROR_MSG << "mxmp_layer_norm: data, gamma and beta must have one dtype, got "
                     << dtype_name((*in)[0]) << ", " << dtype_name((*in)[1]) << " and "
                     << dtype_name((*in)[2]);
        return MX_FAIL;
      }
      t = v;
    }
    for (auto& v : *in) v = t;
    for (auto& o : *out) o = t;
    return MX_SUCCESS;
  });
}

MXReturnValue ln_infer_shape(const Attrs& attrs, Shapes* in, Shapes* out) {
  return guarded("mxmp_layer_norm", [&] {
    const auto& ds = (*in)[0];
    if (!known(ds)) return unknown_data("mxmp_layer_norm", "LayerNorm", ds);
    const unsigned d = ds.back();
    uint64_t rows = 1;
    for (size_t i = 0; i + 1 < ds.size(); ++i) rows *= ds[i];
    if (rows > 0xFFFFFFFEu) {
      MX_ERROR_MSG << "mxmp_layer_norm: data " << shape_str(ds) << " has more than 2**32 - 2 "
                   << "rows";
      return MX_FAIL;
    }
    for (size_t i = 1; i < in->size(); ++i) {   // (extra inputs: MXNet's ops shape them)
      // a Gluon Parameter whose size is still deferred arrives as (-1,) (MXNet's unknown
      // dimension) or (0,) (the legacy unknown), a symbol variable without a shape as ():
      // it takes data's last axis
      const auto& s = (*in)[i];
      const bool unknown = s.empty() || (s.size() == 1 && (s[0] == 0 || s[0] == kUnknownDim));
      if (!unknown && !(s.size() == 1 && s[0] == d)) {
        MX_ERROR_MSG << "mxmp_layer_norm: " << (i == 1 ? "gamma" : "beta") << " has shape "
                     << shape_str(s) << ", it must be (" << d << ",) for data "
                     << shape_str(ds);
        return MX_FAIL;
      }
      (*in)[i] = std::vector<unsigned>{d};
    }
    (*out)[0] = ds;
    (*out)[1] = std::vector<unsigned>{static_cast<unsigned>(rows)};
    (*out)[2] = std::vector<unsigned>{static_cast<unsigned>(rows)};
    return MX_SUCCESS;
  });
}

MXReturnValue ln_forward_cpu(const Attrs& attrs, std::vector<MXTensor>* in,
                             std::vector<MXTensor>* out, const OpResource& res) {
  return guarded("mxmp_layer_norm", [&] {
    MXTensor& x = (*in)[0];
    const int64_t d = last_dim(x);
    const int64_t rows = d == 0 ? 0 : x.size() / d;
    double eps;
    if (!attr_double(attrs, "eps", 1e-5, &eps, "mxmp_layer_norm")) return MX_FAIL;
    if (x.dtype == mxnet::ext::kFloat32) {
      ln_forward<float>(x.data<float>(), (*in)[1].data<float>(), (*in)[2].data<float>(),
                        (*out)[0].data<float>(), (*out)[1].data<float>(),
                        (*out)[2].data<float>(), rows, d, eps);
    } else {
      ln_forward<double>(x.data<double>(), (*in)[1].data<double>(), (*in)[2].data<double>(),
                         (*out)[0].data<double>(), (*out)[1].data<double>(),
                         (*out)[2].data<double>(), rows, d, eps);
    }
    return MX_SUCCESS;
  });
}

MXReturnValue ln_backward_cpu(const Attrs& attrs, std::vector<MXTensor>* in,
                              std::vector<MXTensor>* out, const OpResource& res) {
  // in: d out, d mean, d rstd, data, gamma, beta, out, mean, rstd
  return guarded("mxmp_layer_norm backward", [&] {
    MXTensor& x = (*in)[3];
    const int64_t d = last_dim(x);
    const int64_t rows = d == 0 ? 0 : x.size() / d;
    if (x.dtype == mxnet::ext::kFloat32) {
      ln_backward<float>((*in)[0].data<float>(), x.data<float>(), (*in)[4].data<float>(),
                         (*in)[7].data<float>(), (*in)[8].data<float>(), out_ptr<float>(out, 0),
                         out_ptr<float>(out, 1), out_ptr<float>(out, 2), rows, d);
    } else {
      ln_backward<double>((*in)[0].data<double>(), x.data<double>(), (*in)[4].data<double>(),
                          (*in)[7].data<double>(), (*in)[8].data<double>(),
                          out_ptr<double>(out, 0), out_ptr<double>(out, 1),
                          out_ptr<double>(out, 2), rows, d);
    }
    return MX_SUCCESS;
  });
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

bool always(const Attrs& attrs) {
  auto it = attrs.find("mode");
  return it != attrs.end() && it->second == "always";
}

bool inference(MXTensor& flag, const Attrs& attrs) {
  return !always(attrs) && flag.data<float>()[0] == 1.0f;
}

// Elements per block of the dropout loops: a block's hash counter is 32 bits wide (the block
// index enters the second seed) and a block is one thread's unit of work.
const int64_t kDropBlock = 1 << 16;

template <typename T>
void dropout_forward(const T* x, T* y, uint8_t* mask, int64_t n, uint32_t threshold, T scale,
                     uint32_t s1, uint32_t s2) {
  const int64_t blocks = (n + kDropBlock - 1) / kDropBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelMin && blocks > 1)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t start = blk * kDropBlock;
    const int64_t len = start + kDropBlock < n ? kDropBlock : n - start;
    const uint32_t base = static_cast<uint32_t>(start) + s1;
    const uint32_t s2b = s2 ^ static_cast<uint32_t>(start >> 32);
    const T* xb = x + start;
    T* yb = y + start;
    uint8_t* mb = mask + start;
    // no branch in the loop (AVX2 has no masked select of a load: a conditional x[i] kept
    // this loop scalar there); the sign flip makes the unsigned compare a signed one, which
    // AVX2 has
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) {
      const uint32_t h = mix32(mix32(base + static_cast<uint32_t>(i)) ^ s2b);
      const int32_t keep = static_cast<int32_t>(h ^ 0x80000000u) >=
                           static_cast<int32_t>(threshold ^ 0x80000000u);
      mb[i] = static_cast<uint8_t>(keep);
      yb[i] = xb[i] * (keep ? scale : T(0));   // x * 0 for a dropped element: NaN stays NaN
    }
  }
}

MXReturnValue dropout_parse(const Attrs& attrs, int* num_in, int* num_out) {
  return guarded("mxmp_dropout", [&] {
    double p;
    if (!attr_double(attrs, "p", 0.5, &p, "mxmp_dropout")) return MX_FAIL;
    if (!(p > 0 && p < 1)) {
      MX_ERROR_MSG << "mxmp_dropout: p must be in (0, 1), got " << p;
      return MX_FAIL;
    }
    auto it = attrs.find("mode");
    if (it != attrs.end() && it->second != "always" && it->second != "training") {
      MX_ERROR_MSG << "mxmp_dropout: mode must be 'training' or 'always', got '"
                   << it->second << "'";
      return MX_FAIL;
    }
    *num_in = parsed_inputs(attrs, 2);
    *num_out = 2;
    return MX_SUCCESS;
  });
}

MXReturnValue dropout_infer_type(const Attrs& attrs, std::vector<int>* in,
                                 std::vector<int>* out) {
  return guarded("mxmp_dropout", [&] {
    const int t = (*in)[0] != -1 ? (*in)[0] : (*out)[0];
    if (t != -1 && !is_float(t)) {
      MX_ERROR_MSG << "mxmp_dropout: data must be float32 or float64, got " << dtype_name(t);
      return MX_FAIL;
    }
    if (in->size() > 1) {   // the flag, unless an extra input
      if ((*in)[1] != -1 && (*in)[1] != mxnet::ext::kFloat32) {
        MX_ERROR_MSG << "mxmp_dropout: the flag must be float32, got " << dtype_name((*in)[1]);
        return MX_FAIL;
      }
      (*in)[1] = mxnet::ext::kFloat32;
    }
    (*in)[0] = t;
    (*out)[0] = t;
    (*out)[1] = mxnet::ext::kUint8;
    return MX_SUCCESS;
  });
}

MXReturnValue dropout_infer_shape(const Attrs& attrs, Shapes* in, Shapes* out) {
  return guarded("mxmp_dropout", [&] {
    if (in->size() > 1) (*in)[1] = std::vector<unsigned>{1};   // the flag, unless extra
    if (!known((*in)[0])) {
      if (has_unknown_dim((*in)[0])) {
        MX_ERROR_MSG << "mxmp_dropout: data's shape " << shape_str((*in)[0]) << " has an "
                     << "unknown dimension; the library op needs it whole (MXNet's wrapper "
                     << "of library ops cannot return unknown dimensions)";
        return MX_FAIL;
      }
      // no axes: a 0-D tensor (NumPy shapes); an unknown data shape never gets here (MXNet's
      // wrapper fails first: docs/pass.md, "Kernel rule")
      for (auto& o : *out) o.clear();
      return MX_SUCCESS;
    }
    (*out)[0] = (*in)[0];
    (*out)[1] = (*in)[0];
    return MX_SUCCESS;
  });
}

size_t float_bytes(const MXTensor& t) { return t.dtype == mxnet::ext::kFloat32 ? 4 : 8; }

MXReturnValue dropout_forward_cpu(const Attrs& attrs, std::vector<MXTensor>* in,
                                  std::vector<MXTensor>* out, const OpResource& res) {
  return guarded("mxmp_dropout", [&] {
    MXTensor& x = (*in)[0];
    const int64_t n = x.size();
    uint8_t* mask = (*out)[1].data<uint8_t>();
    if (inference((*in)[1], attrs)) {   // the mask is not written: backward reads the flag
      std::memcpy((*out)[0].data_ptr, x.data_ptr, n * float_bytes(x));
      return MX_SUCCESS;
    }
    double p;
    if (!attr_double(attrs, "p", 0.5, &p, "mxmp_dropout")) return MX_FAIL;
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
  });
}

template <typename T>
void dropout_backward(const T* dy, const uint8_t* mask, T* dx, int64_t n, T scale) {
  const int64_t blocks = (n + kDropBlock - 1) / kDropBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelMin && blocks > 1)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t start = blk * kDropBlock;
    const int64_t end = start + kDropBlock < n ? start + kDropBlock : n;
#pragma omp simd
    for (int64_t i = start; i < end; ++i) dx[i] = dy[i] * (static_cast<T>(mask[i]) * scale);
  }
}

MXReturnValue dropout_backward_cpu(const Attrs& attrs, std::vector<MXTensor>* in,
                                   std::vector<MXTensor>* out, const OpResource& res) {
  // in: d out, d mask, data, flag, out, mask; out: d data, d flag
  return guarded("mxmp_dropout backward", [&] {
    MXTensor& dy = (*in)[0];
    const int64_t n = dy.size();
    if ((*out)[1].data_ptr != nullptr) (*out)[1].data<float>()[0] = 0.0f;
    if ((*out)[0].data_ptr == nullptr) return MX_SUCCESS;
    double p;
    if (!attr_double(attrs, "p", 0.5, &p, "mxmp_dropout")) return MX_FAIL;
    if (inference((*in)[3], attrs)) {   // the identity; the mask was not written
      std::memcpy((*out)[0].data_ptr, dy.data_ptr, n * float_bytes(dy));
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
  });
}

// ---------------------------------------------------------------------------------------------
// Softmax kernels
inline float exp_nonpositive(float x) {
  // x <= 0: e^x = 2^n e^r, n = round(x / ln 2), |r| <= ln 2 / 2; below -87: 0; NaN stays NaN.
  // Branch-free (selects of constants), so that the loop calling it vectorises on AVX2 and
  // AVX-512 (with -fno-trapping-math: gcc 12 does not if-convert a float compare without it).
  const float xc = x < -87.0f ? -87.0f : x;
  const float t = xc * 1.44269504088896341f;
  const int32_t n = static_cast<int32_t>(t - 0.5f);   // t <= 0: truncation of t - 1/2 rounds
  const float fn = static_cast<float>(n);
  const float r = (xc - fn * 0.693145751953125f) - fn * 1.42860682030941723e-06f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // 2^n from a float's bits: n is in [-126, 0] for xc in [-87, 0] (for NaN, p is NaN)
  const uint32_t bits = static_cast<uint32_t>(n + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale * (x < -87.0f ? 0.0f : 1.0f);   // a select of constants: vectorises
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
  // two loops: one loop of float exp and a double sum does not vectorise (gcc 12)
#pragma omp simd
  for (int64_t j = 0; j < len; ++j) y[j] = exp_nonpositive(x[j] - mx);
  double sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < len; ++j) sum += static_cast<double>(y[j]);
  const double inv = 1.0 / sum;
#pragma omp simd
  for (int64_t j = 0; j < len; ++j) y[j] = static_cast<T>(static_cast<double>(y[j]) * inv);
  for (int64_t j = len; j < m; ++j) y[j] = 0;
}

template <typename T>
void softmax_grad_row(const T* dy, const T* y, T* dx, int64_t m, int64_t len) {
  if (len < 0) len = 0;
  double dot = 0;
#pragma omp simd reduction(+ : dot)
  for (int64_t j = 0; j < len; ++j) dot += static_cast<double>(dy[j]) * y[j];
  const T dt = static_cast<T>(dot);
#pragma omp simd
  for (int64_t j = 0; j < len; ++j) dx[j] = y[j] * (dy[j] - dt);
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
    case mxnet::ext::kInt32: v = length.data<int32_t>()[r]; break;
    case mxnet::ext::kInt64: v = length.data<int64_t>()[r]; break;
    case mxnet::ext::kUint8: v = length.data<uint8_t>()[r]; break;
    case mxnet::ext::kInt8: v = length.data<int8_t>()[r]; break;
    case mxnet::ext::kFloat32: v = static_cast<int64_t>(length.data<float>()[r]); break;
    case mxnet::ext::kFloat64: v = static_cast<int64_t>(length.data<double>()[r]); break;
    default: v = m;   // not reached: infer_type admits these dtypes only
  }
  return v < 0 ? 0 : v < m ? v : m;
}

MXReturnValue softmax_parse(const Attrs& attrs, int* num_in, int* num_out) {
  return guarded("mxmp_softmax", [&] {
    *num_in = parsed_inputs(attrs, use_length(attrs) ? 2 : 1);
    *num_out = 1;
    return MX_SUCCESS;
  });
}

MXReturnValue softmax_infer_type(const Attrs& attrs, std::vector<int>* in,
                                 std::vector<int>* out) {
  return guarded("mxmp_softmax", [&] {
    const int t = (*in)[0] != -1 ? (*in)[0] : (*out)[0];
    if (t != -1 && !is_float(t)) {
      MX_ERROR_MSG << "mxmp_softmax: data must be float32 or float64, got " << dtype_name(t);
      return MX_FAIL;
    }
    if (in->size() > 1) {
      // integer lengths (MXNet's softmax takes these only), float32 and float64 too
      if ((*in)[1] != -1 && !is_integer((*in)[1]) && !is_float((*in)[1])) {
        MX_ERROR_MSG << "mxmp_softmax: length must be int32, int64, uint8, int8, float32 or "
                     << "float64, got " << dtype_name((*in)[1]);
        return MX_FAIL;
      }
      if ((*in)[1] == -1) (*in)[1] = mxnet::ext::kInt32;
    }
    (*in)[0] = t;
    (*out)[0] = t;
    return MX_SUCCESS;
  });
}

MXReturnValue softmax_infer_shape(const Attrs& attrs, Shapes* in, Shapes* out) {
  return guarded("mxmp_softmax", [&] {
    const auto& ds = (*in)[0];
    if (!known(ds)) return unknown_data("mxmp_softmax", "softmax", ds);
    if (in->size() > 1) {
      // data's shape without its last axis; (1,) for 1-D data, as MXNet's softmax
      std::vector<unsigned> ls(ds.begin(), ds.end() - 1);
      if (ls.empty()) ls.push_back(1);
      const auto& given = (*in)[1];
      const bool unknown = given.empty() ||
                           (given.size() == ls.size() && has_unknown_dim(given));
      if (!unknown && given != ls) {
        bool fits = given.size() == ls.size();
        for (size_t i = 0; fits && i < ls.size(); ++i) {
          fits = given[i] == ls[i] || given[i] == 0 || given[i] == kUnknownDim;
        }
        if (!fits) {
          MX_ERROR_MSG << "mxmp_softmax: length has shape " << shape_str(given)
                       << ", it must be " << shape_str(ls) << " for data " << shape_str(ds);
          return MX_FAIL;
        }
      }
      (*in)[1] = ls;
    }
    (*out)[0] = ds;
    return MX_SUCCESS;
  });
}

template <typename T>
void softmax_all(MXTensor& x, MXTensor* length, T* y) {
  const int64_t m = last_dim(x);
  const int64_t rows = m == 0 ? 0 : x.size() / m;
  const T* xd = x.data<T>();
#pragma omp parallel for schedule(static) if (rows * m >= kParallelMin && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t len = length != nullptr ? length_at(*length, r, m) : m;
    softmax_row<T>(xd + r * m, y + r * m, m, len);
  }
}

MXReturnValue softmax_forward_cpu(const Attrs& attrs, std::vector<MXTensor>* in,
                                  std::vector<MXTensor>* out, const OpResource& res) {
  return guarded("mxmp_softmax", [&] {
    MXTensor* length = in->size() > 1 ? &(*in)[1] : nullptr;
    if ((*in)[0].dtype == mxnet::ext::kFloat32) {
      softmax_all<float>((*in)[0], length, (*out)[0].data<float>());
    } else {
      softmax_all<double>((*in)[0], length, (*out)[0].data<double>());
    }
    return MX_SUCCESS;
  });
}

template <typename T>
void softmax_grad_all(std::vector<MXTensor>* in, T* dx, bool with_length) {
  // in: d out, data, [length, [the rule's shape tie]], out
  MXTensor& dy = (*in)[0];
  MXTensor& y = in->back();
  MXTensor* length = with_length ? &(*in)[2] : nullptr;
  const int64_t m = last_dim(dy);
  const int64_t rows = m == 0 ? 0 : dy.size() / m;
  const T* dyd = dy.data<T>();
  const T* yd = y.data<T>();
#pragma omp parallel for schedule(static) if (rows * m >= kParallelMin && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t len = length != nullptr ? length_at(*length, r, m) : m;
    softmax_grad_row<T>(dyd + r * m, yd + r * m, dx + r * m, m, len);
  }
}

MXReturnValue softmax_backward_cpu(const Attrs& attrs, std::vector<MXTensor>* in,
                                   std::vector<MXTensor>* out, const OpResource& res) {
  return guarded("mxmp_softmax backward", [&] {
    const bool with_length = use_length(attrs);
    for (size_t i = 1; i < out->size(); ++i) {   // length and the rule's shape tie: zero
      MXTensor& g = (*out)[i];
      if (g.data_ptr == nullptr) continue;
      const int bytes = g.dtype == mxnet::ext::kFloat64 || g.dtype == mxnet::ext::kInt64 ? 8 :
                        g.dtype == mxnet::ext::kUint8 || g.dtype == mxnet::ext::kInt8 ? 1 :
                        g.dtype == mxnet::ext::kFloat16 ? 2 : 4;
      std::memset(g.data_ptr, 0, g.size() * bytes);
    }
    if ((*out)[0].data_ptr == nullptr) return MX_SUCCESS;
    if ((*in)[0].dtype == mxnet::ext::kFloat32) {
      softmax_grad_all<float>(in, (*out)[0].data<float>(), with_length);
    } else {
      softmax_grad_all<double>(in, (*out)[0].data<double>(), with_length);
    }
    return MX_SUCCESS;
  });
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
