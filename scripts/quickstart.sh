#!/usr/bin/env bash
# mxmp quickstart: float32 vs bfloat16 mixed precision on Fashion-MNIST, on a fresh Debian machine.
#
# Run from anywhere (it works in the repo root):  bash scripts/quickstart.sh
#
# 1. creates .venv (python3 -m venv) if missing and installs mxmp with `pip install -e .[cpu,examples]`
# 2. installs Debian's dataset-fashion-mnist with apt-get when the data is missing (as root; otherwise
#    it prints the command and stops)
# 3. writes the data as RecordIO (scripts/prepare_fashion_mnist.py -> data/fashion-mnist)
# 4. trains examples/train_imagenet.py (cifar_wideresnet16_4: GluonCV's wide ResNet at width 4, 28x28)
#    in float32, then in bfloat16 with the same seed and budget (emulated in float32 kernels when
#    the CPU has no bfloat16 kernels)
# 5. prints a side-by-side table of val top-1, training img/s, the speed-up and peak memory
#
# The budget fits a 2-core machine with bfloat16 kernels in about 10 minutes including installs
# (a fresh venv): a few hundred steps on a random subset of the training set, validated on the
# first test images. It shows the speed, and that bfloat16 lands within the run-to-run noise of
# such a short run; the accuracy at convergence is docs/accuracy.md (python -m benchmarks.accuracy).
# Without native kernels (tiers avx512_core and avx2: `mxmp check-kernels`) bfloat16 runs 2-2.7x
# slower than float32 (oneDNN's emulation, or mxmp's), so the script takes longer there (9-10
# minutes on 2 cores); its table says which.
# Override with:
#   QUICKSTART_MODEL          model of examples/train_imagenet.py  (default cifar_wideresnet16_4)
#   QUICKSTART_EPOCHS         epochs per run                       (default 1)
#   QUICKSTART_TRAIN_BATCHES  training batches per epoch (0 = all)  (default 120: 7,680 images,
#                             a random subset of the shuffled training set)
#   QUICKSTART_VAL_BATCHES    validation batches (0 = all 10,000)   (default 40: the first 2,560
#                             test images)
#   QUICKSTART_BATCH_SIZE     batch size                           (default 64)
#   QUICKSTART_SEED           seed of both runs                    (default 0)
#   QUICKSTART_RUNS           output directory                     (default runs/quickstart)
#   FASHION_MNIST_SRC         Debian data directory                (default /usr/share/datasets/fashion-mnist)
#   PYTHON                    interpreter for the venv             (default python3)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
START=$(date +%s)

MODEL=${QUICKSTART_MODEL:-cifar_wideresnet16_4}
EPOCHS=${QUICKSTART_EPOCHS:-1}
TRAIN_BATCHES=${QUICKSTART_TRAIN_BATCHES:-120}
VAL_BATCHES=${QUICKSTART_VAL_BATCHES:-40}
BATCH_SIZE=${QUICKSTART_BATCH_SIZE:-64}
SEED=${QUICKSTART_SEED:-0}
RUNS=${QUICKSTART_RUNS:-runs/quickstart}
SRC=${FASHION_MNIST_SRC:-/usr/share/datasets/fashion-mnist}
PYTHON=${PYTHON:-python3}
DATA=data/fashion-mnist

step() { printf '\n==> %s\n' "$*"; }
is_root() { [ "$(id -u)" = 0 ]; }

# ---- 1. virtualenv and packages
if [ ! -x .venv/bin/python ]; then
    step "creating .venv"
    if ! "$PYTHON" -m venv --help >/dev/null 2>&1 || ! "$PYTHON" -c 'import ensurepip' 2>/dev/null; then
        if is_root; then
            apt-get update -q
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv
        else
            echo "error: $PYTHON cannot create virtualenvs; run: sudo apt-get install python3-venv" >&2
            exit 1
        fi
    fi
    "$PYTHON" -m venv .venv
fi
step "installing mxmp with the cpu and examples extras"
# (the filter drops pip's warnings about unreachable extra index locations on some machines;
# pip's own exit status still counts)
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[cpu,examples]' \
    2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
PY=.venv/bin/python

# The tier (avx512_bf16, avx512_core or avx2) labels the table's bfloat16 column
TIER=$("$PY" -c 'from mxmp._src.cpu_tier import cpu_tier; print(cpu_tier())' 2>/dev/null \
       || echo unknown)

