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
//   inputs  data (..., D), gamma (D,), beta (D,)            float32 or float64, one dtype; or
//           bfloat16 data with float32 (master) or bfloat16 gamma and beta
//   outputs out (..., D) in data's dtype; mean (rows,), rstd (rows,)  rows = data.size / D,
//           in data's dtype, float32 for bfloat16 data
//   out = (data - mean) * rstd * gamma + beta, rstd = 1 / sqrt(var + eps), var biased.
//   attrs   eps (default 1e-5), copy_out (0/1, default 0)
//   copy_out=1 (the kernel rule's, where out has two readers): a fourth output, LAST (mean and
//   rstd keep outputs 1 and 2), a copy of out that the second reader reads. Its backward gets
//   both gradients of out and sums them first (a separate parallel pass: dy + dcopy in float32,
//   float64 for float64 data, rounded once to data's dtype, as MXNet's add_n of the two), then
//   runs the LayerNorm backward on the sum: MXNet no longer sums them with add_n (whose
//   bfloat16 kernel converts element by element).
//   Numerics: a row's mean and variance are two passes in double (sum, then the sum of
//   squared deviations from that mean): exact to double rounding whatever the row's mean,
//   spread or outliers; the output is computed in double and rounded once. (bfloat16 data on
//   AVX-512 builds: ln_forward_row_avx512, the sums about a float32 estimate of the mean, the
//   output in float32 where that provably rounds as the double result: the same values up to
//   the order of the double additions.)
// Backward (inputs: d out, d mean, d rstd, data, gamma, beta, out, mean, rstd (with copy_out:
// d out, d mean, d rstd, d copy, data, gamma, beta, out, mean, rstd, copy); the gradients of
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
//   inputs  data (any shape, float32, float64 or bfloat16), flag (1,) float32: 1 in inference
//           (the output of MXNet's own Dropout on a constant 1: 1 at inference, 0 or 2 in
//           training; library ops are not told the training mode)
//   outputs out (data's shape and dtype), seeds (2,) int32: the bits of the call's two seed
//           words s1, s2 (0, 0 in inference, where nothing is drawn and backward is the
//           identity)
//   attrs   p (drop probability, 0 < p < 1), mode ('training': identity where flag is 1;
//           'always': dropout in inference too)
//   Element i of a call is kept when h(i) >= p * 2**32, h two rounds of a 32-bit integer hash
//   seeded by 64 bits drawn from MXNet's CPU generator (mx.random.seed sets it); out = x * s,
//   s = 1 / (1 - p) where kept and 0 where dropped, as MXNet's x * mask: a NaN or inf that is
//   dropped gives NaN, as in MXNet. h(i) = mix32(mix32(s1 + i mod 2**32) ^ s2 ^ (i >> 32)),
//   i the element's index in the whole tensor (mix32 below). Backward: dx = dy * s, the keep
//   decisions recomputed from the seeds output (MXNet 1.9.1 keeps every output of a library
//   op for its backward and feeds each a zero head gradient: 8 bytes here, where a uint8
//   mask of data's shape cost n bytes kept and a zero fill of n bytes per call).
//
// mxmp_softmax: softmax over the last axis, optionally with lengths (MXNet's use_length).
//   inputs  data (..., M) float32, float64 or bfloat16; with use_length, length (data's shape
//           without its last axis, (1,) for 1-D data, as MXNet's softmax; an integer dtype, or
//           float32 or float64 (truncated), which MXNet's softmax refuses at run time): row r
//           uses its first length[r] values (clamped to [0, M]), the rest are 0
//   output  out (data's shape and dtype)
//   exp is computed here (Cody-Waite reduction by ln 2, degree-7 Taylor polynomial: relative
//   error below 2e-7 on [-87, 0]); below -87 it is 0. The row sum is in double.
//   Backward: dx = out * (dy - sum_row(dy * out)) over the row's length (the sum in double),
//   0 beyond it; length gets a zero gradient. bfloat16: out is recomputed from data in float32
//   (the rounded output would cancel to bfloat16's error where a probability is near 1).
//
// bfloat16 (MXNet's dtype 12; the build patches lib_api to pass it: build.py): every kernel
// loads bfloat16 into float32 (exact: a shift), computes as for float32 data (statistics and
// row sums in double where the float32 kernel has them) and stores its results rounded to
// bfloat16 once, to nearest even (as MXNet's amp_cast and oneDNN; NaN stays a quiet NaN).
//
// mxmp_selfatt_qk, mxmp_selfatt_valatt, mxmp_encdec_qk, mxmp_encdec_valatt: MXNet's
// _contrib_interleaved_matmul_* (same inputs, outputs, shapes and `heads` attribute) with
// bfloat16 products and float32 accumulation. Inputs and outputs float32 or bfloat16 (one
// dtype; float32 inputs are rounded to bfloat16, nearest even). With d the head dimension and
// g = b * heads + h (per sequence position, the last axis holds the heads in order, each its
// query, key and value, or for encdec's keys_values its key and value, d values each):
//   selfatt_qk(qkv (L, B, 3 heads d))            -> (B heads, L, L),  q_i . k_j / sqrt(d)
//   selfatt_valatt(qkv, att (B heads, L, L))     -> (L, B, heads d),  sum_j att[g, i, j] v_j
//   encdec_qk(q (Lq, B, heads d), kv (Lk, B, 2 heads d)) -> (B heads, Lq, Lk)
//   encdec_valatt(kv, att (B heads, Lq, Lk))     -> (Lq, B, heads d)
// 1/sqrt(d) is float32 and scales the float32 sum once, as MXNet's GEMM alpha. Backward: the
// transposed products; the parts of an interleaved input an op does not read get zeros.
// The self-attention pair (the kernel rule's, where qkv has these two readers alone):
//   selfatt_qk(qkv, emit_v=1)              -> scores, and v (seq, batch, heads d): a copy of
//                                             the values' parts of qkv
//   selfatt_valatt(v, att, v_only=1)       -> the same context, reading v
//   Backward: valatt writes dv (seq, batch, heads d) alone; qk receives it as its second
//   output's gradient and writes the whole dqkv once (queries and keys from d scores, the
//   values' parts a copy of dv): no zeros, and no sum of two dqkv for MXNet to do. The same
//   products and roundings as the two ops reading qkv, so the same bits.
//
// mxmp_multi_sgd_update: one SGD (with or without momentum) step over many float32 weights in
// one call, the numbers of MXNet's multi_sgd_update / multi_sgd_mom_update bit for bit, and
// for weights kept in bfloat16 with a float32 master (mxmp.Trainer's master weights) the
// bfloat16 copy written in the same pass (as MXNet's amp_cast: nearest even, NaN quiet).
//   attrs   num_weights n, lrs and wds (tuples of n floats), momentum, rescale_grad,
//           clip_gradient (< 0: no clipping), with_momentum (0/1), targets (a string of n
//           '0'/'1': which weights also write a bfloat16 copy)
//   inputs  per weight: weight (float32), grad (float32 or bfloat16: loaded exactly), and with
//           momentum its state mom (float32)
//   outputs the n weights, then with momentum the n moms, then one bfloat16 array per '1' of
//           targets (called with out= those very arrays: the update is in place)
//   mom = momentum * mom - lr * wd * w - lr * rescale_grad * grad   (no momentum: mom = 0)
//   (clipping: ... - lr * clip(rescale_grad * grad, clip_gradient)); w = w + mom; evaluated
//   left to right in float32 without fused multiply-adds, as MXNet's kernel. The scalars are
//   read from their attribute strings by the parsers MXNet uses for them (dmlc::stof for the
//   single floats, an istream for the tuples), so each is the float32 MXNet's op would use.
//   Threads: the elements of all weights are cut into fixed blocks spread over one parallel
//   loop (every element is independent: the result does not depend on the thread count).
//
// mxmp_batch_dot: MXNet's batch_dot (same inputs, shapes and transpose_a/transpose_b
//   attributes) with bfloat16 products and float32 accumulation, on the attention matmuls'
//   GEMM. Inputs and output float32 or bfloat16 (one dtype; float32 inputs are rounded to
//   bfloat16, nearest even). a (..., M, K) (transpose_a: (..., K, M)), b (..., K, N)
//   (transpose_b: (..., N, K)), both of the same number of axes (at least 3) and the same
//   leading (batch) axes -> out (..., M, N) = op(a) op(b) per batch element. Backward: the
//   transposed products (da = dout op(b)^T, db = op(a)^T dout, as stored).
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
#include <cstdlib>
#include <cstring>
#include <limits>
#include <locale>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "dmlc/strtonum.h"
#include "mxnet/lib_api.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

using mxnet::ext::MXReturnValue;
using mxnet::ext::MXTensor;
using mxnet::ext::OpResource;
using mxnet::ext::MX_FAIL;
using mxnet::ext::MX_SUCCESS;
typedef std::unordered_map<std::string, std::string> Attrs;
typedef std::vector<std::vector<unsigned>> Shapes;

namespace {

// MXNet's bfloat16 (dtype enum 12): the upper 16 bits of a float32.
struct bf16 {
  uint16_t bits;
};
const int kBfloat16 = 12;
static_assert(sizeof(bf16) == 2, "bf16 is two bytes");

// Num<T>: C, the type a kernel computes T in; load(T) -> C exactly; store(a number) -> T
// rounded once (bfloat16: to nearest even from float32; a double goes through float32, as the
// float32 kernel followed by MXNet's cast).
template <typename T>
struct Num {
  typedef T C;
  static inline T load(T v) { return v; }
  template <typename V>
  static inline T store(V v) { return static_cast<T>(v); }
};
template <>
struct Num<bf16> {
  typedef float C;
  static inline float load(bf16 v) {
    const uint32_t b = static_cast<uint32_t>(v.bits) << 16;
    float f;
    std::memcpy(&f, &b, sizeof f);
    return f;
  }
  static inline bf16 store(float f) {
    uint32_t b;
    std::memcpy(&b, &f, sizeof b);
    const uint32_t rounded = (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
    const uint32_t quiet = (b >> 16) | 0x40u;   // a NaN stays NaN (its payload's top kept)
    const bool nan = (b & 0x7FFFFFFFu) > 0x7F800000u;
    return bf16{static_cast<uint16_t>(nan ? quiet : rounded)};
  }
  static inline bf16 store(double v) { return store(static_cast<float>(v)); }
  static inline bf16 store(int v) { return store(static_cast<float>(v)); }
};
template <typename T>
inline double wide(T v) { return static_cast<double>(Num<T>::load(v)); }

// A row of n values of type T widened to its compute type (exact), and back (rounded once).
template <typename T>
void widen_row(const T* x, typename Num<T>::C* e, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) e[j] = Num<T>::load(x[j]);
}

template <typename T>
void narrow_row(const typename Num<T>::C* e, T* y, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) y[j] = Num<T>::store(e[j]);
}

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
    case kBfloat16: return "bfloat16";
    case -1: return "unknown";
    default: return "an unsupported dtype";
  }
}

bool is_float(int dtype) {
  return dtype == mxnet::ext::kFloat32 || dtype == mxnet::ext::kFloat64;
}

// A data dtype of the library's ops.
bool is_data(int dtype) { return is_float(dtype) || dtype == kBfloat16; }

size_t dtype_bytes(int dtype) {
  return dtype == mxnet::ext::kFloat64 || dtype == mxnet::ext::kInt64 ? 8 :
         dtype == mxnet::ext::kUint8 || dtype == mxnet::ext::kInt8 ? 1 :
         dtype == mxnet::ext::kFloat16 || dtype == kBfloat16 ? 2 : 4;
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

bool attr_flag(const Attrs& attrs, const char* key, const char* op, bool allowed, bool* value);

// ---------------------------------------------------------------------------------------------
// LayerNorm kernels
// T: data and out; P: gamma and beta; S: mean and rstd.
// One row of d values (float32 or float64; bfloat16 rows are widened first: ln_forward).
template <typename T, typename P, typename S>
void ln_forward_row(const T* xr, const P* gamma, const P* beta, T* yr, S* mean, S* rstd,
                    int64_t d, double eps) {
  double s1 = 0;
#pragma omp simd reduction(+ : s1)
  for (int64_t j = 0; j < d; ++j) s1 += wide(xr[j]);
  const double mu = s1 / d;
  double s2 = 0;
#pragma omp simd reduction(+ : s2)
  for (int64_t j = 0; j < d; ++j) {
    const double v = wide(xr[j]) - mu;
    s2 += v * v;
  }
  const double rs = 1.0 / std::sqrt(s2 / d + eps);
  *mean = static_cast<S>(mu);
  *rstd = static_cast<S>(rs);
#pragma omp simd
  for (int64_t j = 0; j < d; ++j) {
    yr[j] = Num<T>::store((wide(xr[j]) - mu) * rs * wide(gamma[j]) + wide(beta[j]));
  }
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && \
    defined(__AVX512VL__)
// 16-lane pieces of the AVX-512 row kernels (LayerNorm, softmax): the first n lanes (n in
// [1, 16]); 16 values loaded as float32 (bfloat16 widened exactly), lanes outside k 0; the
// low and high 8 lanes of a float32 vector as doubles.
inline __mmask16 vec_lanes(int64_t n) {
  return static_cast<__mmask16>(n >= 16 ? 0xFFFFu : (1u << n) - 1u);
}
inline __m512 vec_load16(const float* p, __mmask16 k) { return _mm512_maskz_loadu_ps(k, p); }
inline __m512 vec_load16(const bf16* p, __mmask16 k) {
  const __m256i h = _mm256_maskz_loadu_epi16(k, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline __m512d vec_lo8(__m512 v) { return _mm512_cvtps_pd(_mm512_castps512_ps256(v)); }
inline __m512d vec_hi8(__m512 v) { return _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)); }
#endif

// The AVX-512 forward of a bfloat16 row (AVX-512 builds with AVX512-BF16: ln_forward): the
// numbers of ln_forward_row on the widened row, by a shorter route.
// Statistics: k, the row's mean from float32 sums (converting every value to double cost twice
// the loop), then in double the sums of x - k and of (x - k)**2: mean = k + mean(x - k),
// var = mean((x - k)**2) - mean(x - k)**2. k is within float32's rounding of the mean, so the
// correction is tiny against var and both are exact to double rounding as the two passes are
// (only the order of the double additions differs; a row whose float32 sum is not finite
// takes k from a double sum). mean and rstd are the same roundings of them.
// Output: computed in float32 from them and checked against the double result's rounding:
//   v = (x - mh) - ml (mh + ml: mean as two float32), t = v * float(rstd), y = t * g + b (FMA).
// Against y_d, the double result, |y - y_d| <= E = c |y| + c |b| + a |g|: c = 2**-20 (four
// times the float32 roundings' bound, 2**-22 (|y| + |b|) + 2**-24 |y|, with room for the
// double sums' order), a = rstd (the two floats' 2**-47 |mean|, the double sums' order
// d 2**-52 (|mean| + sd), 2**-125 for ml and v's underflow) + 2**-125 (t's underflow; both
// also where the caller's MXCSR flushes subnormals to zero). Where |y| >= 2**-100 (so that
// E is a normal float32) and y - E and y + E round (nearest even, vcvtneps2bf16) to the same
// bfloat16, the double result, between them, rounds to it too (rounding is monotone); elsewhere
// (near a rounding tie, and every element of a row with NaN or inf) the element is
// computed in double as ln_forward_row does. vcvtneps2bf16 flushes float32 subnormals to
// zero (round_bf16 does not): only normal y (then lo, hi differ where either is subnormal)
// take its result. (One conversion of y with an integer test of lo and hi's rounding gave the
// same bits and took 0.52 ms against 0.41 at 1024x768; with no check, 0.29 ms, 1 output in
// 10**5 differed, NaN rows among them.)
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && \
    defined(__AVX512VL__) && defined(__AVX512BF16__)
#define MXMP_LN_AVX512 1

// c of the bound above (2**-20, and room for d * 2**-52, the double sums' relative order error).
inline float ln_c(int64_t d) { return 0x1p-20f + static_cast<float>(d) * 0x1p-50f; }

// The call's columns, float32: g, b (gamma, beta; exact), ga = |gamma|, bc = c |beta|.
struct LnCols {
  const float* g;
  const float* b;
  const float* ga;
  const float* bc;
};

template <typename P, typename S>
void ln_forward_row_avx512(const bf16* xr, const P* gamma, const P* beta, const LnCols& cols,
                           bf16* yr, S* mean, S* rstd, int64_t d, double eps) {
  // the shift k: the row's mean summed in float32 (four vectors of partial sums), exact to
  // float32's roundings; a row where that is not finite (inf, NaN, or a float32 overflow):
  // the sum in double
  __m512 f0 = _mm512_setzero_ps(), f1 = f0, f2 = f0, f3 = f0;
  int64_t j = 0;
  for (; j + 64 <= d; j += 64) {
    f0 = _mm512_add_ps(f0, vec_load16(xr + j, 0xFFFF));
    f1 = _mm512_add_ps(f1, vec_load16(xr + j + 16, 0xFFFF));
    f2 = _mm512_add_ps(f2, vec_load16(xr + j + 32, 0xFFFF));
    f3 = _mm512_add_ps(f3, vec_load16(xr + j + 48, 0xFFFF));
  }
  for (; j < d; j += 16) f0 = _mm512_add_ps(f0, vec_load16(xr + j, vec_lanes(d - j)));
  const __m512 f = _mm512_add_ps(_mm512_add_ps(f0, f1), _mm512_add_ps(f2, f3));
  double k = (_mm512_reduce_add_pd(vec_lo8(f)) + _mm512_reduce_add_pd(vec_hi8(f))) / d;
  if (!std::isfinite(static_cast<float>(k))) {
    __m512d s0 = _mm512_setzero_pd(), s1 = s0;
    for (j = 0; j < d; j += 16) {   // lanes beyond d load 0
      const __m512 x0 = vec_load16(xr + j, vec_lanes(d - j));
      s0 = _mm512_add_pd(s0, vec_lo8(x0));
      s1 = _mm512_add_pd(s1, vec_hi8(x0));
    }
    k = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1)) / d;
  } else {
    k = static_cast<float>(k);
  }
  // the sums of x - k and of its squares in double
  const __m512d k8 = _mm512_set1_pd(k);
  __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  __m512d b0 = a0, b1 = a0;
  for (j = 0; j + 16 <= d; j += 16) {
    const __m512 x0 = vec_load16(xr + j, 0xFFFF);
    const __m512d v0 = _mm512_sub_pd(vec_lo8(x0), k8), v1 = _mm512_sub_pd(vec_hi8(x0), k8);
    b0 = _mm512_add_pd(b0, v0);
    b1 = _mm512_add_pd(b1, v1);
    a0 = _mm512_fmadd_pd(v0, v0, a0);
    a1 = _mm512_fmadd_pd(v1, v1, a1);
    std::swap(a0, a2);
    std::swap(a1, a3);
  }
  if (j < d) {   // lanes beyond d give 0
    const __mmask16 m = vec_lanes(d - j);
    const __m512 x0 = vec_load16(xr + j, m);
    const __m512d v0 = _mm512_maskz_sub_pd(static_cast<__mmask8>(m), vec_lo8(x0), k8);
    const __m512d v1 = _mm512_maskz_sub_pd(static_cast<__mmask8>(m >> 8), vec_hi8(x0), k8);
    b0 = _mm512_add_pd(b0, v0);
    b1 = _mm512_add_pd(b1, v1);
    a0 = _mm512_fmadd_pd(v0, v0, a0);
    a1 = _mm512_fmadd_pd(v1, v1, a1);
  }
  const double c1 = _mm512_reduce_add_pd(_mm512_add_pd(b0, b1)) / d;
  const double mu = std::isfinite(k) ? k + c1 : k;   // (not finite: the double sum's, as is)
  const double var =
      _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(a0, a1), _mm512_add_pd(a2, a3))) / d -
      c1 * c1;
  const double rs = 1.0 / std::sqrt(var + eps);
  *mean = static_cast<S>(mu);
  *rstd = static_cast<S>(rs);
  const double a = rs * (std::fabs(mu) * (0x1p-47 + d * 0x1p-52) + d * 0x1p-52 *
                         std::sqrt(var) + 0x1p-125) + 0x1p-125;
  const float mh = static_cast<float>(mu);
  const float ml = static_cast<float>(mu - static_cast<double>(mh));
  // a row whose statistics are not finite numbers (NaN, inf): every element in double
  const bool fast = a < 0x1p100 && std::isfinite(mh) && std::isfinite(rs);
  const __m512 mhv = _mm512_set1_ps(mh), mlv = _mm512_set1_ps(ml);
  const __m512 rv = _mm512_set1_ps(static_cast<float>(rs));
  const __m512 av = _mm512_set1_ps(static_cast<float>(a));
  const __m512 cv = _mm512_set1_ps(ln_c(d));
  const __m512i absm = _mm512_set1_epi32(0x7FFFFFFF);
  const __m512 tiny = _mm512_set1_ps(0x1p-100f);
  for (j = 0; j < d; j += 16) {
    const __mmask16 m = vec_lanes(d - j);
    __mmask16 slow = m;
    if (fast) {
      const __m512 x = vec_load16(xr + j, m);
      const __m512 g = _mm512_maskz_loadu_ps(m, cols.g + j);
      const __m512 b = _mm512_maskz_loadu_ps(m, cols.b + j);
      const __m512 v = _mm512_sub_ps(_mm512_sub_ps(x, mhv), mlv);
      const __m512 y = _mm512_fmadd_ps(_mm512_mul_ps(v, rv), g, b);
      const __m512 ya = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(y), absm));
      const __m512 e = _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, cols.ga + j),
                                       _mm512_fmadd_ps(cv, ya,
                                                       _mm512_maskz_loadu_ps(m, cols.bc + j)));
      const __m256i lo = (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(y, e));
      const __m256i hi = (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(y, e));
      // not normal: QNaN 0x01, +-0 0x06, +-inf 0x18, subnormal 0x20, SNaN 0x80; or below
      // 2**-100 (E then a normal float32 even where a caller set flush-to-zero)
      slow = m & (_mm512_fpclass_ps_mask(y, 0xBF) | _mm512_cmp_ps_mask(ya, tiny, _CMP_LT_OQ) |
                  ~_mm256_cmpeq_epi16_mask(lo, hi));
      _mm256_mask_storeu_epi16(yr + j, m, lo);
    }
    while (slow) {
      const int k = __builtin_ctz(slow);
      slow = static_cast<__mmask16>(slow & (slow - 1));
      yr[j + k] = Num<bf16>::store((wide(xr[j + k]) - mu) * rs * wide(gamma[j + k]) +
                                   wide(beta[j + k]));
    }
  }
}
#endif

