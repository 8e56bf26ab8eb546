#!/usr/bin/env bash
# Set up everything the tests need on a fresh Debian machine, then run them.
#   bash scripts/test.sh                 # the whole suite, slow real-data checks included
#   bash scripts/test.sh -m "not slow"   # extra arguments go to pytest
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

bash scripts/install_dataset.sh

echo "== pytest"
exec python -m pytest -ra --durations=15 "$@"