# ---- 2. Fashion-MNIST from Debian (apt-get update + install as root; otherwise print the command
#         and stop): scripts/install_dataset.sh
if [ ! -f "$SRC/train-images-idx3-ubyte.gz" ] || [ ! -f "$SRC/t10k-labels-idx1-ubyte.gz" ]; then
    step "installing dataset-fashion-mnist (Debian)"
    FASHION_MNIST_DIR="$SRC" bash scripts/install_dataset.sh
fi

# ---- 3. RecordIO
step "writing $DATA (RecordIO)"
"$PY" scripts/prepare_fashion_mnist.py --src "$SRC" --out "$DATA"

# ---- 4. float32, then bfloat16, same seed and budget
COMMON=(--model "$MODEL" --input-size 28 --rec-train "$DATA/train.rec"
        --rec-val "$DATA/val.rec" --epochs "$EPOCHS" --batch-size "$BATCH_SIZE"
        --warmup-epochs 0.1 --seed "$SEED" --log-interval 20)
if [ "$TRAIN_BATCHES" != 0 ]; then COMMON+=(--max-train-batches "$TRAIN_BATCHES"); fi
if [ "$VAL_BATCHES" != 0 ]; then COMMON+=(--max-val-batches "$VAL_BATCHES"); fi
for DTYPE in float32 bfloat16; do
    step "training $DTYPE: ${COMMON[*]}"
    "$PY" examples/train_imagenet.py "${COMMON[@]}" --dtype "$DTYPE" --save-dir "$RUNS/$DTYPE"
done

# ---- 5. side by side
step "float32 vs bfloat16 (summaries in $RUNS/*/summary.json)"
"$PY" - "$RUNS/float32/summary.json" "$RUNS/bfloat16/summary.json" "$TIER" <<'EOF'
import json, sys
fp32, bf16 = runs = [json.load(open(path)) for path in sys.argv[1:3]]
tier = sys.argv[3]   # avx512_core: oneDNN runs bfloat16, but by emulation (no bfloat16 instructions)
onednn_emulated = not bf16['emulate'] and tier == 'avx512_core'
names = ['float32', 'bfloat16 (%s)' % ('emulated' if bf16['emulate'] else
                                       "oneDNN-emulated" if onednn_emulated else 'real kernels')]
rows = [('val top-1 (%)', lambda r: '%.2f' % (100 * r['final_val_top1'])),
        ('train loss (last epoch)', lambda r: '%.4f' % r['final_train_loss']),
        ('training img/s', lambda r: '%.1f' % r['img_per_sec']),
        ('training speed vs float32', lambda r: '%.2fx' % (r['img_per_sec'] / fp32['img_per_sec'])),
        ('peak RSS (MiB)', lambda r: '%.0f' % r['peak_rss_mib']),
        ('skipped steps', lambda r: '%d' % r['skipped_steps'])]
width = max(len(label) for label, _ in rows) + 2
col = max(26, max(len(n) for n in names) + 2)
print('%-*s' % (width, '') + ''.join('%*s' % (col, n) for n in names))
for label, cell in rows:
    print('%-*s' % (width, label) + ''.join('%*s' % (col, cell(r)) for r in runs))
args = fp32['args']
print('\n%s, %d epoch(s) x %d training images, batch %d, %d test images, seed %d; '
      'bfloat16 - float32 val top-1: %+.2f points'
      % (fp32['model'], args['epochs'], fp32['epochs'][0]['images'], args['batch_size'],
         args['num_val'], args['seed'],
         100 * (bf16['final_val_top1'] - fp32['final_val_top1'])))
if bf16['emulate']:
    print('bfloat16 ran EMULATED (no bfloat16 kernels on this CPU): this table measures its '
          'accuracy, not its speed.')
elif onednn_emulated:
    print('bfloat16 ran on oneDNN kernels that EMULATE it (tier avx512_core: AVX-512 without '
          'bfloat16 instructions), slower than float32: this table measures its accuracy, not '
          'the speed of CPUs with avx512_bf16 or AMX.')
print('Why a wide ResNet: 16-bit pays where layers are compute-bound; layers of 16-64 channels '
      '(cifar_resnet20_v1: 1.13x) spend their time in memory-bound work (BatchNorm, ReLU, casts, '
      'the update) that 16-bit does not speed up.')
print('A few hundred steps: top-1 differs run to run by about a point, in either direction; '
      'the accuracy at convergence is docs/accuracy.md.')
EOF
echo
echo "quickstart finished in $(( $(date +%s) - START )) s"