template <typename T, typename P, typename S>
void ln_forward(const T* x, const P* gamma, const P* beta, T* y, S* mean, S* rstd,
                int64_t rows, int64_t d, double eps) {
  typedef typename Num<T>::C C;
#ifdef MXMP_LN_AVX512
  if constexpr (std::is_same<T, bf16>::value) {
    // the calling thread's columns (ln_forward_row_avx512), kept between calls
    thread_local std::vector<float> colbuf;
    if (colbuf.size() < static_cast<size_t>(4 * d)) colbuf.resize(4 * d);
    float* const cb = colbuf.data();
    const float c = ln_c(d);
    for (int64_t j = 0; j < d; ++j) {
      cb[j] = Num<P>::load(gamma[j]);
      cb[d + j] = Num<P>::load(beta[j]);
      cb[2 * d + j] = std::fabs(cb[j]);
      cb[3 * d + j] = c * std::fabs(cb[d + j]);
    }
    const LnCols cols{cb, cb + d, cb + 2 * d, cb + 3 * d};
#pragma omp parallel for schedule(static) if (rows * d >= kParallelMin && rows > 1)
    for (int64_t r = 0; r < rows; ++r) {
      ln_forward_row_avx512<P, S>(x + r * d, gamma, beta, cols, y + r * d, mean + r, rstd + r,
                                  d, eps);
    }
    return;
  }
#endif
#pragma omp parallel for schedule(static) if (rows * d >= kParallelMin && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    if constexpr (std::is_same<T, C>::value) {
      ln_forward_row<T, P, S>(x + r * d, gamma, beta, y + r * d, mean + r, rstd + r, d, eps);
    } else {
      // bfloat16: the row widened to float32 (exact), the float32 loops on it, the output
      // rounded once (as the double result through float32 before: the same values). Loops
      // of bfloat16 loads widened to double took 1.5x the float32 kernel's time.
      thread_local std::vector<C> scratch;   // each thread's own rows
      if (scratch.size() < static_cast<size_t>(2 * d)) scratch.resize(2 * d);
      C* xf = scratch.data();
      C* yf = xf + d;
      widen_row(x + r * d, xf, d);
      ln_forward_row<C, P, S>(xf, gamma, beta, yf, mean + r, rstd + r, d, eps);
      narrow_row(yf, y + r * d, d);
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

// One row's dx (where dx is not null) and its dgamma/dbeta terms added to acc_g, acc_b (where
// params); float32 or float64 (bfloat16 rows are widened first: ln_backward).
template <typename T, typename P, typename S>
void ln_backward_row(const T* dyr, const T* xr, const P* gamma, S mean, S rstd, T* dxr,
                     double* acc_g, double* acc_b, int64_t d) {
  const bool params = acc_g != nullptr;
  const double mf = static_cast<double>(mean), rs = static_cast<double>(rstd);
  // xhat' = (x - mean_f) * rs; the row's exact mean is mean_f + mean_row(x - mean_f)
  double sg = 0, sgx = 0, sx = 0;
#pragma omp simd reduction(+ : sg, sgx, sx)
  for (int64_t j = 0; j < d; ++j) {
    const double v = wide(xr[j]) - mf;
    const double g = wide(gamma[j]) * wide(dyr[j]);
    sg += g;
    sgx += g * v;
    sx += v;
  }
  const double c = sx / d;   // exact mean - mean_f
  const double a = sg / d;
  const double b = (sgx - c * sg) * rs / d;   // mean_row(g * xhat)
  const double shift = mf + c;
  if (dxr != nullptr) {
#pragma omp simd
    for (int64_t j = 0; j < d; ++j) {
      const double xh = (wide(xr[j]) - shift) * rs;
      const double g = wide(gamma[j]) * wide(dyr[j]);
      dxr[j] = Num<T>::store(rs * (g - a - xh * b));
    }
  }
  if (params) {
#pragma omp simd
    for (int64_t j = 0; j < d; ++j) {
      const double xh = (wide(xr[j]) - shift) * rs;
      acc_g[j] += wide(dyr[j]) * xh;
      acc_b[j] += wide(dyr[j]);
    }
  }
}

template <typename T, typename P, typename S>
void ln_backward(const T* dy, const T* x, const P* gamma, const S* mean, const S* rstd,
                 T* dx, P* dgamma, P* dbeta, int64_t rows, int64_t d) {
  typedef typename Num<T>::C C;
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
    C* xf = nullptr;
    C* dyf = nullptr;
    C* dxf = nullptr;
    if constexpr (!std::is_same<T, C>::value) {
      thread_local std::vector<C> rows_f;   // each thread's own rows
      if (rows_f.size() < static_cast<size_t>(3 * d)) rows_f.resize(3 * d);
      xf = rows_f.data();
      dyf = xf + d;
      dxf = dyf + d;
    }
    for (int64_t r = blk * per; r < end; ++r) {
      const T* xr = x + r * d;
      const T* dyr = dy + r * d;
      T* dxr = dx != nullptr ? dx + r * d : nullptr;
      if constexpr (std::is_same<T, C>::value) {
        ln_backward_row<T, P, S>(dyr, xr, gamma, mean[r], rstd[r], dxr, acc_g, acc_b, d);
      } else {
        // bfloat16: the rows widened to float32 (exact), the float32 loops on them, dx
        // rounded once (as ln_forward)
        widen_row(xr, xf, d);
        widen_row(dyr, dyf, d);
        ln_backward_row<C, P, S>(dyf, xf, gamma, mean[r], rstd[r],
                                 dxr != nullptr ? dxf : nullptr, acc_g, acc_b, d);
        if (dxr != nullptr) narrow_row(dxf, dxr, d);
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
    if (dgamma != nullptr) dgamma[j] = Num<P>::store(sg);
    if (dbeta != nullptr) dbeta[j] = Num<P>::store(sb);
  }
}

// copy_out (module comment): out's copy, output 3, for out's second reader.
bool ln_copy_out(const Attrs& attrs, bool* copy) {
  return attr_flag(attrs, "copy_out", "mxmp_layer_norm", true, copy);
}

// The copy of out (n values of T) into copy, and the backward's sum of out's two gradients,
// dy + dcopy into sum (float32 arithmetic for bfloat16, rounded once to nearest even): one
// parallel pass each, beside the LayerNorm loops (which then run on out and the sum as without
// the copy).
template <typename T>
void ln_copy(const T* y, T* copy, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t b = 0; b < n; b += kParallelMin) {
    const int64_t e = b + kParallelMin < n ? b + kParallelMin : n;
    std::memcpy(copy + b, y + b, (e - b) * sizeof(T));
  }
}

template <typename T>
void ln_sum_grads(const T* dy, const T* dcopy, T* sum, int64_t n) {
  typedef typename Num<T>::C C;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t b = 0; b < n; b += kParallelMin) {
    const int64_t e = b + kParallelMin < n ? b + kParallelMin : n;
#pragma omp simd
    for (int64_t i = b; i < e; ++i) {
      sum[i] = Num<T>::store(static_cast<C>(Num<T>::load(dy[i]) + Num<T>::load(dcopy[i])));
    }
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
    bool copy;
    if (!ln_copy_out(attrs, &copy)) return MX_FAIL;
    *num_in = parsed_inputs(attrs, 3);
    *num_out = copy ? 4 : 3;
    return MX_SUCCESS;
  });
}

MXReturnValue ln_infer_type(const Attrs& attrs, std::vector<int>* in, std::vector<int>* out) {
  return guarded("mxmp_layer_norm", [&] {
    // float32 and float64 as MXNet's LayerNorm: one dtype for data, gamma, beta and the
    // outputs, taken from whichever input knows it (all unknown: all stay unknown). bfloat16
    // data: gamma and beta float32 (master parameters; the default where unknown) or
    // bfloat16, each as it comes; mean and rstd float32.
    for (int v : *in) {
      if (v != -1 && !is_data(v)) {
        MX_ERROR_MSG << "mxmp_layer_norm: data, gamma and beta must be float32, float64 or "
                     << "bfloat16, got " << dtype_name(v);
        return MX_FAIL;
      }
    }
    int& data = (*in)[0];
    if (data == -1 && (*out)[0] != -1) data = (*out)[0];
    // gamma and beta: (*in)[1], (*in)[2], unless extra inputs (then MXNet's ops type them
    // and the library sees data alone)
    if (data == kBfloat16) {
      for (size_t i = 1; i < in->size(); ++i) {
        int& v = (*in)[i];
        if (v == -1) v = mxnet::ext::kFloat32;
        if (v != mxnet::ext::kFloat32 && v != kBfloat16) {
          MX_ERROR_MSG << "mxmp_layer_norm: gamma and beta of bfloat16 data must be float32 "
                       << "or bfloat16, got " << dtype_name(v);
          return MX_FAIL;
        }
      }
      (*out)[0] = kBfloat16;
      (*out)[1] = mxnet::ext::kFloat32;
      (*out)[2] = mxnet::ext::kFloat32;
      if (out->size() > 3) (*out)[3] = kBfloat16;   // copy_out: out's copy
      return MX_SUCCESS;
    }
    int t = -1;
    for (int v : *in) {
      if (v == -1) continue;
      if ((t != -1 && v != t) || v == kBfloat16) {
        MX_ERROR_MSG << "mxmp_layer_norm: data, gamma and beta must have one dtype (or "
                     << "bfloat16 data with float32 or bfloat16 gamma and beta), got "
                     << dtype_name(t == -1 ? v : t) << " and " << dtype_name(v);
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
    if (out->size() > 3) (*out)[3] = ds;   // copy_out: out's copy
    return MX_SUCCESS;
  });
}

template <typename T, typename P, typename S>
void ln_forward_typed(std::vector<MXTensor>* in, std::vector<MXTensor>* out, int64_t rows,
                      int64_t d, double eps) {
  ln_forward<T, P, S>((*in)[0].data<T>(), (*in)[1].data<P>(), (*in)[2].data<P>(),
                      (*out)[0].data<T>(), (*out)[1].data<S>(), (*out)[2].data<S>(), rows, d,
                      eps);
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
      ln_forward_typed<float, float, float>(in, out, rows, d, eps);
    } else if (x.dtype == mxnet::ext::kFloat64) {
      ln_forward_typed<double, double, double>(in, out, rows, d, eps);
    } else if ((*in)[1].dtype == kBfloat16) {
      ln_forward_typed<bf16, bf16, float>(in, out, rows, d, eps);
    } else {
      ln_forward_typed<bf16, float, float>(in, out, rows, d, eps);
    }
    bool copy;
    if (!ln_copy_out(attrs, &copy)) return MX_FAIL;
    if (copy) {   // out's copy, for its second reader (output 3)
      MXTensor& y = (*out)[0];
      const int64_t n = rows * d;
      if (x.dtype == mxnet::ext::kFloat64) {
        ln_copy(y.data<double>(), (*out)[3].data<double>(), n);
      } else if (x.dtype == mxnet::ext::kFloat32) {
        ln_copy(y.data<float>(), (*out)[3].data<float>(), n);
      } else {
        ln_copy(y.data<bf16>(), (*out)[3].data<bf16>(), n);
      }
    }
    return MX_SUCCESS;
  });
}

template <typename T, typename P, typename S>
void ln_backward_typed(std::vector<MXTensor>* in, std::vector<MXTensor>* out, int64_t rows,
                       int64_t d) {
  // in: d out, d mean, d rstd, data, gamma, beta, out, mean, rstd
  ln_backward<T, P, S>((*in)[0].data<T>(), (*in)[3].data<T>(), (*in)[4].data<P>(),
                       (*in)[7].data<S>(), (*in)[8].data<S>(), out_ptr<T>(out, 0),
                       out_ptr<P>(out, 1), out_ptr<P>(out, 2), rows, d);
}

