#!/usr/bin/env bash
# Set up everything the tests need on a fresh Debian machine, then run them.
#   bash scripts/test.sh                 # the whole suite, slow real-data checks included
#   bash scripts/test.sh -m "not slow"   # extra arguments go to pytest
# On a CPU with oneDNN's bfloat16 kernels (avx512_bf16/AMX) the suite takes the real-kernel path
# and its `real_kernels` tests run; then, when no arguments were given, the tests whose path
# depends on the kernels run a second time with oneDNN capped to AVX2 (DNNL_MAX_CPU_ISA=AVX2,
# read when MXNet loads), so the emulated path is tested on the same machine.
#   MXMP_TEST_EMULATED=0 bash scripts/test.sh   # skip that second run
#   MXMP_TEST_EMULATED=1 bash scripts/test.sh   # run it even with arguments or without kernels
# Horovod 0.28.1 is built into .venv once (about 2 minutes on 2 cores, more on a loaded
# machine); tests/distributed/test_horovod.py then runs it under horovodrun, and fails if the
# build failed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv"
  "$PYTHON" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
echo "== installing mxmp with the cpu, test and examples extras"
pip install --quiet --disable-pip-version-check -e '.[cpu,test,examples]' 2>&1 \
  | grep -v "is ignored: it is neither a file nor a directory" || true
python -c "import mxnet, gluoncv, pytest, hypothesis; print('mxnet', mxnet.__version__)"
# The bert extra (gluonnlp 0.10.0) compiles a Cython extension (a C compiler and the Python
# headers); where it cannot, the BERT benchmark tests skip and the rest of the suite runs.
echo "== installing the bert extra (gluonnlp)"
pip install --quiet --disable-pip-version-check -e '.[bert]' 2>&1 \
  | grep -v "is ignored: it is neither a file nor a directory" || true
python -c "import gluonnlp" 2>/dev/null \
  || echo "== gluonnlp did not install (needs gcc and python3-dev): the BERT benchmark tests skip"

# Horovod for tests/distributed/test_horovod.py: built from source against the mxnet just
# installed (CMake + a C++ compiler; docs/distributed.md). Where it does not build, the tail of
# its log says why, and MXMP_REQUIRE_HOROVOD=1 makes that file's tests fail instead of skip.
export MXMP_REQUIRE_HOROVOD=1
hvd_check='import horovod, horovod.mxnet as hvd
print("== horovod.mxnet", horovod.__version__, "imports; Gloo built:", hvd.gloo_built())'
if python -c "$hvd_check" 2>/dev/null; then
  echo "== (already built)"
else
  echo "== building Horovod 0.28.1 (MXNet, Gloo) against mxnet; log in .venv/horovod-build.log"
  hvd_start=$SECONDS
  hvd_log=.venv/horovod-build.log
  hvd_reinstall=()   # a Horovod that is installed but does not import is rebuilt
  if pip show horovod >/dev/null 2>&1; then hvd_reinstall=(--force-reinstall --no-deps); fi
  if pip install --disable-pip-version-check "cmake<4" setuptools wheel psutil cloudpickle pyyaml \
        packaging >"$hvd_log" 2>&1 \
     && HOROVOD_WITH_MXNET=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITH_GLOO=1 \
        HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 \
        pip install --disable-pip-version-check --no-build-isolation --no-cache-dir -v \
        "${hvd_reinstall[@]}" horovod==0.28.1 >>"$hvd_log" 2>&1 \
     && python -c "$hvd_check" >>"$hvd_log" 2>&1; then
    echo "== Horovod built in $((SECONDS - hvd_start)) s"; tail -n 1 "$hvd_log"
  else
    echo "== Horovod did NOT build ($((SECONDS - hvd_start)) s); the first errors in $hvd_log:"
    grep -i -m 6 -A 8 -E "cmake error|fatal error|error:|no module named" "$hvd_log" || true
    echo "== ... and its last lines:"
    tail -n 12 "$hvd_log"
    echo "== so tests/distributed/test_horovod.py fails (MXMP_REQUIRE_HOROVOD=1)"
  fi
fi

# Sockeye 2.3 (an MXNet NMT toolkit whose --amp flag uses contrib.amp's API) for
# tests/amp/test_sockeye.py. It pins mxnet==1.8.0.post0, so it goes in without its
# dependencies (it runs on 1.9.1): ~3 s. Without it those tests skip.
pip install --quiet --disable-pip-version-check --no-deps sockeye==2.3.24 sacrebleu==1.4.14 \
  portalocker==2.10.1 || echo "== sockeye did not install: tests/amp/test_sockeye.py skips"

bash scripts/install_dataset.sh

# the tests that take emulate (or skip) from mxmp.lp_kernels_available
EMULATED_PATH_TESTS=(tests/graph/test_pass.py tests/gluon/test_convert.py tests/training/test_module.py tests/amp/test_amp.py
                     tests/gluon/test_onednn_layout.py tests/device/test_device.py tests/training/test_nonfinite.py
                     tests/cli/test_cli.py tests/test_bad_inputs.py tests/gluon/test_gluoncv_models.py
                     tests/amp/test_accumulate.py tests/amp/test_encoder_decoder.py tests/amp/test_bert_finetune.py
                     tests/amp/test_sockeye.py tests/kernels/test_dropout_in_training.py tests/gluon/test_freeze.py
                     tests/gluon/test_lp_params.py tests/gluon/test_checkpoint_files.py tests/gluon/test_fused_inference.py
                     tests/test_plain_mxnet.py tests/graph/test_stem.py
                     tests/graph/test_existing_casts.py tests/graph/test_moved_params.py
                     tests/conformance/test_conformance.py tests/kernels/test_artefacts.py
                     tests/kernels/test_bfloat16_library_ops.py tests/graph/test_residual_rule.py
                     tests/kernels/test_gelu_kernel.py tests/graph/test_concat_rule.py
                     tests/test_benchmark_backward_kept.py tests/graph/test_grad_order.py
                     tests/device/test_malloc_tuning.py)

echo "== pytest"
status=0
python -m pytest -ra --durations=15 "$@" || status=$?

emulated=${MXMP_TEST_EMULATED:-auto}
if [ "$emulated" = auto ]; then
  emulated=0
  if [ $# -eq 0 ] && python -c "import sys, mxmp
sys.exit(0 if mxmp.lp_kernels_available('bfloat16') else 1)" 2>/dev/null; then
    emulated=1
  fi
fi
if [ "$emulated" = 1 ]; then
  echo "== pytest, emulated path: oneDNN capped with DNNL_MAX_CPU_ISA=AVX2"
  DNNL_MAX_CPU_ISA=AVX2 python -m pytest -ra -m "not slow" "${EMULATED_PATH_TESTS[@]}" \
    || status=$?
fi
exit $status
