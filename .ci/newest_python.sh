#!/usr/bin/env bash
# The compiled parts on the newest CPython this machine has (3.13 or later): the fast path reads
# weak references and type slots through C API calls that changed in 3.13, so it is built and its
# suites (compiled calls, plans, lifetimes, executors) run there too. The whole suite on 3.10, 3.12
# and 3.13 is run by hand (pip install ".[test]" && pytest in a venv of each); this stage keeps the
# newest one from breaking unseen. A machine without such a Python says so and passes.
set -euo pipefail
cd "$(dirname "$0")/.."

newest=""
for cand in python3.14 python3.13 "$HOME"/.pyenv/versions/3.14*/bin/python3 "$HOME"/.pyenv/versions/3.13*/bin/python3; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys, venv; assert sys.version_info >= (3, 13)' 2>/dev/null; then
    newest=$(command -v "$cand")
    break
  fi
done
if [ -z "$newest" ]; then
  echo "skipped: no CPython >= 3.13 on this machine"
  exit 0
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
unset ACLNN_PY_BUILD_DIR ACLNN_PY_MOCK_ROOT ACLNN_PY_BACKEND PYTHONPATH
"$newest" -m venv "$WORK/venv"
# shellcheck disable=SC1091
. "$WORK/venv/bin/activate"
echo "== $(python -c 'import sys; print(sys.version.split()[0])'): pip install \".[test]\""
python -m pip install -q --upgrade pip
pip install -q ".[test]"
pytest -q -p no:cacheprovider tests/ops/test_plan_calls.py tests/ops/test_plans.py tests/test_lifetimes.py tests/ops/test_executor.py