MXReturnValue ln_backward_cpu(const Attrs& attrs, std::vector<MXTensor>* in,
                              std::vector<MXTensor>* out, const OpResource& res) {
  return guarded("mxmp_layer_norm backward", [&] {
    bool copy;
    if (!ln_copy_out(attrs, &copy)) return MX_FAIL;
    std::vector<MXTensor> summed;
    if (copy) {
      // in: d out, d mean, d rstd, d copy, data, gamma, beta, out, mean, rstd, copy. The two
      // gradients of out summed into MXNet's temporary space, then the inputs laid out as
      // without the copy (d out = the sum), for the same LayerNorm backward.
      const MXTensor& dy = (*in)[0];
      const int64_t n = dy.size();
      const int bytes = static_cast<int>(n * dtype_bytes(dy.dtype));
      if (n * static_cast<int64_t>(dtype_bytes(dy.dtype)) > 0x7FFFFFFF) {
        MX_ERROR_MSG << "mxmp_layer_norm backward: copy_out=1 sums gradients of at most 2 GiB";
        return MX_FAIL;
      }
      void* buf = n > 0 ? res.alloc_cpu(bytes) : nullptr;
      if (n > 0 && buf == nullptr) {
        MX_ERROR_MSG << "mxmp_layer_norm backward: no temporary space for the gradients' sum";
        return MX_FAIL;
      }
      if (dy.dtype == mxnet::ext::kFloat64) {
        ln_sum_grads((*in)[0].data<double>(), (*in)[3].data<double>(),
                     static_cast<double*>(buf), n);
      } else if (dy.dtype == mxnet::ext::kFloat32) {
        ln_sum_grads((*in)[0].data<float>(), (*in)[3].data<float>(),
                     static_cast<float*>(buf), n);
      } else {
        ln_sum_grads((*in)[0].data<bf16>(), (*in)[3].data<bf16>(), static_cast<bf16*>(buf), n);
      }
      summed = {(*in)[0], (*in)[1], (*in)[2], (*in)[4], (*in)[5], (*in)[6], (*in)[7],
                (*in)[8], (*in)[9]};
      summed[0].data_ptr = buf;
      in = &summed;
    }
    MXTensor& x = (*in)[3];
    const int64_t d = last_dim(x);
    const int64_t rows = d == 0 ? 0 : x.size() / d;
    if (x.dtype == mxnet::ext::kFloat32) {
      ln_backward_typed<float, float, float>(in, out, rows, d);
    } else if (x.dtype == mxnet::ext::kFloat64) {
      ln_backward_typed<double, double, double>(in, out, rows, d);
    } else if ((*in)[4].dtype == kBfloat16) {
      ln_backward_typed<bf16, bf16, float>(in, out, rows, d);
    } else {
      ln_backward_typed<bf16, float, float>(in, out, rows, d);
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

// Elements per block of the dropout loops: a block's hash counter is 32 bits wide (the index's
// bits from bit 32 up, the same across a block, enter the second seed) and a block is one
// thread's unit of work.
const int64_t kDropBlock = 1 << 16;
// Elements per slice of a block in the bfloat16 loop (float32 copies of a slice in L1).
const int64_t kDropSlice = 2048;

// Dropout of n float32 or float64 elements whose hash counters start at base. No branch in
// the loop (AVX2 has no masked select of a load: a conditional x[i] kept this loop scalar
// there); the sign flip makes the unsigned compare a signed one, which AVX2 has.
template <typename C>
void dropout_slice(const C* x, C* y, int64_t n, uint32_t threshold, C scale, uint32_t base,
                   uint32_t s2) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t h = mix32(mix32(base + static_cast<uint32_t>(i)) ^ s2);
    const int32_t keep = static_cast<int32_t>(h ^ 0x80000000u) >=
                         static_cast<int32_t>(threshold ^ 0x80000000u);
    y[i] = x[i] * (keep ? scale : C(0));   // x * 0 for a dropped element: NaN stays NaN
  }
}

// y = x * s over n elements, s the scale where the hash of seeds (s1, s2) keeps an element and
// 0 where it drops it: the forward (x data, y out) and, with the same seeds, the backward (x
// dy, y dx: dy * s, as a stored mask's dy * (mask * scale) bit for bit, mask * scale being
// scale or +0). Blocks of kDropBlock elements, each one thread's unit of work.
template <typename T>
void dropout_apply(const T* x, T* y, int64_t n, uint32_t threshold, typename Num<T>::C scale,
                   uint32_t s1, uint32_t s2) {
  typedef typename Num<T>::C C;
  const int64_t blocks = (n + kDropBlock - 1) / kDropBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelMin && blocks > 1)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t start = blk * kDropBlock;
    const int64_t len = start + kDropBlock < n ? kDropBlock : n - start;
    const uint32_t base = static_cast<uint32_t>(start) + s1;
    const uint32_t s2b = s2 ^ static_cast<uint32_t>(start >> 32);
    const T* xb = x + start;
    T* yb = y + start;
    if constexpr (std::is_same<T, C>::value) {
      dropout_slice(xb, yb, len, threshold, scale, base, s2b);
    } else {
      // bfloat16: each slice widened to float32 (exact), the float32 loop on it, rounded
      // back once. (One loop of hashes, bytes and bfloat16 data vectorised 64 wide through
      // conversions between four element widths and took 2x the float32 loop's time for half
      // its bytes.)
      C xf[kDropSlice], yf[kDropSlice];
      for (int64_t s0 = 0; s0 < len; s0 += kDropSlice) {
        const int64_t sl = s0 + kDropSlice < len ? kDropSlice : len - s0;
        widen_row(xb + s0, xf, sl);
        dropout_slice(xf, yf, sl, threshold, scale, base + static_cast<uint32_t>(s0), s2b);
        narrow_row(yf, yb + s0, sl);
      }
    }
  }
}

// The keep threshold p * 2**32 (saturated to 2**32 - 1), the same in forward and backward.
uint32_t dropout_threshold(double p) {
  return static_cast<uint32_t>(std::ldexp(p, 32) < 4294967295.0 ? std::ldexp(p, 32)
                                                                 : 4294967295.0);
}

// dropout_apply on MXTensors of data's dtype.
void dropout_apply_tensor(MXTensor& x, MXTensor* y, double p, uint32_t s1, uint32_t s2) {
  const int64_t n = x.size();
  const uint32_t threshold = dropout_threshold(p);
  if (x.dtype == mxnet::ext::kFloat32) {
    dropout_apply<float>(x.data<float>(), y->data<float>(), n, threshold,
                         static_cast<float>(1.0 / (1.0 - p)), s1, s2);
  } else if (x.dtype == mxnet::ext::kFloat64) {
    dropout_apply<double>(x.data<double>(), y->data<double>(), n, threshold, 1.0 / (1.0 - p),
                          s1, s2);
  } else {
    dropout_apply<bf16>(x.data<bf16>(), y->data<bf16>(), n, threshold,
                        static_cast<float>(1.0 / (1.0 - p)), s1, s2);
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
    if (t != -1 && !is_data(t)) {
      MX_ERROR_MSG << "mxmp_dropout: data must be float32, float64 or bfloat16, got "
                   << dtype_name(t);
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
    (*out)[1] = mxnet::ext::kInt32;   // the seeds
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
      (*out)[0].clear();
      (*out)[1] = std::vector<unsigned>{2};
      return MX_SUCCESS;
    }
    (*out)[0] = (*in)[0];
    (*out)[1] = std::vector<unsigned>{2};   // the seeds
    return MX_SUCCESS;
  });
}

MXReturnValue dropout_forward_cpu(const Attrs& attrs, std::vector<MXTensor>* in,
                                  std::vector<MXTensor>* out, const OpResource& res) {
  return guarded("mxmp_dropout", [&] {
    MXTensor& x = (*in)[0];
    const int64_t n = x.size();
    int32_t* seeds = (*out)[1].data<int32_t>();
    if (inference((*in)[1], attrs)) {   // nothing drawn: backward reads the flag
      std::memcpy((*out)[0].data_ptr, x.data_ptr, n * dtype_bytes(x.dtype));
      seeds[0] = seeds[1] = 0;
      return MX_SUCCESS;
    }
    double p;
    if (!attr_double(attrs, "p", 0.5, &p, "mxmp_dropout")) return MX_FAIL;
    mxnet::ext::mx_cpu_rand_t* gen = res.get_cpu_rand_states();
    const uint32_t s1 = (*gen)(), s2 = (*gen)();
    std::memcpy(&seeds[0], &s1, sizeof s1);
    std::memcpy(&seeds[1], &s2, sizeof s2);
    dropout_apply_tensor(x, &(*out)[0], p, s1, s2);
    return MX_SUCCESS;
  });
}

MXReturnValue dropout_backward_cpu(const Attrs& attrs, std::vector<MXTensor>* in,
                                   std::vector<MXTensor>* out, const OpResource& res) {
  // in: d out, d seeds, data, flag, out, seeds; out: d data, d flag
  return guarded("mxmp_dropout backward", [&] {
    MXTensor& dy = (*in)[0];
    const int64_t n = dy.size();
    if ((*out)[1].data_ptr != nullptr) (*out)[1].data<float>()[0] = 0.0f;
    if ((*out)[0].data_ptr == nullptr) return MX_SUCCESS;
    double p;
    if (!attr_double(attrs, "p", 0.5, &p, "mxmp_dropout")) return MX_FAIL;
    if (inference((*in)[3], attrs)) {   // the identity; no seeds were drawn
      std::memcpy((*out)[0].data_ptr, dy.data_ptr, n * dtype_bytes(dy.dtype));
      return MX_SUCCESS;
    }
    const int32_t* seeds = (*in)[5].data<int32_t>();
    uint32_t s1, s2;
    std::memcpy(&s1, &seeds[0], sizeof s1);
    std::memcpy(&s2, &seeds[1], sizeof s2);
    dropout_apply_tensor(dy, &(*out)[0], p, s1, s2);   // the forward's keep decisions
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

// The row's probabilities (0 < len <= m) in the compute type C into e[0, len), which x may
// alias, e[len, m) 0: max, exp, the sum in double (softmax_exps), the product by its inverse
// rounded to C once (softmax_scale). The loops run over whole vectors (kVec elements, up to
// m) without scalar remainders (BERT's lengths, 64 to 128 of 128, left up to 15 elements to
// scalar code in each of the four loops; the max's remainder was a chain of dependent
// compares): the max over [0, len) as the max of the vector loop's part and the last kVec
// elements (overlapping: the same max); the exp over [0, up), up = len rounded up to kVec (at
// most m), the elements from len on then set to 0 before the sum (which adding zeros leaves
// unchanged).
// AVX2 builds: 1, the plain loops over [0, len) as before (gcc's remainders there are short;
// whole vectors of 8 or 16 measured 3% and 5% slower in an AVX2 build of the loops alone).
#if defined(__AVX512F__)
const int64_t kVec = 16;   // float32 elements per AVX-512 vector
#else
const int64_t kVec = 1;
#endif

// The first half: max, e[0, len) the exponentials, e[len, m) 0, *up the end of the loops'
// whole vectors; returns the exponentials' sum (in double).
template <typename C>
double softmax_exps(const C* x, C* e, int64_t m, int64_t len, int64_t* up_end) {
  const int64_t whole = len - len % kVec;
  C mx = x[0];
  if (whole > 0) {
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < whole; ++j) mx = x[j] > mx ? x[j] : mx;
    const C* tail = x + (len - kVec);
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < kVec; ++j) mx = tail[j] > mx ? tail[j] : mx;
  } else {
    for (int64_t j = 1; j < len; ++j) mx = x[j] > mx ? x[j] : mx;
  }
  int64_t up = whole == len ? len : whole + kVec;
  if (up > m) up = m;
  // two loops: one loop of float exp and a double sum does not vectorise (gcc 12)
#pragma omp simd
  for (int64_t j = 0; j < up; ++j) {
    const C v = x[j] - mx;   // > 0 only from len on (garbage, then zeroed): kept in range
    e[j] = exp_nonpositive(kVec > 1 && v > 0 ? C(0) : v);
  }
  for (int64_t j = len; j < m; ++j) e[j] = 0;
  double sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < up; ++j) sum += static_cast<double>(e[j]);
  *up_end = up;
  return sum;
}

// The second half: e[0, up) times 1 / sum, rounded to C once; e[len, up) 0 again (a row with
// NaN or inf within its length has a NaN sum, and 0 * NaN is NaN: such rows had NaN beyond
// their length on AVX-512, 0 on AVX2, whose loops end at len).
template <typename C>
void softmax_scale(C* e, int64_t len, int64_t up, double sum) {
  const double inv = 1.0 / sum;
#pragma omp simd
  for (int64_t j = 0; j < up; ++j) e[j] = static_cast<C>(static_cast<double>(e[j]) * inv);
  if (!(sum <= std::numeric_limits<double>::max())) {   // NaN or inf (a branch taken rarely)
    for (int64_t j = len; j < up; ++j) e[j] = 0;
  }
}

// Rows per block of the float32 and float64 softmax forward: each block runs the first half
// (softmax_exps) of all its rows, then the second (softmax_scale), and a thread's unit of work
// is a block (bfloat16 rows: one at a time, softmax_all). A row's halves are a chain of
// dependent reductions (max, sum, 1 / sum) over a few vectors at BERT's 128; with a block's
// rows independent in each half, the core can overlap one row's chain with the next row's
// loops (the loops alone, 96x128x128, one thread, AVX-512 build: float32 forward 1.20 ->
// 1.12 ms; the AVX2 build unchanged). Each row's arithmetic is unchanged: the same results,
// bit for bit.
const int64_t kSoftmaxRows = 8;

// y: the row's probabilities, of type T (the output) or, for bfloat16, float32 (recomputed from
// data: with y rounded to bfloat16, dy - sum(dy * y) cancels to bfloat16's error where one
// probability is near 1, 30x MXNet's float32 softmax's gradient in the contract's large-logit
// case).
template <typename T, typename Y>
void softmax_grad_row(const T* dy, const Y* y, T* dx, int64_t m, int64_t len) {
  typedef typename Num<T>::C C;
  if (len < 0) len = 0;
  double dot = 0;
#pragma omp simd reduction(+ : dot)
  for (int64_t j = 0; j < len; ++j) dot += wide(dy[j]) * wide(y[j]);
  const C dt = static_cast<C>(dot);
#pragma omp simd
  for (int64_t j = 0; j < len; ++j) {
    dx[j] = Num<T>::store(Num<Y>::load(y[j]) * (Num<T>::load(dy[j]) - dt));
  }
  for (int64_t j = len; j < m; ++j) dx[j] = Num<T>::store(0.0);
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
    if (t != -1 && !is_data(t)) {
      MX_ERROR_MSG << "mxmp_softmax: data must be float32, float64 or bfloat16, got "
                   << dtype_name(t);
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

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__)
// The AVX-512 row kernels of the softmax: the float32 forward, the bfloat16 forward and
// backward (AVX-512 builds; float64, the float32 backward and AVX2 builds keep the loops
// above). A row is read in 16-lane float32 vectors, the last one masked to the row's length
// (any m; nothing read beyond a length), in steps: the max (a bfloat16 row widened into the
// thread's L1 scratch row on the way), the exponentials into the scratch row (float32 data:
// into the output row) with their sum's 16 lanes, the sum, then the product by 1 / sum
// rounded once and stored (bfloat16: vcvtneps2bf16), zeros beyond the length; the backward
// scales in place, then the dot and dx. The arithmetic is the loops' above, operation for
// operation, so the bits are theirs (compared over rows of 1 to 32000, lengths 0 to m, NaN,
// inf, -inf and subnormal rows, at 1 and 2 threads; NaN rows' payloads not pinned):
// exp_nonpositive as gcc compiles it (multiply-adds fused), the double sums in their order
// (the vector loop of an `omp simd reduction`: element j in lane j % 16, the loop's scalar
// remainder added to lane 0, then the lanes in order), the product by 1 / sum in double. The
// loops (a widened bfloat16 row, six or seven loops of 64-128 elements per row, a scalar zero
// fill) took 1.57 + 2.11 ms for bfloat16 (loops alone, 96x128x128, lengths 64-128, 1 thread,
// Zen 4), these 0.99 + 1.45 (float32 forward 1.13 -> 0.89): the exp's polynomial and the
// double sum and product are now most of it. Each step runs over a block's rows
// (softmax_row_block) before the next, so that the rows' reduction chains overlap.
inline void sm_store16(float* p, __m512 v, __mmask16 k) { _mm512_mask_storeu_ps(p, k, v); }
// Num<bf16>::store on 16 lanes: to nearest even, a NaN quiet with its payload's top kept.
// vcvtneps2bf16 does exactly that except that it flushes subnormal inputs to zero (rare here:
// probabilities below 2^-126); a vector with one goes through the integer rounding.
inline __m256i sm_round_bf16x16(__m512 v) {
#if defined(__AVX512BF16__)
  if (_mm512_fpclass_ps_mask(v, 0x20) == 0) return (__m256i)_mm512_cvtneps_pbh(v);
#endif
  const __m512i b = _mm512_castps_si512(v);
  const __m512i hi = _mm512_srli_epi32(b, 16);
  const __m512i odd = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(
      _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7FFF)), odd), 16);
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(
      _mm512_and_si512(b, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
  const __m512i quiet = _mm512_or_si512(hi, _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, quiet));
}
inline void sm_store16(bf16* p, __m512 v, __mmask16 k) {
  _mm256_mask_storeu_epi16(p, k, sm_round_bf16x16(v));
}

// exp_nonpositive on 16 lanes, as gcc compiles the scalar code (vectorised, -O3, contracted):
// t - 1/2 one multiply-add, the reduction two, the polynomial Horner's rule in multiply-adds;
// p 2^n by vscalefps (one rounding, as p times 2^n from its bits: n is in [-126, 0]).
inline __m512 sm_exp16(__m512 x) {
  const __m512 xc = _mm512_max_ps(_mm512_set1_ps(-87.0f), x);   // -87 > x ? -87 : x (NaN: x)
  const __m512 t = _mm512_fmadd_ps(xc, _mm512_set1_ps(1.44269504088896341f),
                                   _mm512_set1_ps(-0.5f));
  const __m512 fn = _mm512_roundscale_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(fn, _mm512_set1_ps(0.693145751953125f), xc);
  r = _mm512_fnmadd_ps(fn, _mm512_set1_ps(1.42860682030941723e-06f), r);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(1.0f / 5040.0f), r,
                             _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  const __mmask16 in_range = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_NLT_UQ);
  return _mm512_maskz_scalef_ps(in_range, p, fn);   // below -87: 0
}

// The loops' sums in double (softmax_exps's and softmax_grad_row's `omp simd reduction` as gcc
// vectorises it): element j of the vector loop in lane j % 16 (lane: 16 doubles), the loop's
// scalar remainder added to lane 0 in order, then the lanes in order to 0.
inline double sm_lane_total(const double* lane) {
  double sum = 0;
  for (int j = 0; j < 16; ++j) sum += lane[j];
  return sum;
}

// A row's max over [0, len) (len > 0), x > max ? x : max as softmax_exps; a bfloat16 row is
// widened into w[0, len) on the way (float32: w unused).
template <typename T>
float softmax_max16(const T* x, float* w, int64_t len) {
  const int64_t nv = (len + 15) / 16;
  const __mmask16 kl = vec_lanes(len - 16 * (nv - 1));
  __m512 vmax = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t v = 0; v < nv; ++v) {
    const __mmask16 k = v + 1 < nv ? 0xFFFF : kl;
    const __m512 xv = vec_load16(x + 16 * v, k);
    if (!std::is_same<T, float>::value) _mm512_mask_storeu_ps(w + 16 * v, k, xv);
    vmax = _mm512_mask_max_ps(vmax, k, xv, vmax);
  }
  return _mm512_reduce_max_ps(vmax);
}

