#!/usr/bin/env bash
# Lint and type-check: ruff (rules in pyproject.toml [tool.ruff]) and mypy (pyproject.toml [tool.mypy]:
# the public modules with --strict's flags). Installs pinned versions into the active environment
# (the CI venv); run from anywhere. Exit code non-zero on any finding.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python}
"$PY" -m pip install -q "ruff==0.17.6" "mypy==2.4.1" "numpy>=1.24" "ml_dtypes>=0.4"

echo "== ruff"
"$PY" -m ruff check --output-format concise aclnn_py benchmarks tests examples build_ffi.py build_abi.py
echo "== mypy"
"$PY" -m mypy
echo "== docs/api.md up to date"
"$PY" docs/gen_api.py --check
