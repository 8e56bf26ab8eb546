#!/usr/bin/env bash
# Install the Debian data packages the examples, studies and tests read, when missing:
#   dataset-fashion-mnist  Fashion-MNIST (benchmarks/accuracy.py, examples/train_imagenet.py)
#   bible-kjv              the King James Bible, printed by `bible gen1:1-rev22:21`
#                          (benchmarks/accuracy_transformer.py, benchmarks/gpt.py)
# As root it runs apt-get; otherwise it prints the command and fails.
set -euo pipefail
DATA_DIR=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
missing=()
if [ ! -f "$DATA_DIR/train-images-idx3-ubyte.gz" ] || [ ! -f "$DATA_DIR/t10k-labels-idx1-ubyte.gz" ]; then
  missing+=(dataset-fashion-mnist)
fi
if ! command -v bible >/dev/null 2>&1; then
  missing+=(bible-kjv)
fi
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "missing Debian data package(s): ${missing[*]}. Install with:" >&2
  echo "  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "== installing ${missing[*]} with apt-get"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
test -f "$DATA_DIR/train-images-idx3-ubyte.gz"
command -v bible >/dev/null