// e^(x - mx) over a row's [0, len) (x: float32 data, or the widened bfloat16 row, which may be
// w) into w[0, len), and the lanes of their sum: softmax_exps's vector loop ran to up (len
// rounded up to 16, at most m; the zeros from len on in it), and where up is m and m not a
// whole number of vectors, m's last partial vector was its scalar remainder (softmax_sum16).
inline int64_t softmax_rest(int64_t m, int64_t len) {   // where that remainder starts (or len)
  return m % 16 != 0 && len > m - m % 16 ? m - m % 16 : len;
}
inline void softmax_exps16(const float* x, float* w, int64_t m, int64_t len, float mx,
                           double* lane) {
  const int64_t nv = (len + 15) / 16;
  const __mmask16 kl = vec_lanes(len - 16 * (nv - 1));
  const int64_t summed = softmax_rest(m, len) < len ? nv - 1 : nv;
  const __m512 vmx = _mm512_set1_ps(mx);
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
  for (int64_t v = 0; v < nv; ++v) {
    const __mmask16 k = v + 1 < nv ? 0xFFFF : kl;
    const __m512 xv = _mm512_maskz_loadu_ps(k, x + 16 * v);
    const __m512 e = _mm512_maskz_mov_ps(k, sm_exp16(_mm512_sub_ps(xv, vmx)));
    _mm512_mask_storeu_ps(w + 16 * v, k, e);
    if (v < summed) {
      lo = _mm512_add_pd(lo, vec_lo8(e));
      hi = _mm512_add_pd(hi, vec_hi8(e));
    }
  }
  _mm512_storeu_pd(lane, lo);
  _mm512_storeu_pd(lane + 8, hi);
}
inline double softmax_sum16(double* lane, const float* w, int64_t m, int64_t len) {
  for (int64_t j = softmax_rest(m, len); j < len; ++j) lane[0] += static_cast<double>(w[j]);
  return sm_lane_total(lane);
}

// 16 float32 values times inv in double, rounded to float32 once (softmax_scale).
inline __m512 sm_times16(__m512 e, __m512d inv) {
  const __m256 lo = _mm512_cvtpd_ps(_mm512_mul_pd(vec_lo8(e), inv));
  const __m256 hi = _mm512_cvtpd_ps(_mm512_mul_pd(vec_hi8(e), inv));
  return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
}

// y[0, m) = the row's exponentials w[0, len) times 1 / sum, 0 from len on (len 0: zeros). w
// may be y (float32: the same elements, each read before written).
template <typename T>
void softmax_scale16(const float* w, T* y, int64_t m, int64_t len, double sum) {
  const __m512d inv = _mm512_set1_pd(1.0 / sum);
  const int64_t nv = (len + 15) / 16, nm = (m + 15) / 16;
  const __mmask16 kl = vec_lanes(len - 16 * (nv - 1)), km = vec_lanes(m - 16 * (nm - 1));
  for (int64_t v = 0; v < nm; ++v) {
    __m512 out = _mm512_setzero_ps();
    if (v < nv) {
      const __mmask16 k = v + 1 < nv ? 0xFFFF : kl;
      out = _mm512_maskz_mov_ps(k, sm_times16(_mm512_maskz_loadu_ps(k, w + 16 * v), inv));
    }
    sm_store16(y + 16 * v, out, v + 1 < nm ? 0xFFFF : km);
  }
}

// softmax_grad_row on the row's probabilities (float32): p[0, len) = the exponentials w times
// 1 / sum in place (softmax_scale16's), with the lanes of dot(dy, p) in double (its vector
// loop: the len / 16 whole vectors; the products are exact in double, so the loop's
// multiply-adds are additions of them); then the dot (len % 16 added to lane 0), then dx =
// p * (dy - dot) in float32, rounded once; 0 from len on.
template <typename T>
void softmax_dot16(float* w, double sum, const T* dy, int64_t len, double* lane) {
  const __m512d inv = _mm512_set1_pd(1.0 / sum);
  const int64_t nv = (len + 15) / 16;
  const __mmask16 kl = vec_lanes(len - 16 * (nv - 1));
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
  for (int64_t v = 0; v < nv; ++v) {
    const __mmask16 k = v + 1 < nv ? 0xFFFF : kl;
    const __m512 pv = sm_times16(_mm512_maskz_loadu_ps(k, w + 16 * v), inv);
    _mm512_mask_storeu_ps(w + 16 * v, k, pv);
    if (v < len / 16) {
      const __m512 g = vec_load16(dy + 16 * v, 0xFFFF);
      lo = _mm512_fmadd_pd(vec_lo8(g), vec_lo8(pv), lo);
      hi = _mm512_fmadd_pd(vec_hi8(g), vec_hi8(pv), hi);
    }
  }
  _mm512_storeu_pd(lane, lo);
  _mm512_storeu_pd(lane + 8, hi);
}
template <typename T>
float softmax_dot_total(double* lane, const float* p, const T* dy, int64_t len) {
  for (int64_t j = len - len % 16; j < len; ++j) lane[0] += wide(dy[j]) * wide(p[j]);
  return static_cast<float>(sm_lane_total(lane));
}
template <typename T>
void softmax_dx16(const float* p, const T* dy, T* dx, int64_t m, int64_t len, float dot) {
  const int64_t nv = (len + 15) / 16, nm = (m + 15) / 16;
  const __mmask16 kl = vec_lanes(len - 16 * (nv - 1)), km = vec_lanes(m - 16 * (nm - 1));
  const __m512 dt = _mm512_set1_ps(dot);
  for (int64_t v = 0; v < nm; ++v) {
    __m512 out = _mm512_setzero_ps();
    if (v < nv) {
      const __mmask16 k = v + 1 < nv ? 0xFFFF : kl;
      const __m512 pv = _mm512_maskz_loadu_ps(k, p + 16 * v);
      out = _mm512_maskz_mov_ps(k, _mm512_mul_ps(pv, _mm512_sub_ps(vec_load16(dy + 16 * v, k),
                                                                   dt)));
    }
    sm_store16(dx + 16 * v, out, v + 1 < nm ? 0xFFFF : km);
  }
}

// Rows per block of the AVX-512 kernels: kSoftmaxRows, fewer for long rows (a block's
// float32 rows within 32 KiB, L1). Depends on m alone.
inline int64_t softmax_block_rows(int64_t m) {
  const int64_t fit = 8192 / ((m + 15) / 16 * 16);
  return fit < 1 ? 1 : fit < kSoftmaxRows ? fit : kSoftmaxRows;
}

// Rows [r0, r0 + nr) of the forward (grad false: x -> out) or, for bfloat16, of the backward
// (grad: dy -> out, from the probabilities recomputed from x). Each step runs over the block's
// rows before the next, so that the rows' chains of dependent operations (max, the sums' 16
// lanes in order, 1 / sum) overlap.
template <typename T>
void softmax_row_block(const T* x, const T* dy, T* out, MXTensor* length, int64_t m,
                       int64_t r0, int64_t nr, bool grad) {
  const bool f32 = std::is_same<T, float>::value;
  const int64_t stride = (m + 15) / 16 * 16;
  int64_t len[kSoftmaxRows];
  double sum[kSoftmaxRows], lane[kSoftmaxRows][16];
  float mx[kSoftmaxRows], dot[kSoftmaxRows];
  float* w[kSoftmaxRows];
  thread_local std::vector<float> scratch;   // each thread's rows (bfloat16)
  if (!f32 && scratch.size() < static_cast<size_t>(nr * stride)) scratch.resize(nr * stride);
  for (int64_t i = 0; i < nr; ++i) {
    const int64_t r = r0 + i;
    len[i] = length != nullptr ? length_at(*length, r, m) : m;
    if constexpr (std::is_same<T, float>::value) {
      w[i] = out + r * m;   // the forward's exponentials in its output
    } else {
      w[i] = scratch.data() + i * stride;
    }
  }
  for (int64_t i = 0; i < nr; ++i) {
    if (len[i] > 0) mx[i] = softmax_max16(x + (r0 + i) * m, w[i], len[i]);
  }
  for (int64_t i = 0; i < nr; ++i) {
    const float* xr;
    if constexpr (std::is_same<T, float>::value) {
      xr = x + (r0 + i) * m;
    } else {
      xr = w[i];
    }
    if (len[i] > 0) softmax_exps16(xr, w[i], m, len[i], mx[i], lane[i]);
  }
  for (int64_t i = 0; i < nr; ++i) {
    sum[i] = len[i] > 0 ? softmax_sum16(lane[i], w[i], m, len[i]) : 1.0;
  }
  if (!grad) {
    for (int64_t i = 0; i < nr; ++i) softmax_scale16(w[i], out + (r0 + i) * m, m, len[i], sum[i]);
    return;
  }
  for (int64_t i = 0; i < nr; ++i) {   // the probabilities in float32 (in place), the dots
    softmax_dot16(w[i], sum[i], dy + (r0 + i) * m, len[i], lane[i]);
  }
  for (int64_t i = 0; i < nr; ++i) {
    dot[i] = softmax_dot_total(lane[i], w[i], dy + (r0 + i) * m, len[i]);
  }
  for (int64_t i = 0; i < nr; ++i) {
    softmax_dx16(w[i], dy + (r0 + i) * m, out + (r0 + i) * m, m, len[i], dot[i]);
  }
}

template <typename T>
void softmax_rows16(const T* x, const T* dy, T* out, MXTensor* length, int64_t rows,
                    int64_t m, bool grad) {
  if (rows == 0 || m == 0) return;   // nothing to write
  const int64_t per = softmax_block_rows(m);
  const int64_t blocks = (rows + per - 1) / per;
#pragma omp parallel for schedule(static) if (rows * m >= kParallelMin && blocks > 1)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t r0 = blk * per;
    softmax_row_block(x, dy, out, length, m, r0, rows - r0 < per ? rows - r0 : per, grad);
  }
}
#define MXMP_SOFTMAX_ROWS16 1
#endif

// The probabilities of one row (0 < len <= m) of float32 or float64 data x into e (which may be
// x): softmax_exps, then softmax_scale.
template <typename C>
void softmax_probs(const C* x, C* e, int64_t m, int64_t len) {
  int64_t up;
  const double sum = softmax_exps<C>(x, e, m, len, &up);
  softmax_scale<C>(e, len, up, sum);
}

template <typename T>
void softmax_all(MXTensor& x, MXTensor* length, T* y) {
  const int64_t m = last_dim(x);
  const int64_t rows = m == 0 ? 0 : x.size() / m;
  const T* xd = x.data<T>();
  typedef typename Num<T>::C C;
#if defined(MXMP_SOFTMAX_ROWS16)
  if constexpr (!std::is_same<T, double>::value) {   // float32, bfloat16: the AVX-512 rows
    softmax_rows16<T>(xd, nullptr, y, length, rows, m, false);
    return;
  }
#endif
  if constexpr (std::is_same<T, C>::value) {
    const int64_t blocks = (rows + kSoftmaxRows - 1) / kSoftmaxRows;
#pragma omp parallel for schedule(static) if (rows * m >= kParallelMin && blocks > 1)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t r0 = blk * kSoftmaxRows;
      const int64_t nr = rows - r0 < kSoftmaxRows ? rows - r0 : kSoftmaxRows;
      int64_t len[kSoftmaxRows], up[kSoftmaxRows];
      double sum[kSoftmaxRows];
      for (int64_t i = 0; i < nr; ++i) {
        const int64_t r = r0 + i;
        len[i] = length != nullptr ? length_at(*length, r, m) : m;
        if (len[i] > 0) {
          sum[i] = softmax_exps<C>(xd + r * m, y + r * m, m, len[i], &up[i]);
        } else {
          for (int64_t j = 0; j < m; ++j) y[r * m + j] = 0;
        }
      }
      for (int64_t i = 0; i < nr; ++i) {
        if (len[i] > 0) softmax_scale<C>(y + (r0 + i) * m, len[i], up[i], sum[i]);
      }
    }
  } else {
    // bfloat16: the row widened to float32 (exact) in the thread's scratch row, then the
    // float32 kernel on it (the same values), rounded once into y. (Loops over bfloat16
    // loads vectorised 32 wide with scalar remainders of up to 31 elements: the max's was a
    // chain of dependent compares, slower than the vectors. Tried since, in the loops alone:
    // the float32 loops on bfloat16 loads, no widened row, 1.14x this forward's time and 1.23x
    // the backward's; the float32 path's blocks of rows, 1.05x and 1.08x.)
#pragma omp parallel for schedule(static) if (rows * m >= kParallelMin && rows > 1)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t len = length != nullptr ? length_at(*length, r, m) : m;
      thread_local std::vector<C> scratch;   // each thread's own row
      if (scratch.size() < static_cast<size_t>(m)) scratch.resize(m);
      C* e = scratch.data();
      widen_row(xd + r * m, e, len);
      if (len > 0) {
        softmax_probs<C>(e, e, m, len);
      } else {
        for (int64_t j = 0; j < m; ++j) e[j] = 0;
      }
      narrow_row(e, y + r * m, m);
    }
  }
}

MXReturnValue softmax_forward_cpu(const Attrs& attrs, std::vector<MXTensor>* in,
                                  std::vector<MXTensor>* out, const OpResource& res) {
  return guarded("mxmp_softmax", [&] {
    MXTensor* length = in->size() > 1 ? &(*in)[1] : nullptr;
    if ((*in)[0].dtype == mxnet::ext::kFloat32) {
      softmax_all<float>((*in)[0], length, (*out)[0].data<float>());
    } else if ((*in)[0].dtype == mxnet::ext::kFloat64) {
      softmax_all<double>((*in)[0], length, (*out)[0].data<double>());
    } else {
      softmax_all<bf16>((*in)[0], length, (*out)[0].data<bf16>());
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
  typedef typename Num<T>::C C;
  const T* dyd = dy.data<T>();
  const T* yd = y.data<T>();
  const T* xd = (*in)[1].data<T>();
#if defined(MXMP_SOFTMAX_ROWS16)
  if constexpr (std::is_same<T, bf16>::value) {   // the AVX-512 rows (float32: the loop below,
    // as fast: it streams y, dy and dx at the memory's pace)
    softmax_rows16<T>(xd, dyd, dx, length, rows, m, true);
    return;
  }
#endif
#pragma omp parallel for schedule(static) if (rows * m >= kParallelMin && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t len = length != nullptr ? length_at(*length, r, m) : m;
    if constexpr (std::is_same<T, C>::value) {
      (void)xd;
      softmax_grad_row<T, T>(dyd + r * m, yd + r * m, dx + r * m, m, len);
    } else {
      (void)yd;
      // bfloat16: data and dy widened to float32 rows (exact), the probabilities recomputed
      // (softmax_all's float32 kernel), the float32 gradient kernel on them, dx rounded once
      thread_local std::vector<C> scratch;   // each thread's own rows
      if (scratch.size() < static_cast<size_t>(3 * m)) scratch.resize(3 * m);
      C* e = scratch.data();
      C* g = e + m;
      C* gx = g + m;
      if (len > 0) {
        widen_row(xd + r * m, e, len);
        softmax_probs<C>(e, e, m, len);
      }
      widen_row(dyd + r * m, g, len);
      softmax_grad_row<C, C>(g, e, gx, m, len);
      narrow_row(gx, dx + r * m, m);
    }
  }
}

MXReturnValue softmax_backward_cpu(const Attrs& attrs, std::vector<MXTensor>* in,
                                   std::vector<MXTensor>* out, const OpResource& res) {
  return guarded("mxmp_softmax backward", [&] {
    const bool with_length = use_length(attrs);
    for (size_t i = 1; i < out->size(); ++i) {   // length and the rule's shape tie: zero
      MXTensor& g = (*out)[i];
      if (g.data_ptr != nullptr) std::memset(g.data_ptr, 0, g.size() * dtype_bytes(g.dtype));
    }
    if ((*out)[0].data_ptr == nullptr) return MX_SUCCESS;
    if ((*in)[0].dtype == mxnet::ext::kFloat32) {
      softmax_grad_all<float>(in, (*out)[0].data<float>(), with_length);
    } else if ((*in)[0].dtype == mxnet::ext::kFloat64) {
      softmax_grad_all<double>(in, (*out)[0].data<double>(), with_length);
    } else {
      softmax_grad_all<bf16>(in, (*out)[0].data<bf16>(), with_length);
    }
    return MX_SUCCESS;
  });
}

// ---------------------------------------------------------------------------------------------
// Attention matmuls: bfloat16 products, float32 accumulation
//
// Every product of these ops is a batch of G = batch * heads small GEMMs C = alpha * A B whose
// operands are strided views of the interleaved tensors. A GEMM packs its operands into pairs
// of bfloat16 values along k (rounded to nearest even from float32; NaN stays NaN), MR rows of
// A and NR columns of B per panel, zero-padded; the micro-kernel multiplies the pairs and
// accumulates in float32: AVX512-BF16's vdpbf16ps where the CPU has it and DNNL_MAX_CPU_ISA
// does not cap it (as oneDNN reads it), else portable code with the same products (a product of
// two bfloat16 values is exact in float32) summed in float32. alpha scales the float32 sum once,
// at the store (MXNet passes its scale as the GEMM's alpha too). The batch is split over an
// OpenMP parallel loop; each GEMM is computed by one thread, so results do not depend on the
// number of threads.
typedef uint16_t bf16_bits;
const int kMR = 8;    // rows of A per panel
const int kNR = 32;   // columns of B per panel (two 16-lane vectors)

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// float32 -> bfloat16, round to nearest even; a NaN stays a (quiet) NaN
inline uint32_t round_bf16(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u;
  return (u & 0x7FFFFFFFu) > 0x7F800000u ? nan : r;
}

inline uint32_t bf16_of(float v) { return round_bf16(v); }
inline uint32_t bf16_of(bf16_bits v) { return v; }

inline float float_of_bf16(uint32_t b) {
  const uint32_t u = b << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// A strided view: element (r, c) at p[r * rs + c * cs], of dtype T (float, or bfloat16 bits).
template <typename T>
struct View {
  const T* p;
  int64_t rs, cs;
};

#if defined(__x86_64__) && ((defined(__clang__) && __clang_major__ >= 9) || \
                            (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 10))
#define MXMP_BF16_KERNEL 1
#define MXMP_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#endif

bool use_bf16_kernel();

#ifdef MXMP_BF16_KERNEL
// to_pairs of k contiguous float32 values with vcvtne2ps2bf16 (round to nearest even, NaN
// quieted, as round_bf16): consecutive values become consecutive bfloat16, i.e. the pairs.
MXMP_BF16_TARGET void to_pairs_avx512(const float* src, int64_t k, uint32_t* pairs) {
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    const __m512 lo = _mm512_loadu_ps(src + i), hi = _mm512_loadu_ps(src + i + 16);
    _mm512_storeu_si512(pairs + i / 2, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
  }
  if (i < k) {
    const int64_t rest = k - i;   // 1..31; values past k load as 0 (the odd pair's high half)
    const __mmask16 m0 = rest >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << rest) - 1);
    const __mmask16 m1 = rest <= 16 ? 0 : static_cast<__mmask16>((1u << (rest - 16)) - 1);
    const __m512 lo = _mm512_maskz_loadu_ps(m0, src + i);
    const __m512 hi = _mm512_maskz_loadu_ps(m1, src + i + 16);
    const int64_t np = (rest + 1) / 2;
    _mm512_mask_storeu_epi32(pairs + i / 2, static_cast<__mmask16>((1u << np) - 1),
                             (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
  }
}

// interleave_rows of float32 rows with vcvtne2ps2bf16 and one permutation.
MXMP_BF16_TARGET void interleave_avx512(const float* r0, const float* r1, int64_t n,
                                        uint32_t* out) {
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                       24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17,
                                       1, 16, 0);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = n - j >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - j)) - 1);
    const __m512 a = _mm512_maskz_loadu_ps(m, r0 + j);
    const __m512 b = r1 == nullptr ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m, r1 + j);
    const __m512i v = _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(b, a));
    _mm512_mask_storeu_epi32(out + j, m, v);
  }
}

