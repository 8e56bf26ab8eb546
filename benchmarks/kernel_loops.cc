// The loops of mxmp's operator library alone (no MXNet call), best of 60 calls each, at the
// thread count of OMP_NUM_THREADS, at BERT-base batch 8, sequence 128 shapes, float32, forward
// and backward: LayerNorm 1024x768, softmax with lengths 96x128x128 (length 100), Dropout p=0.1
// 1024x3072. Build and run (docs/benchmark.md, "mxmp's operator library, op by op"):
//
//   M=$(python -c "import mxnet, os; print(os.path.dirname(mxnet.__file__))")
//   g++ -O3 -march=native -fopenmp -fno-trapping-math -std=c++17 -I$M/include \
//       benchmarks/kernel_loops.cc $M/src/lib_api.cc -o /tmp/kernel_loops
//   OMP_NUM_THREADS=1 /tmp/kernel_loops; OMP_NUM_THREADS=2 /tmp/kernel_loops
//
// -march=znver3 (or haswell) in place of native builds the AVX2 code on an AVX-512 machine.
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

int main() {
  std::mt19937 gen(0);
  std::normal_distribution<float> normal;
  const int64_t rows = 1024, d = 768, n = 1024 * 3072, srows = 96 * 128, m = 128;
  std::vector<float> x(n), y(n), dy(n), dx(n), gamma(d, 1.0f), beta(d), mean(rows), rstd(rows),
      dgamma(d), dbeta(d);
  std::vector<uint8_t> mask(n);
  for (auto& v : x) v = normal(gen);
  for (auto& v : dy) v = normal(gen);
  const double ln = best_ms([&] {
    ln_forward<float>(x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data(),
                      rows, d, 1e-5);
    ln_backward<float>(dy.data(), x.data(), gamma.data(), mean.data(), rstd.data(), dx.data(),
                       dgamma.data(), dbeta.data(), rows, d);
  });
  const double sm = best_ms([&] {   // softmax_all / softmax_grad_all's loops, length 100
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < srows; ++r) {
      softmax_row<float>(x.data() + r * m, y.data() + r * m, m, 100);
    }
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < srows; ++r) {
      softmax_grad_row<float>(dy.data() + r * m, y.data() + r * m, dx.data() + r * m, m, 100);
    }
  });
  const double dr = best_ms([&] {
    dropout_forward<float>(x.data(), y.data(), mask.data(), n, 429496730u, 1.0f / 0.9f, 1, 2);
    dropout_backward<float>(dy.data(), mask.data(), dx.data(), n, 1.0f / 0.9f);
  });
  std::printf("threads %d: layer_norm %.3f ms, softmax %.3f ms, dropout %.3f ms (%.2f ns per "
              "element)\n", omp_get_max_threads(), ln, sm, dr, dr * 1e6 / n);
  return 0;
}
