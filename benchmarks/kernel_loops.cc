// The loops of mxmp's operator library alone (no MXNet call), best of 60 calls each, at the
// thread count of OMP_NUM_THREADS, at BERT-base batch 8, sequence 128 shapes, forward and
// backward separately, float32 and bfloat16 (bfloat16 data; LayerNorm's gamma and beta float32,
// as mxmp's default master parameters): LayerNorm 1024x768, softmax with lengths 96x128x128
// (lengths 64 to 128), Dropout p=0.1 1024x3072. Build and run (docs/benchmark.md, "mxmp's
// operator library, op by op"):
//
//   M=$(python -c "import mxnet, os; print(os.path.dirname(mxnet.__file__))")
//   D=$(mktemp -d); python -c "import sys; from mxmp._src.kernels.lib_api_patch import \
//       patch_lib_api; patch_lib_api(sys.argv[1], sys.argv[2])" $M $D
//   g++ -O3 -march=native -fopenmp -fno-trapping-math -std=c++17 -I$D/include -I$M/include \
//       benchmarks/kernel_loops.cc $D/src/lib_api.cc -o /tmp/kernel_loops
//   OMP_NUM_THREADS=1 /tmp/kernel_loops; OMP_NUM_THREADS=2 /tmp/kernel_loops
//
// -march=znver3 (or -mavx2 -mfma) in place of native builds the AVX2 code on an AVX-512
// machine.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "../mxmp/_src/kernels/mxmp_ops.cc"

template <typename F>
double best_ms(F f, int reps = 60) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const std::chrono::duration<double, std::milli> t = std::chrono::steady_clock::now() - t0;
    best = std::min(best, t.count());
  }
  return best;
}

template <typename T>
std::vector<T> make(int64_t n, std::mt19937* gen, float lo = 0) {
  std::normal_distribution<float> normal;
  std::vector<T> v(n);
  for (auto& e : v) e = Num<T>::store(lo != 0 ? lo : normal(*gen));
  return v;
}

template <typename T>
void run(const char* name, mxnet::ext::MXDType dtype) {
  std::mt19937 gen(0);
  const int64_t rows = 1024, d = 768, n = 1024 * 3072, srows = 96 * 128, m = 128;
  auto x = make<T>(n, &gen), dy = make<T>(n, &gen), y = make<T>(n, &gen), dx = make<T>(n, &gen);
  std::vector<float> gamma(d, 1.0f), beta(d), mean(rows), rstd(rows), dgamma(d), dbeta(d);
  std::vector<int32_t> len(srows);
  for (auto& v : len) v = 64 + gen() % 65;
  const double lnf = best_ms([&] {
    ln_forward<T, float, float>(x.data(), gamma.data(), beta.data(), y.data(), mean.data(),
                                rstd.data(), rows, d, 1e-5);
  });
  const double lnb = best_ms([&] {
    ln_backward<T, float, float>(dy.data(), x.data(), gamma.data(), mean.data(), rstd.data(),
                                 dx.data(), dgamma.data(), dbeta.data(), rows, d);
  });
  const mxnet::ext::MXContext cpu = mxnet::ext::MXContext::CPU();
  MXTensor sx(x.data(), {96, 128, 128}, dtype, 0, cpu), sy(y.data(), {96, 128, 128}, dtype, 0, cpu);
  MXTensor sdy(dy.data(), {96, 128, 128}, dtype, 0, cpu);
  MXTensor sl(len.data(), {96, 128}, mxnet::ext::kInt32, 0, cpu);
  const double smf = best_ms([&] { softmax_all<T>(sx, &sl, y.data()); });
  std::vector<MXTensor> sin{sdy, sx, sl, sy};
  const double smb = best_ms([&] { softmax_grad_all<T>(&sin, dx.data(), true); });
  const double drf = best_ms([&] {
    dropout_apply<T>(x.data(), y.data(), n, 429496730u, 1.0f / 0.9f, 1, 2);
  });
  const double drb = best_ms([&] {   // the backward: the same loop on dy, the same seeds
    dropout_apply<T>(dy.data(), dx.data(), n, 429496730u, 1.0f / 0.9f, 1, 2);
  });
  std::printf("%-8s threads %d  layer_norm %.3f + %.3f ms  softmax %.3f + %.3f ms  "
              "dropout %.3f + %.3f ms (forward + backward)\n", name, omp_get_max_threads(),
              lnf, lnb, smf, smb, drf, drb);
}

// The machine's streaming bandwidth at this thread count, for comparison with the loops above:
// y = 1.1 x over float32 arrays of 12 MiB each (Dropout's data: inside a 32 MiB L3) and of
// 256 MiB each (from memory), best of the calls, bytes read + written per second.
void stream() {
  for (const int64_t n : {int64_t{1024} * 3072, int64_t{64} << 20}) {
    std::vector<float> x(n, 1.0f), y(n);
    const double ms = best_ms([&] {
      float* yp = y.data();
      const float* xp = x.data();
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < n; ++i) yp[i] = 1.1f * xp[i];
    }, n > (int64_t{1} << 24) ? 10 : 60);
    std::printf("stream   threads %d  %4lld MiB -> %4lld MiB: %.3f ms, %.1f GB/s\n",
                omp_get_max_threads(), static_cast<long long>(n >> 18),
                static_cast<long long>(n >> 18), ms, 8.0 * n / ms / 1e6);
  }
}

int main() {
  stream();
  run<float>("float32", mxnet::ext::kFloat32);
  run<bf16>("bfloat16", mxnet::ext::kBfloat16);
  return 0;
}