// interleave_rows of bfloat16 rows: each value widened to 32 bits, r1's shifted to the high
// half.
MXMP_BF16_TARGET void interleave_bf16_avx512(const bf16_bits* r0, const bf16_bits* r1,
                                             int64_t n, uint32_t* out) {
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = n - j >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - j)) - 1);
    const __m512i a = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, r0 + j));
    const __m512i b = r1 == nullptr ? _mm512_setzero_si512() :
                      _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, r1 + j));
    _mm512_mask_storeu_epi32(out + j, m, _mm512_or_si512(a, _mm512_slli_epi32(b, 16)));
  }
}

// pack_b of a bfloat16 B whose columns are contiguous along k, k even (each pair is two
// neighbours of a column): blocks of 16 columns x 16 pairs loaded (column c's pairs q0 ..
// q0 + 15 from p + c * cs + 2 q0; w columns, np pairs, the rest 0), transposed in registers
// (32-bit elements) and stored as 16 rows of pairs: o[q * n_pad + c].
MXMP_BF16_TARGET void transpose_pairs_avx512(const bf16_bits* p, int64_t cs, int64_t w,
                                             int64_t pairs, uint32_t* o, int64_t n_pad) {
  for (int64_t q0 = 0; q0 < pairs; q0 += 16) {
    const int64_t np = pairs - q0 < 16 ? pairs - q0 : 16;
    const __mmask16 m = np == 16 ? 0xFFFF : static_cast<__mmask16>((1u << np) - 1);
    __m512i r[16], t[16];
    for (int c = 0; c < 16; ++c) {
      r[c] = c < w ? _mm512_maskz_loadu_epi32(m, p + c * cs + 2 * q0) : _mm512_setzero_si512();
    }
    for (int c = 0; c < 16; c += 2) {   // 2 x 2 blocks of elements
      t[c] = _mm512_unpacklo_epi32(r[c], r[c + 1]);
      t[c + 1] = _mm512_unpackhi_epi32(r[c], r[c + 1]);
    }
    for (int c = 0; c < 16; c += 4) {   // 4 x 4 blocks within each 128-bit lane
      r[c] = _mm512_unpacklo_epi64(t[c], t[c + 2]);
      r[c + 1] = _mm512_unpackhi_epi64(t[c], t[c + 2]);
      r[c + 2] = _mm512_unpacklo_epi64(t[c + 1], t[c + 3]);
      r[c + 3] = _mm512_unpackhi_epi64(t[c + 1], t[c + 3]);
    }
    for (int c = 0; c < 16; c += 8) {   // the 128-bit lanes across 4-row groups
      for (int j = 0; j < 4; ++j) {
        t[c + j] = _mm512_shuffle_i32x4(r[c + j], r[c + 4 + j], 0x88);
        t[c + 4 + j] = _mm512_shuffle_i32x4(r[c + j], r[c + 4 + j], 0xDD);
      }
    }
    for (int j = 0; j < 8; ++j) {
      r[j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0x88);
      r[8 + j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0xDD);
    }
    for (int64_t q = 0; q < np; ++q) _mm512_storeu_si512(o + (q0 + q) * n_pad, r[q]);
  }
}
#endif

// pairs[q] = (bf16(src[2q * step]), bf16(src[(2q + 1) * step])) for q < k / 2, and the last
// value alone (high half 0) for odd k: k values along one axis of a view, as pairs.
template <typename T>
void to_pairs(const T* src, int64_t step, int64_t k, uint32_t* pairs) {
  const int64_t half = k / 2;
#ifdef MXMP_BF16_KERNEL
  if (std::is_same<T, float>::value && step == 1 && use_bf16_kernel()) {
    to_pairs_avx512(reinterpret_cast<const float*>(src), k, pairs);
    return;
  }
#endif
  if (step == 1) {
#pragma omp simd
    for (int64_t q = 0; q < half; ++q) {
      pairs[q] = bf16_of(src[2 * q]) | (bf16_of(src[2 * q + 1]) << 16);
    }
  } else {
    for (int64_t q = 0; q < half; ++q) {
      pairs[q] = bf16_of(src[2 * q * step]) | (bf16_of(src[(2 * q + 1) * step]) << 16);
    }
  }
  if (k & 1) pairs[half] = bf16_of(src[(k - 1) * step]);
}

// out[j] = (bf16(r0[j]), bf16(r1[j])) for j < n (r1 null: high halves 0): two rows of a view
// along its contiguous axis, as pairs.
template <typename T>
void interleave_rows(const T* r0, const T* r1, int64_t n, uint32_t* out) {
#ifdef MXMP_BF16_KERNEL
  if (std::is_same<T, float>::value && use_bf16_kernel()) {
    interleave_avx512(reinterpret_cast<const float*>(r0), reinterpret_cast<const float*>(r1),
                      n, out);
    return;
  }
  if (std::is_same<T, bf16_bits>::value && use_bf16_kernel()) {
    interleave_bf16_avx512(reinterpret_cast<const bf16_bits*>(r0),
                           reinterpret_cast<const bf16_bits*>(r1), n, out);
    return;
  }
#endif
  if (r1 == nullptr) {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) out[j] = bf16_of(r0[j]);
    return;
  }
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) out[j] = bf16_of(r0[j]) | (bf16_of(r1[j]) << 16);
}

// A packed: the pair (A[m, 2q], A[m, 2q + 1]) at ap[m * a_m + q * a_q], m < m_pad (rows past
// m are zero). Returns a_m and a_q. Layout follows the view: rows of pairs where A's rows are
// contiguous along k, columns of pairs where its columns are contiguous along m.
template <typename T>
void pack_a(const View<T>& a, int64_t m, int64_t k, uint32_t* ap, int64_t* a_m, int64_t* a_q) {
  const int64_t pairs = (k + 1) / 2;
  const int64_t m_pad = (m + kMR - 1) / kMR * kMR;
  if (a.cs == 1 || a.rs != 1) {   // rows of pairs
    *a_m = pairs;
    *a_q = 1;
    for (int64_t r = 0; r < m; ++r) to_pairs(a.p + r * a.rs, a.cs, k, ap + r * pairs);
    std::memset(ap + m * pairs, 0, (m_pad - m) * pairs * sizeof(uint32_t));
    return;
  }
  *a_m = 1;   // columns of pairs: A's columns are contiguous along m
  *a_q = m_pad;
  for (int64_t q = 0; q < pairs; ++q) {
    uint32_t* o = ap + q * m_pad;
    interleave_rows(a.p + 2 * q * a.cs, 2 * q + 1 < k ? a.p + (2 * q + 1) * a.cs : nullptr,
                    m, o);
    for (int64_t r = m; r < m_pad; ++r) o[r] = 0;
  }
}

// B packed: the pair (B[2q, n], B[2q + 1, n]) at bp[q * n_pad + n], n < n_pad (columns past n
// are zero).
template <typename T>
void pack_b(const View<T>& b, int64_t n, int64_t k, uint32_t* bp, int64_t n_pad) {
  const int64_t pairs = (k + 1) / 2;
  if (b.cs == 1) {   // B's rows are contiguous along n
    for (int64_t q = 0; q < pairs; ++q) {
      uint32_t* o = bp + q * n_pad;
      interleave_rows(b.p + 2 * q * b.rs, 2 * q + 1 < k ? b.p + (2 * q + 1) * b.rs : nullptr,
                      n, o);
      for (int64_t c = n; c < n_pad; ++c) o[c] = 0;
    }
    return;
  }
  // B's columns are contiguous along k (a transposed operand)
#ifdef MXMP_BF16_KERNEL
  if (std::is_same<T, bf16_bits>::value && b.rs == 1 && k % 2 == 0 && use_bf16_kernel()) {
    for (int64_t c0 = 0; c0 < n_pad; c0 += 16) {   // the pairs in place, transposed
      const int64_t w = n - c0 < 16 ? (n - c0 > 0 ? n - c0 : 0) : 16;
      transpose_pairs_avx512(reinterpret_cast<const bf16_bits*>(b.p) + (w > 0 ? c0 * b.cs : 0),
                             b.cs, w, pairs, bp + c0, n_pad);
    }
    return;
  }
#endif
  // each column to pairs, then transposed 16 columns at a time
  thread_local std::vector<uint32_t> col;
  if (col.size() < static_cast<size_t>(16 * pairs)) col.resize(16 * pairs);
  for (int64_t c0 = 0; c0 < n_pad; c0 += 16) {
    const int64_t w = n - c0 < 16 ? (n - c0 > 0 ? n - c0 : 0) : 16;
    for (int64_t c = 0; c < w; ++c) to_pairs(b.p + (c0 + c) * b.cs, b.rs, k, &col[c * pairs]);
    for (int64_t c = w; c < 16; ++c) {
      for (int64_t q = 0; q < pairs; ++q) col[c * pairs + q] = 0;
    }
    for (int64_t q = 0; q < pairs; ++q) {
      uint32_t* o = bp + q * n_pad + c0;
#pragma omp simd
      for (int64_t c = 0; c < 16; ++c) o[c] = col[c * pairs + q];
    }
  }
}

inline void store_out(float* c, float v) { *c = v; }

// The pair of bfloat16 values at p (p[0] the low half), from any 2-byte alignment.
inline uint32_t load_pair(const bf16_bits* p) {
  uint32_t u;
  std::memcpy(&u, p, sizeof u);
  return u;
}
inline void store_out(bf16_bits* c, float v) { *c = static_cast<bf16_bits>(round_bf16(v)); }

// The micro-kernels' operands: A's pair (r, q) at ap + r * a_m + q * a_q (in bfloat16 units:
// a packed buffer, or a bfloat16 A in place), for r < mr (the rows past mr, not stored, read
// row mr - 1); B's pair (q, j) at bp[q * ldb + j] (packed, zero past n).

// The portable micro-kernel: c[mr x nr] = alpha * (A panel x B panel).
template <typename O>
void tile_portable(const bf16_bits* ap, int64_t a_m, int64_t a_q, const uint32_t* bp,
                   int64_t ldb, int64_t pairs, float alpha, O* c, int64_t ldc, int64_t mr,
                   int64_t nr) {
  float acc[kMR][kNR] = {};
  const bf16_bits* row[kMR];
  for (int r = 0; r < kMR; ++r) row[r] = ap + (r < mr ? r : mr - 1) * a_m;
  for (int64_t q = 0; q < pairs; ++q) {
    float b0[kNR], b1[kNR];
#pragma omp simd
    for (int j = 0; j < kNR; ++j) {
      b0[j] = float_of_bf16(bp[q * ldb + j] & 0xFFFFu);
      b1[j] = float_of_bf16(bp[q * ldb + j] >> 16);
    }
    for (int r = 0; r < kMR; ++r) {
      const uint32_t pa = load_pair(row[r] + q * a_q);
      const float a0 = float_of_bf16(pa & 0xFFFFu);
      const float a1 = float_of_bf16(pa >> 16);
#pragma omp simd
      for (int j = 0; j < kNR; ++j) acc[r][j] = (acc[r][j] + a1 * b1[j]) + a0 * b0[j];
    }
  }
  for (int64_t r = 0; r < mr; ++r) {
    for (int64_t j = 0; j < nr; ++j) store_out(c + r * ldc + j, alpha * acc[r][j]);
  }
}

#ifdef MXMP_BF16_KERNEL
MXMP_BF16_TARGET inline void store16(float* c, __m512 v, __mmask16 m) {
  _mm512_mask_storeu_ps(c, m, v);
}
MXMP_BF16_TARGET inline void store16(bf16_bits* c, __m512 v, __mmask16 m) {
  // vcvtneps2bf16 rounds to nearest even, as round_bf16
  _mm256_mask_storeu_epi16(c, m, (__m256i)_mm512_cvtneps_pbh(v));
}

