#!/usr/bin/env bash
# Install Debian's Fashion-MNIST (dataset-fashion-mnist) when it is missing.
# As root it runs apt-get; otherwise it prints the command and fails.
set -euo pipefail
DATA_DIR=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
if [ -f "$DATA_DIR/train-images-idx3-ubyte.gz" ] && [ -f "$DATA_DIR/t10k-labels-idx1-ubyte.gz" ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "Fashion-MNIST is missing at $DATA_DIR. Install it with:" >&2
  echo "  sudo apt-get update && sudo apt-get install -y dataset-fashion-mnist" >&2
  exit 1
fi
echo "== installing dataset-fashion-mnist with apt-get"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null
test -f "$DATA_DIR/train-images-idx3-ubyte.gz"
