#!/usr/bin/env bash
# Runs the C tests, the ABI fuzzer, the misuse/fault/concurrency tests, the dispatch/combine suites
# and the plans (the compiled core) against a mock and binding built with AddressSanitizer +
# UndefinedBehaviorSanitizer
# (docs/reliability.md, "Sanitizers"). Any sanitizer report fails the run.
#
#   .ci/sanitize.sh                 # build into build/sanitize, run everything (~8 min on 2 cores)
#   SANITIZE_BUILD_DIR=... SANITIZE_FUZZ_EXAMPLES=... SANITIZE_SUITES="tests/x.py ..." .ci/sanitize.sh
#
# How it works: the mock libraries are built with -fsanitize=address,undefined; the interpreter is
# not, so the ASan runtime is LD_PRELOADed into every Python process (rank processes of process
# worlds inherit it). Compilers and cmake started by the C tests must not run with that preload
# (their own leaks would be reported), so they are reached through wrappers that drop it. Leak
# checking stays on; the only suppressions are for the interpreter, numpy and cffi
# (.ci/lsan.supp, each one explained there).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

BUILD=${SANITIZE_BUILD_DIR:-$REPO/build/sanitize}
PY=$(python3 -c 'import sys; print(sys.executable)')   # the real interpreter, not a shell shim
JOBS=${SANITIZE_JOBS:-2}
FUZZ_EXAMPLES=${SANITIZE_FUZZ_EXAMPLES:-5000}
SUITES=${SANITIZE_SUITES:-"tests/mock/test_c_runtime.py tests/mock/test_hccl_c.py tests/mock/test_fuzz_abi.py tests/mock/test_misuse.py tests/mock/test_faults.py tests/mock/test_stream_runners.py tests/test_concurrency.py tests/ops/test_dispatch.py tests/ops/test_combine.py tests/ops/test_plans.py tests/ops/test_plan_calls.py tests/ops/test_call_layout.py tests/test_buffer_results.py"}

# the build needs pybind11 and Cython (build requirements of the package, so not always in the environment)
"$PY" -c "import pybind11" 2>/dev/null || "$PY" -m pip install -q "pybind11>=2.12"
"$PY" -c "import Cython" 2>/dev/null || "$PY" -m pip install -q "cython>=3.0,<4"

GEN=()
command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
echo "== building the mock with ASan + UBSan into $BUILD"
cmake -S "$REPO" -B "$BUILD" "${GEN[@]}" -DACLNN_MOCK_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE= \
  -Dpybind11_DIR="$("$PY" -m pybind11 --cmakedir)" -DPython_EXECUTABLE="$PY" >/dev/null
cmake --build "$BUILD" -j"$JOBS"

ASAN_LIB=$(gcc -print-file-name=libasan.so)
UBSAN_LIB=$(gcc -print-file-name=libubsan.so)
[ -f "$ASAN_LIB" ] || { echo "libasan not found ($ASAN_LIB)"; exit 2; }

# wrappers that start build tools without the ASan preload
WRAP="$BUILD/nopreload"
mkdir -p "$WRAP"
for tool in cc gcc c++ g++ cmake ninja make ld git ldconfig uname; do
  real=$(command -v "$tool" || true)
  [ -n "$real" ] || continue
  printf '#!/bin/sh\nunset LD_PRELOAD\nexec %s "$@"\n' "$real" >"$WRAP/$tool"
  chmod +x "$WRAP/$tool"
done

REPORTS="$BUILD/reports"
rm -rf "$REPORTS"
mkdir -p "$REPORTS"

export ACLNN_PY_BUILD_DIR="$BUILD/aclnn_py"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export ACLNN_FUZZ_EXAMPLES="$FUZZ_EXAMPLES"
# Every report goes to $REPORTS/<tool>.<pid> as well as stderr, so a report in a child process
# (a rank process, a C test binary) is seen even when that process's output is captured.
# malloc_context_size=2: allocation stacks name the allocating function only, which is what the
# suppressions match (see .ci/lsan.supp); SANITIZE_MALLOC_CONTEXT=30 gives deeper stacks for
# debugging a report (the suppressions may then also hide mock leaks called from Python).
# intercept_tls_get_addr=0: GCC's runtime (up to GCC 13) takes a dynamic TLS block whose address
# happens to be sizeof(glibc 2.19's TLS header) past a page boundary for such a header and reads a
# bogus range from before it; LeakSanitizer's exit-time scan then dies in its own tracer ("Tracer
# caught signal 11") without checking anything. Not intercepting __tls_get_addr avoids that; the
# cost is that dynamic TLS blocks are not scanned as roots.
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=0:intercept_tls_get_addr=0:malloc_context_size=${SANITIZE_MALLOC_CONTEXT:-2}:log_path=$REPORTS/asan"
export LSAN_OPTIONS="suppressions=$REPO/.ci/lsan.supp:print_suppressions=0"
# UBSan ignores log_path when it shares the process with ASan here: its reports go to stderr, which
# is kept in $BUILD/output.log and searched below (a report also stops the process).
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"

rm -rf "$REPORTS"; mkdir -p "$REPORTS"
echo "== running under the sanitizers: $SUITES"
start=$(date +%s)
set +e
# shellcheck disable=SC2086
PATH="$WRAP:$PATH" LD_PRELOAD="$ASAN_LIB $UBSAN_LIB" \
  "$PY" -m pytest -q -p no:cacheprovider $SUITES "$@" 2>&1 | tee "$BUILD/output.log"
rc=${PIPESTATUS[0]}
set -e
echo "== pytest exit status $rc after $(( $(date +%s) - start )) s"

if grep -qE "runtime error:|ERROR: (Address|Leak|UndefinedBehavior)Sanitizer" "$BUILD/output.log"; then
  echo "== sanitizer report in the output:"
  grep -nE -A20 "runtime error:|ERROR: (Address|Leak|UndefinedBehavior)Sanitizer" "$BUILD/output.log" | head -80
  exit 1
fi
if compgen -G "$REPORTS/*" >/dev/null; then
  echo "== sanitizer reports:"
  for f in "$REPORTS"/*; do echo "---- $f"; head -60 "$f"; done
  exit 1
fi
echo "== no sanitizer report"
exit "$rc"