// A row of a tile, lo (columns 0-15) and hi (16-31), under the masks m0 and m1 (full: all 32).
MXMP_BF16_TARGET inline void store_row(float* c, __m512 lo, __m512 hi, __mmask16 m0,
                                       __mmask16 m1, bool full) {
  if (full) {
    _mm512_storeu_ps(c, lo);
    _mm512_storeu_ps(c + 16, hi);
    return;
  }
  store16(c, lo, m0);
  if (m1) store16(c + 16, hi, m1);
}
MXMP_BF16_TARGET inline void store_row(bf16_bits* c, __m512 lo, __m512 hi, __mmask16 m0,
                                       __mmask16 m1, bool full) {
  if (full) {   // vcvtne2ps2bf16 rounds each value as vcvtneps2bf16: one conversion, one store
    _mm512_storeu_si512(c, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    return;
  }
  store16(c, lo, m0);
  if (m1) store16(c + 16, hi, m1);
}

// The tile's rows, written out: each accumulator a variable of its own (an array of them,
// indexed in loops, is kept on the stack by GCC and stored and reloaded around every tile).
#define MXMP_TILE_ROWS(F) F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7)
static_assert(kMR == 8, "MXMP_TILE_ROWS lists kMR rows");

template <typename O>
MXMP_BF16_TARGET void tile_avx512bf16(const bf16_bits* ap, int64_t a_m, int64_t a_q,
                                      const uint32_t* bp, int64_t ldb, int64_t pairs,
                                      float alpha, O* c, int64_t ldc, int64_t mr, int64_t nr) {
#define MXMP_TILE_INIT(r)                                        \
  __m512 lo##r = _mm512_setzero_ps(), hi##r = _mm512_setzero_ps(); \
  const bf16_bits* row##r = ap + (r < mr ? r : mr - 1) * a_m;
  MXMP_TILE_ROWS(MXMP_TILE_INIT)
#undef MXMP_TILE_INIT
  for (int64_t q = 0; q < pairs; ++q) {
    const __m512i b0 = _mm512_loadu_si512(bp + q * ldb);
    const __m512i b1 = _mm512_loadu_si512(bp + q * ldb + 16);
#define MXMP_TILE_STEP(r)                                                              \
    {                                                                                  \
      const __m512i a = _mm512_set1_epi32(static_cast<int>(load_pair(row##r + q * a_q))); \
      lo##r = _mm512_dpbf16_ps(lo##r, (__m512bh)a, (__m512bh)b0);                      \
      hi##r = _mm512_dpbf16_ps(hi##r, (__m512bh)a, (__m512bh)b1);                      \
    }
    MXMP_TILE_ROWS(MXMP_TILE_STEP)
#undef MXMP_TILE_STEP
  }
  const __m512 s = _mm512_set1_ps(alpha);
  const __mmask16 m0 = nr >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << nr) - 1);
  const __mmask16 m1 = nr >= 32 ? 0xFFFF : nr <= 16 ? 0 :
                       static_cast<__mmask16>((1u << (nr - 16)) - 1);
  const bool full = nr >= kNR;
#define MXMP_TILE_STORE(r)                                                                 \
  if (r < mr) {                                                                            \
    store_row(c + r * ldc, _mm512_mul_ps(lo##r, s), _mm512_mul_ps(hi##r, s), m0, m1, full); \
  }
  MXMP_TILE_ROWS(MXMP_TILE_STORE)
#undef MXMP_TILE_STORE
}
#endif

// Whether the AVX512-BF16 micro-kernel runs: the CPU has it, the library was compiled with
// it, and DNNL_MAX_CPU_ISA (oneDNN v2's names, read as oneDNN reads them: exact, upper case)
// does not cap the ISA below AVX512_CORE_BF16, so that the tiers mxmp simulates with it run the
// portable path (docs/pass.md, "Kernel rule").
bool use_bf16_kernel() {
  static const bool yes = [] {
#ifdef MXMP_BF16_KERNEL
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512bf16")) return false;
    const char* cap = std::getenv("DNNL_MAX_CPU_ISA");
    if (cap == nullptr) return true;
    static const char* const below[] = {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX512_MIC",
                                        "AVX512_MIC_4OPS", "AVX512_CORE", "AVX512_CORE_VNNI"};
    for (const char* b : below) {
      if (std::strcmp(cap, b) == 0) return false;
    }
    return true;
#else
    return false;
#endif
  }();
  return yes;
}

// C (m x n, row stride ldc, dtype O) = alpha * A (m x k) B (k x n); one thread.
template <typename T, typename O>
void gemm(const View<T>& a, const View<T>& b, int64_t m, int64_t n, int64_t k, float alpha,
          O* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  const int64_t pairs = (k + 1) / 2;
  const int64_t m_pad = (m + kMR - 1) / kMR * kMR;
  const int64_t n_pad = (n + kNR - 1) / kNR * kNR;
  // the thread's packing buffers, kept between calls (no allocation per GEMM)
  thread_local std::vector<uint32_t> abuf, bbuf;
  if (abuf.size() < static_cast<size_t>(m_pad * pairs)) abuf.resize(m_pad * pairs);
  if (bbuf.size() < static_cast<size_t>(n_pad * pairs)) bbuf.resize(n_pad * pairs);
  // A's pairs, in bfloat16 units: read in place where A is bfloat16 with its rows contiguous
  // along k and k even (each pair is two neighbours, as pack_a would write it), else packed
  const bf16_bits* a0;
  int64_t a_m, a_q;
  if (std::is_same<T, bf16_bits>::value && a.cs == 1 && k % 2 == 0) {
    a0 = reinterpret_cast<const bf16_bits*>(a.p);
    a_m = a.rs;
    a_q = 2;
  } else {
    pack_a(a, m, k, abuf.data(), &a_m, &a_q);
    a0 = reinterpret_cast<const bf16_bits*>(abuf.data());
    a_m *= 2;
    a_q *= 2;
  }
  pack_b(b, n, k, bbuf.data(), n_pad);
  const bool fast = use_bf16_kernel();
  for (int64_t m0 = 0; m0 < m; m0 += kMR) {
    const int64_t mr = m - m0 < kMR ? m - m0 : kMR;
    const bf16_bits* ap = a0 + m0 * a_m;
    for (int64_t n0 = 0; n0 < n; n0 += kNR) {
      const int64_t nr = n - n0 < kNR ? n - n0 : kNR;
      O* ct = c + m0 * ldc + n0;
#ifdef MXMP_BF16_KERNEL
      if (fast) {
        tile_avx512bf16<O>(ap, a_m, a_q, bbuf.data() + n0, n_pad, pairs, alpha, ct, ldc, mr,
                           nr);
        continue;
      }
#endif
      tile_portable<O>(ap, a_m, a_q, bbuf.data() + n0, n_pad, pairs, alpha, ct, ldc, mr, nr);
    }
  }
}

// Zeroes part [offset, offset + d) of each group's slice of width `width` in a (rows, groups,
// width) tensor: the gradient of the part of an interleaved input an op does not read.
template <typename O>
void zero_part(O* x, int64_t rows, int64_t groups, int64_t width, int64_t offset, int64_t d) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      std::memset(x + (r * groups + g) * width + offset, 0, d * sizeof(O));
    }
  }
}

// The interleaved ops' geometry, from their inputs' shapes and the heads attribute.
struct AttGeom {
  int64_t lq, lk, g, d;   // query length, key length, batch * heads, head dim
  int64_t vw, voff;       // valatt: width per group of the values' tensor, offset of v in it
  bool emit_v;            // selfatt_qk: its second output, the values (emit_v=1)
};

bool attr_heads(const Attrs& attrs, const char* op, int64_t* heads) {
  double h;
  if (attrs.find("heads") == attrs.end()) {
    MX_ERROR_MSG << op << ": the attribute heads is required";
    return false;
  }
  if (!attr_double(attrs, "heads", 0, &h, op)) return false;
  if (!(h >= 1) || h != std::floor(h) || h > 1e9) {
    MX_ERROR_MSG << op << ": heads must be a positive integer, got " << attrs.at("heads");
    return false;
  }
  *heads = static_cast<int64_t>(h);
  return true;
}

// The ops: selfatt (one interleaved input of queries, keys and values, 3 parts per head) and
// encdec (queries alone, keys and values interleaved: 2 parts per head).
enum AttOp { kSelfQK, kSelfValAtt, kEncQK, kEncValAtt };

// The selfatt pair's boolean attributes: emit_v (selfatt_qk) and v_only (selfatt_valatt),
// "0"/"1" (or False/True); absent is false. On another op, or with another value, an error.
bool attr_flag(const Attrs& attrs, const char* key, const char* op, bool allowed, bool* value) {
  *value = false;
  auto it = attrs.find(key);
  if (it == attrs.end()) return true;
  if (!allowed) {
    MX_ERROR_MSG << op << ": the attribute " << key << " belongs to "
                 << (std::strcmp(key, "emit_v") == 0 ? "mxmp_selfatt_qk" : "mxmp_selfatt_valatt")
                 << " only";
    return false;
  }
  const std::string& v = it->second;
  if (v == "1" || v == "True" || v == "true") {
    *value = true;
  } else if (!(v == "0" || v == "False" || v == "false")) {
    MX_ERROR_MSG << op << ": " << key << " must be 0 or 1, got '" << v << "'";
    return false;
  }
  return true;
}

// heads, emit_v and v_only of an attention op's attributes.
bool att_attrs(const Attrs& attrs, AttOp op, const char* name, int64_t* heads, bool* emit_v,
               bool* v_only) {
  return attr_heads(attrs, name, heads) &&
         attr_flag(attrs, "emit_v", name, op == kSelfQK, emit_v) &&
         attr_flag(attrs, "v_only", name, op == kSelfValAtt, v_only);
}

const char* att_name(AttOp op) {
  switch (op) {
    case kSelfQK: return "mxmp_selfatt_qk";
    case kSelfValAtt: return "mxmp_selfatt_valatt";
    case kEncQK: return "mxmp_encdec_qk";
    default: return "mxmp_encdec_valatt";
  }
}

const char* att_mxnet(AttOp op) {
  switch (op) {
    case kSelfQK: return "_contrib_interleaved_matmul_selfatt_qk";
    case kSelfValAtt: return "_contrib_interleaved_matmul_selfatt_valatt";
    case kEncQK: return "_contrib_interleaved_matmul_encdec_qk";
    default: return "_contrib_interleaved_matmul_encdec_valatt";
  }
}

bool att_dtype_ok(int t) { return t == mxnet::ext::kFloat32 || t == 12; }

template <AttOp OP>
MXReturnValue att_parse(const Attrs& attrs, int* num_in, int* num_out) {
  return guarded(att_name(OP), [&] {
    int64_t heads;
    bool emit_v, v_only;
    if (!att_attrs(attrs, OP, att_name(OP), &heads, &emit_v, &v_only)) return MX_FAIL;
    *num_in = OP == kSelfQK ? 1 : 2;
    *num_out = emit_v ? 2 : 1;
    return MX_SUCCESS;
  });
}

template <AttOp OP>
MXReturnValue att_infer_type(const Attrs& attrs, std::vector<int>* in, std::vector<int>* out) {
  return guarded(att_name(OP), [&] {
    // one dtype for every input and the output: float32, or bfloat16 where lib_api passes it
    int t = (*out)[0];
    for (int v : *in) {
      if (v == -1) continue;
      if (!att_dtype_ok(v)) {
        MX_ERROR_MSG << att_name(OP) << ": inputs must be float32 or bfloat16, got "
                     << dtype_name(v);
        return MX_FAIL;
      }
      if (t != -1 && v != t) {
        MX_ERROR_MSG << att_name(OP) << ": inputs must have one dtype, got " << dtype_name(t)
                     << " and " << dtype_name(v);
        return MX_FAIL;
      }
      t = v;
    }
    if (t == -1) return MX_SUCCESS;
    for (int& v : *in) v = t;
    for (int& v : *out) v = t;   // selfatt_qk with emit_v: the values too
    return MX_SUCCESS;
  });
}

template <AttOp OP>
MXReturnValue att_infer_shape(const Attrs& attrs, Shapes* in, Shapes* out) {
  return guarded(att_name(OP), [&] {
    const char* name = att_name(OP);
    int64_t heads;
    bool emit_v, v_only;
    if (!att_attrs(attrs, OP, name, &heads, &emit_v, &v_only)) return MX_FAIL;
    const auto& x = (*in)[0];
    if (!known(x)) return unknown_data(name, att_mxnet(OP), x);
    const int64_t parts = v_only ? 1 : OP == kSelfQK || OP == kSelfValAtt ? 3 :
                          OP == kEncQK ? 1 : 2;
    if (x.size() != 3 || x[2] % (parts * heads) != 0) {
      MX_ERROR_MSG << name << ": the first input must be (seq, batch, " << parts
                   << " * heads * head_dim) with heads=" << heads
                   << (v_only ? " (v_only: the values alone)" : "") << ", got " << shape_str(x);
      return MX_FAIL;
    }
    const unsigned d = static_cast<unsigned>(x[2] / (parts * heads));
    const unsigned g = static_cast<unsigned>(x[1] * heads);
    if (OP == kSelfQK) {
      (*out)[0] = {g, x[0], x[0]};
      if (emit_v) (*out)[1] = {x[0], x[1], static_cast<unsigned>(heads) * d};
      return MX_SUCCESS;
    }
    const auto& y = (*in)[1];
    if (OP == kEncQK) {   // keys_values (seq_k, batch, 2 * heads * d)
      if (!known(y)) return unknown_data(name, att_mxnet(OP), y);
      if (y.size() != 3 || y[1] != x[1] || y[2] != 2 * x[2]) {
        MX_ERROR_MSG << name << ": keys_values must be (seq_k, " << x[1] << ", " << 2 * x[2]
                     << ") for queries " << shape_str(x) << ", got " << shape_str(y);
        return MX_FAIL;
      }
      (*out)[0] = {g, x[0], y[0]};
      return MX_SUCCESS;
    }
    // valatt: attention (batch * heads, seq_q, seq_k); selfatt: seq_q = seq_k = seq
    if (OP == kSelfValAtt) {
      const std::vector<unsigned> want = {g, x[0], x[0]};
      if (!y.empty() && !has_unknown_dim(y) && y != want) {
        MX_ERROR_MSG << name << ": attention must be " << shape_str(want) << " for "
                     << "queries_keys_values " << shape_str(x) << ", got " << shape_str(y);
        return MX_FAIL;
      }
      (*in)[1] = want;
      (*out)[0] = {x[0], x[1], static_cast<unsigned>(heads) * d};
      return MX_SUCCESS;
    }
    if (!known(y)) return unknown_data(name, att_mxnet(OP), y);
    if (y.size() != 3 || y[0] != g || y[2] != x[0]) {
      MX_ERROR_MSG << name << ": attention must be (" << g << ", seq_q, " << x[0] << ") for "
                   << "keys_values " << shape_str(x) << ", got " << shape_str(y);
      return MX_FAIL;
    }
    (*out)[0] = {y[1], x[1], static_cast<unsigned>(heads) * d};
    return MX_SUCCESS;
  });
}

// emit_v (selfatt_qk) and v_only (selfatt_valatt: x holds the values alone) as parsed.
AttGeom att_geom(AttOp op, const MXTensor& x, const MXTensor* y, int64_t heads, bool emit_v,
                 bool v_only) {
  const int64_t parts = v_only ? 1 : op == kSelfQK || op == kSelfValAtt ? 3 :
                        op == kEncQK ? 1 : 2;
  AttGeom g;
  g.g = x.shape[1] * heads;
  g.d = x.shape[2] / (parts * heads);
  g.vw = parts * g.d;
  g.voff = (parts - 1) * g.d;   // values are the last part (selfatt 2d, encdec d, v_only 0)
  g.emit_v = emit_v;
  if (op == kSelfQK || op == kSelfValAtt) {
    g.lq = g.lk = x.shape[0];
  } else if (op == kEncQK) {
    g.lq = x.shape[0];
    g.lk = y->shape[0];
  } else {
    g.lk = x.shape[0];
    g.lq = y->shape[1];
  }
  return g;
}

// Runs fn(i) for i in [0, n) over the OpenMP team when the work is large enough.
template <typename Fn>
void for_groups(int64_t n, int64_t work, Fn fn) {
#pragma omp parallel for schedule(static) if (work >= kParallelMin * 16 && n > 1)
  for (int64_t i = 0; i < n; ++i) fn(i);
}

// One GEMM of a batch: c (m x n, row stride ldc) = alpha * a (m x k) b (k x n).
template <typename T, typename O>
struct GemmCall {
  View<T> a, b;
  int64_t m, n, k;
  float alpha;
  O* c;
  int64_t ldc;
};

// Asks for the lines of a rows x cols view to be brought toward the core (a prefetch with low
// temporal locality: the outer caches, not the L1 the running GEMM uses), along its contiguous
// axis; a view with neither axis contiguous is left alone.
template <typename T>
void prefetch_view(const T* p, int64_t rs, int64_t cs, int64_t rows, int64_t cols) {
  if (cs != 1) {
    if (rs != 1) return;
    std::swap(rs, cs);
    std::swap(rows, cols);
  }
  const int64_t bytes = cols * static_cast<int64_t>(sizeof(T));
  for (int64_t r = 0; r < rows; ++r) {
    const char* row = reinterpret_cast<const char*>(p + r * rs);
    const char* end = row + bytes;
    row -= reinterpret_cast<uintptr_t>(row) & 63;
    for (; row < end; row += 64) __builtin_prefetch(row, 0, 1);
  }
}

// Runs the GEMMs calls(i, out) puts in out (at most 2; it returns their number) for each i in
// [0, n) over the OpenMP team (for_groups), prefetching the operands of group i + 1 before
// computing group i's: the attention operands are rows of a few hundred bytes, tens of
// kilobytes apart, which the hardware prefetchers do not foresee, and group i's products give
// the memory time to deliver them (measured: docs/benchmark.md, "mxmp's own GEMM, taken").
// Only timing changes, not a result.
template <typename T, typename O, typename Calls>
void gemm_groups(int64_t n, int64_t work, Calls calls) {
  for_groups(n, work, [&](int64_t i) {
    GemmCall<T, O> now[2], next[2];
    const int count = calls(i, now);
    if (i + 1 < n) {
      const int later = calls(i + 1, next);
      for (int j = 0; j < later; ++j) {
        const GemmCall<T, O>& c = next[j];
        prefetch_view(c.a.p, c.a.rs, c.a.cs, c.m, c.k);
        prefetch_view(c.b.p, c.b.rs, c.b.cs, c.k, c.n);
      }
    }
    for (int j = 0; j < count; ++j) {
      const GemmCall<T, O>& c = now[j];
      gemm(c.a, c.b, c.m, c.n, c.k, c.alpha, c.c, c.ldc);
    }
  });
}

// Forward. qk: x = queries (selfatt: qkv; encdec: queries), y = keys (encdec: keys_values).
// valatt: x = values' tensor (qkv or keys_values), y = attention.
template <AttOp OP, typename T, typename O>
void att_forward(const T* x, const T* y, O* out, const AttGeom& s) {
  const int64_t d = s.d, g = s.g, lq = s.lq, lk = s.lk;
  const float alpha = 1.0f / std::sqrt(static_cast<float>(d));
  if (OP == kSelfQK || OP == kEncQK) {
    const int64_t qw = OP == kSelfQK ? 3 * d : d;     // width per group of the queries' tensor
    const int64_t kw = OP == kSelfQK ? 3 * d : 2 * d; // and of the keys'
    const T* keys = OP == kSelfQK ? x + d : y;
    gemm_groups<T, O>(g, g * lq * lk * d, [&](int64_t i, GemmCall<T, O>* c) {
      c[0] = {View<T>{x + i * qw, g * qw, 1}, View<T>{keys + i * kw, 1, g * kw}, lq, lk, d,
              alpha, out + i * lq * lk, lk};
      return 1;
    });
    return;
  }
  const int64_t vw = s.vw;
  const T* values = x + s.voff;
  gemm_groups<T, O>(g, g * lq * lk * d, [&](int64_t i, GemmCall<T, O>* c) {
    c[0] = {View<T>{y + i * lq * lk, lk, 1}, View<T>{values + i * vw, g * vw, 1}, lq, d, lk,
            1.0f, out + i * d, g * d};
    return 1;
  });
}

// selfatt_qk with emit_v, forward: the values of qkv (lq, g, 3d), part 2 of each group, into
// v (lq, g, d), a copy. Backward: dv back into that part of dqkv (dv null: zeros there).
template <typename T>
void att_copy_values(const T* qkv, T* v, const AttGeom& s) {
  const int64_t d = s.d, g = s.g;
  for_groups(s.lq, s.lq * g * d / 16, [&](int64_t r) {
    for (int64_t i = 0; i < g; ++i) {
      std::memcpy(v + (r * g + i) * d, qkv + (r * g + i) * 3 * d + 2 * d, d * sizeof(T));
    }
  });
}

template <typename O>
void att_put_values(const O* dv, O* dqkv, const AttGeom& s) {
  const int64_t d = s.d, g = s.g;
  for_groups(s.lq, s.lq * g * d / 16, [&](int64_t r) {
    for (int64_t i = 0; i < g; ++i) {
      O* o = dqkv + (r * g + i) * 3 * d + 2 * d;
      if (dv == nullptr) {
        std::memset(o, 0, d * sizeof(O));
      } else {
        std::memcpy(o, dv + (r * g + i) * d, d * sizeof(O));
      }
    }
  });
}

// Backward of qk: dout (g, lq, lk) -> d queries (into dq) and d keys (into dk; for selfatt both
// are dqkv, whose value part is zeroed, or with emit_v gets dv: att_backward_typed).
template <AttOp OP, typename T, typename O>
void att_qk_backward(const T* dout, const T* x, const T* y, O* dq, O* dk, const AttGeom& s) {
  const int64_t d = s.d, g = s.g, lq = s.lq, lk = s.lk;
  const float alpha = 1.0f / std::sqrt(static_cast<float>(d));
  const int64_t qw = OP == kSelfQK ? 3 * d : d;
  const int64_t kw = OP == kSelfQK ? 3 * d : 2 * d;
  const T* keys = OP == kSelfQK ? x + d : y;
  O* dkeys = dk == nullptr ? nullptr : OP == kSelfQK ? dk + d : dk;
  gemm_groups<T, O>(g, g * lq * lk * d, [&](int64_t i, GemmCall<T, O>* c) {
    int count = 0;
    if (dq != nullptr) {   // dQ = alpha dout K
      c[count++] = {View<T>{dout + i * lq * lk, lk, 1}, View<T>{keys + i * kw, g * kw, 1}, lq,
                    d, lk, alpha, dq + i * qw, g * qw};
    }
    if (dkeys != nullptr) {   // dK = alpha dout^T Q
      c[count++] = {View<T>{dout + i * lq * lk, 1, lk}, View<T>{x + i * qw, g * qw, 1}, lk, d,
                    lq, alpha, dkeys + i * kw, g * kw};
    }
    return count;
  });
  if (OP == kSelfQK && dq != nullptr && !s.emit_v) zero_part(dq, lq, g, 3 * d, 2 * d, d);
  if (OP == kEncQK && dk != nullptr) zero_part(dk, lk, g, 2 * d, d, d);
}

// Backward of valatt: dout (lq, batch, heads * d) -> d values' tensor (dx; its value part,
// the rest zeroed) and d attention (datt).
template <AttOp OP, typename T, typename O>
void att_valatt_backward(const T* dout, const T* x, const T* att, O* dx, O* datt,
                         const AttGeom& s) {
  const int64_t d = s.d, g = s.g, lq = s.lq, lk = s.lk;
  const int64_t vw = s.vw, voff = s.voff;
  gemm_groups<T, O>(g, g * lq * lk * d, [&](int64_t i, GemmCall<T, O>* c) {
    int count = 0;
    if (datt != nullptr) {   // dAtt = dout V^T
      c[count++] = {View<T>{dout + i * d, g * d, 1}, View<T>{x + voff + i * vw, 1, g * vw}, lq,
                    lk, d, 1.0f, datt + i * lq * lk, lk};
    }
    if (dx != nullptr) {   // dV = att^T dout
      c[count++] = {View<T>{att + i * lq * lk, 1, lk}, View<T>{dout + i * d, g * d, 1}, lk, d,
                    lq, 1.0f, dx + voff + i * vw, g * vw};
    }
    return count;
  });
  if (dx != nullptr && voff > 0) {   // v_only: dx is dv, wholly written
    zero_part(dx, lk, g, vw, 0, voff);
  }
}

template <AttOp OP, typename T>
void att_forward_typed(std::vector<MXTensor>* in, std::vector<MXTensor>* out, const AttGeom& s) {
  const T* x = (*in)[0].data<T>();
  const T* y = in->size() > 1 ? (*in)[1].data<T>() : nullptr;
  att_forward<OP, T, T>(x, y, (*out)[0].data<T>(), s);
  if (OP == kSelfQK && s.emit_v) att_copy_values<T>(x, (*out)[1].data<T>(), s);
}

template <AttOp OP>
MXReturnValue att_forward_cpu(const Attrs& attrs, std::vector<MXTensor>* in,
                              std::vector<MXTensor>* out, const OpResource& res) {
  return guarded(att_name(OP), [&] {
    int64_t heads;
    bool emit_v, v_only;
    if (!att_attrs(attrs, OP, att_name(OP), &heads, &emit_v, &v_only)) return MX_FAIL;
    const AttGeom s = att_geom(OP, (*in)[0], in->size() > 1 ? &(*in)[1] : nullptr, heads,
                               emit_v, v_only);
    if ((*in)[0].dtype == mxnet::ext::kFloat32) {
      att_forward_typed<OP, float>(in, out, s);
    } else {
      att_forward_typed<OP, bf16_bits>(in, out, s);
    }
    return MX_SUCCESS;
  });
}

template <AttOp OP, typename T>
void att_backward_typed(std::vector<MXTensor>* in, std::vector<MXTensor>* out,
                        const AttGeom& s) {
  // qk:     in: d out, x, [y], out;     out: d x, [d y]
  // selfatt_qk with emit_v: in: d out, d v, qkv, out, v;   out: d qkv
  // valatt: in: d out, x, att, out;     out: d x, d att     (v_only: x is v, d x is d v)
  const T* dy = (*in)[0].data<T>();
  if (OP == kSelfQK) {
    const T* x = (*in)[s.emit_v ? 2 : 1].data<T>();
    T* dx = out_ptr<T>(out, 0);
    att_qk_backward<OP, T, T>(dy, x, nullptr, dx, dx, s);
    // the values' part of dqkv: dv (MXNet feeds zeros where nothing reads v)
    if (s.emit_v && dx != nullptr) att_put_values<T>((*in)[1].data<T>(), dx, s);
    return;
  }
  const T* x = (*in)[1].data<T>();
  if (OP == kEncQK) {
    att_qk_backward<OP, T, T>(dy, x, (*in)[2].data<T>(), out_ptr<T>(out, 0),
                              out_ptr<T>(out, 1), s);
  } else {
    att_valatt_backward<OP, T, T>(dy, x, (*in)[2].data<T>(), out_ptr<T>(out, 0),
                                  out_ptr<T>(out, 1), s);
  }
}

template <AttOp OP>
MXReturnValue att_backward_cpu(const Attrs& attrs, std::vector<MXTensor>* in,
                               std::vector<MXTensor>* out, const OpResource& res) {
  return guarded(att_name(OP), [&] {
    int64_t heads;
    bool emit_v, v_only;
    if (!att_attrs(attrs, OP, att_name(OP), &heads, &emit_v, &v_only)) return MX_FAIL;
    // the first input follows the outputs' gradients (two with emit_v)
    const AttGeom s = att_geom(OP, (*in)[emit_v ? 2 : 1], OP == kSelfQK ? nullptr : &(*in)[2],
                               heads, emit_v, v_only);
    if ((*in)[0].dtype == mxnet::ext::kFloat32) {
      att_backward_typed<OP, float>(in, out, s);
    } else {
      att_backward_typed<OP, bf16_bits>(in, out, s);
    }
    return MX_SUCCESS;
  });
}


// ---------------------------------------------------------------------------------------------
// The multi-tensor SGD update (mxmp_multi_sgd_update)
struct SgdAttrs {
  int n = 0;
  bool with_momentum = false;
  std::vector<float> lrs, wds;
  std::vector<bool> targets;
  int num_targets = 0;
  float momentum = 0.f, rescale_grad = 1.f, clip_gradient = -1.f;
};

// A float attribute as MXNet's dmlc::Parameter reads a float field (dmlc::stof, whose rounding
// is its own: the value MXNet's op would use for the same string).
bool sgd_float(const Attrs& attrs, const char* key, float dflt, float* value) {
  auto it = attrs.find(key);
  if (it == attrs.end()) {
    *value = dflt;
    return true;
  }
  size_t pos = 0;
  try {
    *value = dmlc::stof(it->second, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  if (pos == 0 || pos != it->second.size()) {
    MX_ERROR_MSG << "mxmp_multi_sgd_update: attribute " << key << "='" << it->second
                 << "' is not a number";
    return false;
  }
  return true;
}

// A tuple of floats as MXNet's Tuple<float> reads it: "(a, b, ...)" or "[...]", each number
// by an istream in the "C" locale.
bool sgd_floats(const Attrs& attrs, const char* key, int n, std::vector<float>* values) {
  auto it = attrs.find(key);
  if (it == attrs.end()) {
    MX_ERROR_MSG << "mxmp_multi_sgd_update: attribute " << key << " is missing";
    return false;
  }
  std::string text = it->second;
  for (char& c : text) {
    if (c == '(' || c == ')' || c == '[' || c == ']' || c == ',') c = ' ';
  }
  std::istringstream in(text);
  in.imbue(std::locale::classic());
  values->clear();
  float v;
  while (in >> v) values->push_back(v);
  if (!in.eof() || static_cast<int>(values->size()) != n) {
    MX_ERROR_MSG << "mxmp_multi_sgd_update: attribute " << key << "='" << it->second
                 << "' is not a tuple of num_weights=" << n << " numbers";
    return false;
  }
  return true;
}

bool sgd_attrs(const Attrs& attrs, SgdAttrs* a) {
  auto nw = attrs.find("num_weights");
  if (nw == attrs.end() || nw->second.empty() ||
      nw->second.find_first_not_of("0123456789") != std::string::npos ||
      nw->second.size() > 6 || std::atoi(nw->second.c_str()) < 1) {
    MX_ERROR_MSG << "mxmp_multi_sgd_update: num_weights must be a positive integer, got '"
                 << (nw == attrs.end() ? std::string("(missing)") : nw->second) << "'";
    return false;
  }
  a->n = std::atoi(nw->second.c_str());
  auto wm = attrs.find("with_momentum");
  a->with_momentum = wm != attrs.end() && (wm->second == "1" || wm->second == "True");
  auto tg = attrs.find("targets");
  const std::string flags = tg == attrs.end() ? std::string(a->n, '0') : tg->second;
  if (static_cast<int>(flags.size()) != a->n ||
      flags.find_first_not_of("01") != std::string::npos) {
    MX_ERROR_MSG << "mxmp_multi_sgd_update: targets must be num_weights=" << a->n
                 << " characters '0' or '1', got '" << flags << "'";
    return false;
  }
  a->targets.assign(a->n, false);
  a->num_targets = 0;
  for (int i = 0; i < a->n; ++i) {
    a->targets[i] = flags[i] == '1';
    a->num_targets += a->targets[i];
  }
  return sgd_floats(attrs, "lrs", a->n, &a->lrs) && sgd_floats(attrs, "wds", a->n, &a->wds) &&
         sgd_float(attrs, "momentum", 0.f, &a->momentum) &&
         sgd_float(attrs, "rescale_grad", 1.f, &a->rescale_grad) &&
         sgd_float(attrs, "clip_gradient", -1.f, &a->clip_gradient);
}

MXReturnValue sgd_parse(const Attrs& attrs, int* num_in, int* num_out) {
  return guarded("mxmp_multi_sgd_update", [&] {
    SgdAttrs a;
    if (!sgd_attrs(attrs, &a)) return MX_FAIL;
    const int stride = a.with_momentum ? 3 : 2;
    *num_in = stride * a.n;
    *num_out = (a.with_momentum ? 2 : 1) * a.n + a.num_targets;
    return MX_SUCCESS;
  });
}

MXReturnValue sgd_infer_type(const Attrs& attrs, std::vector<int>* in, std::vector<int>* out) {
  return guarded("mxmp_multi_sgd_update", [&] {
    SgdAttrs a;
    if (!sgd_attrs(attrs, &a)) return MX_FAIL;
    const int stride = a.with_momentum ? 3 : 2;
    for (int i = 0; i < a.n; ++i) {
      for (int j = 0; j < stride; ++j) {
        int& v = (*in)[stride * i + j];
        if (v == -1) v = mxnet::ext::kFloat32;
        const bool ok = v == mxnet::ext::kFloat32 || (j == 1 && v == kBfloat16);
        if (!ok) {
          MX_ERROR_MSG << "mxmp_multi_sgd_update: weight " << i << "'s "
                       << (j == 0 ? "weight" : j == 1 ? "grad" : "mom")
                       << " must be float32" << (j == 1 ? " or bfloat16" : "") << ", got "
                       << dtype_name(v);
          return MX_FAIL;
        }
      }
    }
    const int states = (a.with_momentum ? 2 : 1) * a.n;
    for (int k = 0; k < states; ++k) (*out)[k] = mxnet::ext::kFloat32;
    for (int k = 0; k < a.num_targets; ++k) (*out)[states + k] = kBfloat16;
    return MX_SUCCESS;
  });
}

MXReturnValue sgd_infer_shape(const Attrs& attrs, Shapes* in, Shapes* out) {
  return guarded("mxmp_multi_sgd_update", [&] {
    SgdAttrs a;
    if (!sgd_attrs(attrs, &a)) return MX_FAIL;
    const int stride = a.with_momentum ? 3 : 2;
    int t = 0;
    for (int i = 0; i < a.n; ++i) {
      const auto& ws = (*in)[stride * i];
      if (!known(ws)) {
        MX_ERROR_MSG << "mxmp_multi_sgd_update: weight " << i << "'s shape is unknown";
        return MX_FAIL;
      }
      for (int j = 1; j < stride; ++j) {
        if ((*in)[stride * i + j] != ws) {
          MX_ERROR_MSG << "mxmp_multi_sgd_update: weight " << i << " has shape "
                       << shape_str(ws) << " but its " << (j == 1 ? "grad" : "mom") << " "
                       << shape_str((*in)[stride * i + j]);
          return MX_FAIL;
        }
      }
      (*out)[i] = ws;
      if (a.with_momentum) (*out)[a.n + i] = ws;
      if (a.targets[i]) (*out)[(a.with_momentum ? 2 : 1) * a.n + t++] = ws;
    }
    return MX_SUCCESS;
  });
}

// The arrays of one weight of a call.
struct SgdSlot {
  float* w;
  const void* g;
  bool g_bf16;
  float* mom;       // nullptr: no momentum
  bf16* target;     // nullptr: no bfloat16 copy
  float lr_wd, lr_rescale, lr;
  int64_t size;
};

// Elements per block of the parallel loop (a thread's unit of work).
const int64_t kSgdBlock = 1 << 14;

// MXNet's mshadow_op::clip: NaN passes through.
inline float sgd_clip(float x, float bound) {
  return x > bound ? bound : (x < -bound ? -bound : x);
}

// One block of one weight. No contraction into fused multiply-adds: MXNet's kernel rounds
// every product and difference (its wheel is built without FMA; checked bit for bit by
// tests/training/test_fused_update.py).
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
template <typename G, bool kMom, bool kClip, bool kTarget>
__attribute__((optimize("fp-contract=off")))
void sgd_block(const SgdSlot& s, int64_t begin, int64_t end, float momentum, float rescale,
               float clip) {
  float* __restrict w = s.w;
  const G* __restrict g = static_cast<const G*>(s.g);
  float* __restrict mom = s.mom;
  bf16* __restrict target = s.target;
  const float lr_wd = s.lr_wd, lr_rescale = s.lr_rescale, lr = s.lr;
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) {
    const float wi = w[i];
    const float m0 = kMom ? mom[i] : 0.f;
    const float gi = Num<G>::load(g[i]);
    float m;
    if (kClip) {
      m = momentum * m0 - lr_wd * wi - lr * sgd_clip(rescale * gi, clip);
    } else {
      m = momentum * m0 - lr_wd * wi - lr_rescale * gi;
    }
    if (kMom) mom[i] = m;
    const float wn = wi + m;
    w[i] = wn;
    if (kTarget) target[i] = Num<bf16>::store(wn);
  }
}
#pragma GCC pop_options

template <typename G, bool kMom, bool kClip>
void sgd_block_t(const SgdSlot& s, int64_t begin, int64_t end, float momentum, float rescale,
                 float clip) {
  if (s.target) {
    sgd_block<G, kMom, kClip, true>(s, begin, end, momentum, rescale, clip);
  } else {
    sgd_block<G, kMom, kClip, false>(s, begin, end, momentum, rescale, clip);
  }
}

template <bool kMom, bool kClip>
void sgd_block_g(const SgdSlot& s, int64_t begin, int64_t end, float momentum, float rescale,
                 float clip) {
  if (s.g_bf16) {
    sgd_block_t<bf16, kMom, kClip>(s, begin, end, momentum, rescale, clip);
  } else {
    sgd_block_t<float, kMom, kClip>(s, begin, end, momentum, rescale, clip);
  }
}

MXReturnValue sgd_forward_cpu(const Attrs& attrs, std::vector<MXTensor>* in,
                              std::vector<MXTensor>* out, const OpResource& res) {
  return guarded("mxmp_multi_sgd_update", [&] {
    SgdAttrs a;
    if (!sgd_attrs(attrs, &a)) return MX_FAIL;
    const int stride = a.with_momentum ? 3 : 2;
    std::vector<SgdSlot> slots(a.n);
    std::vector<int64_t> first_block(a.n + 1, 0);
    int t = 0;
    int64_t total = 0;
    for (int i = 0; i < a.n; ++i) {
      MXTensor& w = (*in)[stride * i];
      MXTensor& g = (*in)[stride * i + 1];
      MXTensor& wout = (*out)[i];
      if (wout.data_ptr != w.data_ptr ||
          (a.with_momentum && (*out)[a.n + i].data_ptr != (*in)[stride * i + 2].data_ptr)) {
        MX_ERROR_MSG << "mxmp_multi_sgd_update updates in place: call it with out= the "
                     << "weights, then the moms, then the bfloat16 copies";
        return MX_FAIL;
      }
      SgdSlot& s = slots[i];
      s.w = w.data<float>();
      s.g = g.data_ptr;
      s.g_bf16 = g.dtype == kBfloat16;
      s.mom = a.with_momentum ? (*in)[stride * i + 2].data<float>() : nullptr;
      s.target = a.targets[i] ?
          static_cast<bf16*>((*out)[(a.with_momentum ? 2 : 1) * a.n + t++].data_ptr) : nullptr;
      // MXNet's left-to-right products: lr * wd * w is (lr * wd) * w
      s.lr = a.lrs[i];
      s.lr_wd = a.lrs[i] * a.wds[i];
      s.lr_rescale = a.lrs[i] * a.rescale_grad;
      const int64_t size = w.size();
      s.size = size;
      total += size;
      first_block[i + 1] = first_block[i] + (size + kSgdBlock - 1) / kSgdBlock;
    }
    const int64_t blocks = first_block[a.n];
    const bool clip = a.clip_gradient >= 0.f;
    const float momentum = a.with_momentum ? a.momentum : 0.f;
    const float rescale = a.rescale_grad, bound = a.clip_gradient;
    const bool with_mom = a.with_momentum;
#pragma omp parallel for schedule(static) if (total >= kParallelMin && blocks > 1)
    for (int64_t b = 0; b < blocks; ++b) {
      // the weight holding block b (blocks are numbered weight after weight)
      int lo = 0, hi = a.n;
      while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (first_block[mid] <= b) lo = mid; else hi = mid;
      }
      const SgdSlot& s = slots[lo];
      const int64_t size = s.size;
      const int64_t begin = (b - first_block[lo]) * kSgdBlock;
      const int64_t end = begin + kSgdBlock < size ? begin + kSgdBlock : size;
      if (with_mom) {
        if (clip) sgd_block_g<true, true>(s, begin, end, momentum, rescale, bound);
        else sgd_block_g<true, false>(s, begin, end, momentum, rescale, bound);
      } else {
        if (clip) sgd_block_g<false, true>(s, begin, end, momentum, rescale, bound);
        else sgd_block_g<false, false>(s, begin, end, momentum, rescale, bound);
      }
    }
    return MX_SUCCESS;
  });
}

// ---------------------------------------------------------------------------------------------
// GELU kernels (mxmp_gelu)
// gelu(x) = x Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2, MXNet's LeakyReLU(act_type='gelu');
// d gelu / dx = Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi) (MXNet's gelu_grad).
// float32 math: Phi from erfc(z), z = |x| / sqrt 2, as exp(-z^2) t P(t), t = 1 / (1 + 0.55 z),
// P of degree 6 in t (fitted for mxmp to erfc by reweighted least squares on the absolute
// error: below 3.5e-7 for every z in float32 arithmetic, Phi within 1.8e-7), a branch-free exp
// (0 below e^-87: Phi(x) < 2e-38 for x < -13.2), so that the loops vectorise. Limits:
// gelu(+inf) = inf, gelu(-inf) = -0, gradient 1 at +inf and 0 at -inf (MXNet's float32 op
// gives NaN there: inf * 0); NaN stays NaN. float64 data: std::erfc in double. Each element is
// independent: results do not depend on the number of threads.
const float kGeluP[7] = {3.014647961e-01f, 3.917648792e-01f, -4.439081252e-02f,
                         7.647525668e-01f, -5.228164196e-01f, 1.097231805e-01f,
                         -4.981412203e-04f};
const int64_t kGeluChunk = 1024;

// Phi(x) (into cdf) and exp(-x^2 / 2) (into e_out), float32; a NaN x gives NaN in cdf
inline void gelu_parts(float x, float* cdf, float* e_out) {
  const float ax = std::fabs(x) > 16.0f ? 16.0f : std::fabs(x);   // beyond: Phi is 0 or 1
  const float t = 1.0f / (1.0f + 0.55f * 0.70710678118654752f * ax);
  float p = kGeluP[6];
  for (int k = 5; k >= 0; --k) p = p * t + kGeluP[k];
  const float e = exp_nonpositive(-0.5f * ax * ax);   // the softmax kernels' e^x
  const float c = 0.5f * t * p * e;   // erfc(z) / 2 = Phi(-|x|)
  *cdf = x >= 0.0f ? 1.0f - c : c;
  *e_out = ax < 16.0f ? e : 0.0f;
}

inline float gelu_value(float x) {
  float cdf, e;
  gelu_parts(x, &cdf, &e);
  return cdf == 0.0f ? -0.0f : x * cdf;
}

inline float gelu_slope(float x) {
  float cdf, e;
  gelu_parts(x, &cdf, &e);
  return cdf + (e == 0.0f ? 0.0f : x * e * 0.39894228040143268f);
}

inline double gelu_value(double x) {
  const double cdf = 0.5 * std::erfc(-x * 0.70710678118654752);
  return cdf == 0.0 ? -0.0 : x * cdf;
}

inline double gelu_slope(double x) {
  const double e = std::exp(-0.5 * x * x);
  return 0.5 * std::erfc(-x * 0.70710678118654752) +
         (e == 0.0 ? 0.0 : x * e * 0.39894228040143268);
}

inline float gelu_load(float v) { return v; }
inline float gelu_load(bf16 v) { return Num<bf16>::load(v); }
inline float gelu_cast(float v, float*) { return v; }
inline bf16 gelu_cast(float v, bf16*) { return bf16{static_cast<uint16_t>(round_bf16(v))}; }

// y = gelu(x) (dy null) or y = dy * gelu'(x); blocks of kGeluChunk elements over the threads
template <typename T>
void gelu_all(const T* x, const T* dy, T* y, int64_t n) {
  const int64_t chunks = (n + kGeluChunk - 1) / kGeluChunk;
#pragma omp parallel for schedule(static) if (n >= kParallelMin && chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t start = c * kGeluChunk;
    const int64_t end = start + kGeluChunk < n ? start + kGeluChunk : n;
    if (dy == nullptr) {
#pragma omp simd
      for (int64_t i = start; i < end; ++i) y[i] = gelu_cast(gelu_value(gelu_load(x[i])), y);
    } else {
#pragma omp simd
      for (int64_t i = start; i < end; ++i) {
        y[i] = gelu_cast(gelu_slope(gelu_load(x[i])) * gelu_load(dy[i]), y);
      }
    }
  }
}

