#!/usr/bin/env bash
# Stress: the fault, HCCL and concurrency suites (and the interrupt tests) run ACLNN_STRESS_ROUNDS
# times (default 5) back to back while a background process keeps forming mock worlds of threads and
# of processes, as other jobs on a shared CI machine do. Any test failure, or a failure of the
# background worlds, fails the run. Runs against whatever aclnn_py the active Python imports (the
# installed package in CI; ACLNN_PY_BUILD_DIR + PYTHONPATH for a build tree).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
ROUNDS=${ACLNN_STRESS_ROUNDS:-5}
SUITES=(tests/mock/test_faults.py tests/test_hccl.py tests/mock/test_hccl_c.py tests/test_concurrency.py tests/runtime/test_interrupt.py)

t0=$(date +%s)
"$PY" tests/helpers/world_churn.py &
churn=$!
cleanup() { kill "$churn" 2>/dev/null || true; wait "$churn" 2>/dev/null || true; }
trap cleanup EXIT

for i in $(seq 1 "$ROUNDS"); do
  echo "=== stress round $i of $ROUNDS ($(( $(date +%s) - t0 )) s)"
  "$PY" -m pytest -x -q -p no:cacheprovider "${SUITES[@]}"
done

if ! kill -0 "$churn" 2>/dev/null; then
  wait "$churn" && rc=0 || rc=$?
  echo "stress: the background worlds stopped early (exit code $rc)"
  exit 1
fi
kill -TERM "$churn"
wait "$churn"
trap - EXIT
echo "stress: $ROUNDS rounds in $(( $(date +%s) - t0 )) s"