void gelu_all(const double* x, const double* dy, double* y, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = dy == nullptr ? gelu_value(x[i]) : dy[i] * gelu_slope(x[i]);
}

MXReturnValue gelu_parse(const Attrs& attrs, int* num_in, int* num_out) {
  *num_in = 1;
  *num_out = 1;
  return MX_SUCCESS;
}

MXReturnValue gelu_infer_type(const Attrs& attrs, std::vector<int>* in, std::vector<int>* out) {
  return guarded("mxmp_gelu", [&] {
    const int t = (*in)[0] != -1 ? (*in)[0] : (*out)[0];
    if (t != -1 && !is_data(t)) {
      MX_ERROR_MSG << "mxmp_gelu: data must be float32, float64 or bfloat16, got "
                   << dtype_name(t);
      return MX_FAIL;
    }
    (*in)[0] = t;
    (*out)[0] = t;
    return MX_SUCCESS;
  });
}

MXReturnValue gelu_infer_shape(const Attrs& attrs, Shapes* in, Shapes* out) {
  return guarded("mxmp_gelu", [&] {
    if (!known((*in)[0])) return unknown_data("mxmp_gelu", "LeakyReLU", (*in)[0]);
    (*out)[0] = (*in)[0];
    return MX_SUCCESS;
  });
}

template <typename T>
void gelu_typed(MXTensor& x, MXTensor* dy, MXTensor& y) {
  gelu_all<T>(x.data<T>(), dy == nullptr ? nullptr : dy->data<T>(), y.data<T>(), x.size());
}

void gelu_dispatch(MXTensor& x, MXTensor* dy, MXTensor& y) {
  if (x.dtype == mxnet::ext::kFloat32) {
    gelu_typed<float>(x, dy, y);
  } else if (x.dtype == mxnet::ext::kFloat64) {
    gelu_all(x.data<double>(), dy == nullptr ? nullptr : dy->data<double>(), y.data<double>(),
             x.size());
  } else {
    gelu_typed<bf16>(x, dy, y);
  }
}

MXReturnValue gelu_forward_cpu(const Attrs& attrs, std::vector<MXTensor>* in,
                               std::vector<MXTensor>* out, const OpResource& res) {
  return guarded("mxmp_gelu", [&] {
    gelu_dispatch((*in)[0], nullptr, (*out)[0]);
    return MX_SUCCESS;
  });
}

MXReturnValue gelu_backward_cpu(const Attrs& attrs, std::vector<MXTensor>* in,
                                std::vector<MXTensor>* out, const OpResource& res) {
  // in: d out, data, out; out: d data
  return guarded("mxmp_gelu backward", [&] {
    if ((*out)[0].data_ptr == nullptr) return MX_SUCCESS;
    gelu_dispatch((*in)[1], &(*in)[0], (*out)[0]);
    return MX_SUCCESS;
  });
}

// ---------------------------------------------------------------------------------------------
// mxmp_batch_dot: MXNet's batch_dot on the attention matmuls' GEMM (bfloat16 products, float32
// accumulation)
const char* const kBatchDot = "mxmp_batch_dot";

bool attr_bool(const Attrs& attrs, const char* key, bool* value) {
  auto it = attrs.find(key);
  if (it == attrs.end()) {
    *value = false;
    return true;
  }
  const std::string& v = it->second;
  if (v == "True" || v == "true" || v == "1") {
    *value = true;
    return true;
  }
  if (v == "False" || v == "false" || v == "0") {
    *value = false;
    return true;
  }
  MX_ERROR_MSG << kBatchDot << ": " << key << " must be True or False, got " << v;
  return false;
}

bool bd_flags(const Attrs& attrs, bool* ta, bool* tb) {
  return attr_bool(attrs, "transpose_a", ta) && attr_bool(attrs, "transpose_b", tb);
}

MXReturnValue bd_parse(const Attrs& attrs, int* num_in, int* num_out) {
  return guarded(kBatchDot, [&] {
    bool ta, tb;
    if (!bd_flags(attrs, &ta, &tb)) return MX_FAIL;
    *num_in = 2;
    *num_out = 1;
    return MX_SUCCESS;
  });
}

MXReturnValue bd_infer_type(const Attrs& attrs, std::vector<int>* in, std::vector<int>* out) {
  return guarded(kBatchDot, [&] {
    int t = (*out)[0];
    for (int v : *in) {
      if (v == -1) continue;
      if (!att_dtype_ok(v)) {
        MX_ERROR_MSG << kBatchDot << ": inputs must be float32 or bfloat16, got "
                     << dtype_name(v);
        return MX_FAIL;
      }
      if (t != -1 && v != t) {
        MX_ERROR_MSG << kBatchDot << ": inputs must have one dtype, got " << dtype_name(t)
                     << " and " << dtype_name(v);
        return MX_FAIL;
      }
      t = v;
    }
    if (t == -1) return MX_SUCCESS;
    for (int& v : *in) v = t;
    (*out)[0] = t;
    return MX_SUCCESS;
  });
}

MXReturnValue bd_infer_shape(const Attrs& attrs, Shapes* in, Shapes* out) {
  return guarded(kBatchDot, [&] {
    bool ta, tb;
    if (!bd_flags(attrs, &ta, &tb)) return MX_FAIL;
    const auto& a = (*in)[0];
    const auto& b = (*in)[1];
    if (!known(a)) return unknown_data(kBatchDot, "batch_dot", a);
    if (!known(b)) return unknown_data(kBatchDot, "batch_dot", b);
    const size_t n = a.size();
    bool ok = n >= 3 && b.size() == n;
    for (size_t i = 0; ok && i + 2 < n; ++i) ok = a[i] == b[i];
    const unsigned k_a = ta ? a[n - 2] : a[n - 1];
    const unsigned k_b = ok ? (tb ? b[n - 1] : b[n - 2]) : 0;
    if (!ok || k_a != k_b) {
      MX_ERROR_MSG << kBatchDot << ": inputs must have the same batch axes (at least 3 axes) and "
                   << "matching inner dimensions (transpose_a=" << ta << ", transpose_b="
                   << tb << "), got " << shape_str(a) << " and " << shape_str(b);
      return MX_FAIL;
    }
    std::vector<unsigned> o(a.begin(), a.end() - 2);
    o.push_back(ta ? a[n - 1] : a[n - 2]);
    o.push_back(tb ? b[n - 2] : b[n - 1]);
    (*out)[0] = o;
    return MX_SUCCESS;
  });
}

// The geometry of a call: batch, M, N, K from a's and b's shapes and the flags.
struct BdGeom {
  int64_t batch, m, n, k;
  bool ta, tb;
};

BdGeom bd_geom(const MXTensor& a, const MXTensor& b, bool ta, bool tb) {
  BdGeom g;
  const size_t nd = a.shape.size();
  g.batch = 1;
  for (size_t i = 0; i + 2 < nd; ++i) g.batch *= a.shape[i];
  g.m = ta ? a.shape[nd - 1] : a.shape[nd - 2];
  g.k = ta ? a.shape[nd - 2] : a.shape[nd - 1];
  g.n = tb ? b.shape[nd - 2] : b.shape[nd - 1];
  g.ta = ta;
  g.tb = tb;
  return g;
}

// op(a) (M x K) of batch element i, a view of a as stored; op(a)^T (K x M) with `transposed`.
template <typename T>
View<T> bd_a(const T* a, const BdGeom& s, int64_t i, bool transposed) {
  const T* p = a + i * s.m * s.k;
  const bool t = s.ta != transposed;   // the stored matrix read across its rows
  return s.ta ? View<T>{p, t ? 1 : s.m, t ? s.m : 1} : View<T>{p, t ? 1 : s.k, t ? s.k : 1};
}

// op(b) (K x N) of batch element i; op(b)^T (N x K) with `transposed`.
template <typename T>
View<T> bd_b(const T* b, const BdGeom& s, int64_t i, bool transposed) {
  const T* p = b + i * s.k * s.n;
  const bool t = s.tb != transposed;
  return s.tb ? View<T>{p, t ? 1 : s.k, t ? s.k : 1} : View<T>{p, t ? 1 : s.n, t ? s.n : 1};
}

template <typename T>
void bd_forward(const T* a, const T* b, T* out, const BdGeom& s) {
  for_groups(s.batch, s.batch * s.m * s.n * s.k, [&](int64_t i) {
    gemm(bd_a(a, s, i, false), bd_b(b, s, i, false), s.m, s.n, s.k, 1.0f,
         out + i * s.m * s.n, s.n);
  });
}

// da (as stored: (M, K), or (K, M) with transpose_a) and db ((K, N), or (N, K) with
// transpose_b) from dout (M, N); either may be null (not requested).
template <typename T>
void bd_backward(const T* dout, const T* a, const T* b, T* da, T* db, const BdGeom& s) {
  const int64_t m = s.m, n = s.n, k = s.k;
  for_groups(s.batch, s.batch * m * n * k, [&](int64_t i) {
    const View<T> dc{dout + i * m * n, n, 1};      // (M, N)
    const View<T> dct{dout + i * m * n, 1, n};     // (N, M)
    if (da != nullptr) {
      if (!s.ta) {   // (M, K) = dout op(b)^T
        gemm(dc, bd_b(b, s, i, true), m, k, n, 1.0f, da + i * m * k, k);
      } else {       // (K, M) = op(b) dout^T
        gemm(bd_b(b, s, i, false), dct, k, m, n, 1.0f, da + i * m * k, m);
      }
    }
    if (db != nullptr) {
      if (!s.tb) {   // (K, N) = op(a)^T dout
        gemm(bd_a(a, s, i, true), dc, k, n, m, 1.0f, db + i * k * n, n);
      } else {       // (N, K) = dout^T op(a)
        gemm(dct, bd_a(a, s, i, false), n, k, m, 1.0f, db + i * k * n, k);
      }
    }
  });
}

MXReturnValue bd_forward_cpu(const Attrs& attrs, std::vector<MXTensor>* in,
                             std::vector<MXTensor>* out, const OpResource& res) {
  return guarded(kBatchDot, [&] {
    bool ta, tb;
    if (!bd_flags(attrs, &ta, &tb)) return MX_FAIL;
    const BdGeom s = bd_geom((*in)[0], (*in)[1], ta, tb);
    if ((*in)[0].dtype == mxnet::ext::kFloat32) {
      bd_forward<float>((*in)[0].data<float>(), (*in)[1].data<float>(),
                        (*out)[0].data<float>(), s);
    } else {
      bd_forward<bf16_bits>((*in)[0].data<bf16_bits>(), (*in)[1].data<bf16_bits>(),
                            (*out)[0].data<bf16_bits>(), s);
    }
    return MX_SUCCESS;
  });
}

MXReturnValue bd_backward_cpu(const Attrs& attrs, std::vector<MXTensor>* in,
                              std::vector<MXTensor>* out, const OpResource& res) {
  // in: d out, a, b, out;  out: d a, d b
  return guarded(kBatchDot, [&] {
    bool ta, tb;
    if (!bd_flags(attrs, &ta, &tb)) return MX_FAIL;
    const BdGeom s = bd_geom((*in)[1], (*in)[2], ta, tb);
    if ((*in)[0].dtype == mxnet::ext::kFloat32) {
      bd_backward<float>((*in)[0].data<float>(), (*in)[1].data<float>(),
                         (*in)[2].data<float>(), out_ptr<float>(out, 0), out_ptr<float>(out, 1),
                         s);
    } else {
      bd_backward<bf16_bits>((*in)[0].data<bf16_bits>(), (*in)[1].data<bf16_bits>(),
                             (*in)[2].data<bf16_bits>(), out_ptr<bf16_bits>(out, 0),
                             out_ptr<bf16_bits>(out, 1), s);
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

#define MXMP_REGISTER_ATT(NAME, OP)                 \
  REGISTER_OP(NAME)                                 \
      .setParseAttrs(att_parse<OP>)                 \
      .setInferType(att_infer_type<OP>)             \
      .setInferShape(att_infer_shape<OP>)           \
      .setForward(att_forward_cpu<OP>, "cpu")       \
      .setBackward(att_backward_cpu<OP>, "cpu");

MXMP_REGISTER_ATT(mxmp_selfatt_qk, kSelfQK)
MXMP_REGISTER_ATT(mxmp_selfatt_valatt, kSelfValAtt)
MXMP_REGISTER_ATT(mxmp_encdec_qk, kEncQK)
MXMP_REGISTER_ATT(mxmp_encdec_valatt, kEncValAtt)

REGISTER_OP(mxmp_multi_sgd_update)
    .setParseAttrs(sgd_parse)
    .setInferType(sgd_infer_type)
    .setInferShape(sgd_infer_shape)
    .setForward(sgd_forward_cpu, "cpu");

REGISTER_OP(mxmp_gelu)
    .setParseAttrs(gelu_parse)
    .setInferType(gelu_infer_type)
    .setInferShape(gelu_infer_shape)
    .setForward(gelu_forward_cpu, "cpu")
    .setBackward(gelu_backward_cpu, "cpu");

REGISTER_OP(mxmp_batch_dot)
    .setParseAttrs(bd_parse)
    .setInferType(bd_infer_type)
    .setInferShape(bd_infer_shape)
    .setForward(bd_forward_cpu, "cpu")
    .setBackward(bd_backward_cpu, "cpu");

MXReturnValue initialize(int version) {
  if (version < 10900) {
    MX_ERROR_MSG << "mxmp_ops needs MXNet >= 1.9.0, this is " << version;
    return MX_FAIL;
  }
  return MX_SUCCESS;
}
