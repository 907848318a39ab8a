#!/usr/bin/env bash
# Packaging check: `pip wheel . -w dist` builds the wheel; it is installed into a fresh venv and
# smoke-tested from outside the source tree (import, version, `aclnn-py doctor --strict`, a 2-rank
# thread round checked against the golden, the C client built against the installed mock root);
# the sdist is built and checked to hold everything the build needs; the wheel is checked to hold no
# benchmark (they run from a checkout: python -m benchmarks).
# Needs python3 (>= 3.10) with venv, a C/C++ compiler, CMake; network access for pip.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

PY=${PYTHON:-python3}
WORK=${ACLNN_WHEEL_WORK:-$(mktemp -d /tmp/aclnn-py-wheel.XXXXXX)}
[ -n "${ACLNN_WHEEL_KEEP:-}" ] || trap 'rm -rf "$WORK"' EXIT   # ACLNN_WHEEL_KEEP=1 keeps the venvs
unset ACLNN_PY_BUILD_DIR ACLNN_PY_MOCK_ROOT ACLNN_PY_BACKEND PYTHONPATH ASCEND_HOME_PATH
start=$(date +%s)
VERSION=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' aclnn_py/_version.py)
[ -n "$VERSION" ] || { echo "no __version__ in aclnn_py/_version.py"; exit 1; }

echo "== build tools venv"
"$PY" -m venv "$WORK/tools"
"$WORK/tools/bin/python" -m pip install -q --upgrade pip build

echo "== pip wheel . -w dist"
rm -rf dist/aclnn_py-*.whl
"$WORK/tools/bin/python" -m pip wheel . -w dist --no-deps -q
WHEEL=$(ls dist/aclnn_py-"$VERSION"-*.whl)
echo "built $WHEEL"
"$WORK/tools/bin/python" - "$WHEEL" <<'EOF'
import sys
import zipfile

names = zipfile.ZipFile(sys.argv[1]).namelist()
shipped = [n for n in names if n.split("/")[0] == "benchmarks" or n.startswith("aclnn_py/bench/")
           or "aclnnpy_floor" in n or "c_floor" in n]
assert not shipped, f"the wheel contains benchmark files (they run from a checkout): {shipped}"
# the header parser runs at build time only: nothing shipped imports pycparser
wheel = zipfile.ZipFile(sys.argv[1])
parsing = [n for n in names if n.endswith(".py") and b"pycparser" in wheel.read(n)]
assert not parsing and "build_abi.py" not in names, f"the wheel ships the build-time header parser: {parsing}"
print(f"wheel ok ({len(names)} files, no benchmark package, no C floor library, no header parser)")
EOF

echo "== sdist"
rm -f dist/aclnn_py-*.tar.gz
"$WORK/tools/bin/python" -m build --sdist --outdir dist . >/dev/null
SDIST=$(ls dist/aclnn_py-"$VERSION".tar.gz)
tar -tzf "$SDIST" > "$WORK/sdist.txt"
for need in pyproject.toml CMakeLists.txt build_ffi.py build_abi.py csrc/aclnnpy.h csrc/_core.pyx csrc/_core.pxd csrc/core/launch.pxi README.md CHANGELOG.md \
            include/acl/acl_rt.h include/aclnn/acl_meta.h include/hccl/hccl_kfc.h \
            include/aclnnop/aclnn_moe_distribute_dispatch_v5.h mock/CMakeLists.txt mock/ops/dispatch_v5.cpp \
            mock/python/mock_module.cpp aclnn_py/__init__.py aclnn_py/py.typed aclnn_py/_aclnn.pyi aclnn_py/_core.pyi aclnn_py/ops/executor.py \
            examples/c_client/moe_round.c examples/cpp_embed/server.cpp docs/quickstart.md tests/conftest.py \
            benchmarks/__main__.py benchmarks/c_floor.c benchmarks/c_floor.py; do
  grep -qx "aclnn_py-$VERSION/$need" "$WORK/sdist.txt" || { echo "sdist is missing $need"; exit 1; }
done
if grep -E "^aclnn_py-${VERSION//./\\.}/(build|dist)/|\\.so\$" "$WORK/sdist.txt"; then
  echo "sdist contains build products"; exit 1
fi
echo "sdist ok ($(wc -l < "$WORK/sdist.txt") entries)"

echo "== fresh venv: install the wheel"
"$PY" -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install -q --upgrade pip
"$WORK/venv/bin/python" -m pip install -q "$WHEEL"

echo "== smoke test (from $WORK, not the source tree)"
cd "$WORK"
"$WORK/venv/bin/python" - "$VERSION" <<'EOF'
import pathlib
import sys
import aclnn_py as acl
assert acl.__version__ == sys.argv[1], (acl.__version__, sys.argv[1])
pkg = pathlib.Path(acl.__file__).parent
assert "site-packages" in str(pkg), f"imported the source tree: {pkg}"
assert (pkg / "py.typed").exists()
b = acl.init("mock")
assert b.kind == "mock" and not b.missing, b.missing
print("import ok:", pkg, "mock root:", acl.mock_root())
EOF
"$WORK/venv/bin/aclnn-py" doctor --strict
"$WORK/venv/bin/aclnn-py" demo --threads --world-size 2

echo "== the C client against the installed mock root"
ROOT=$("$WORK/venv/bin/python" -c "import aclnn_py; print(aclnn_py.mock_root())")
GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
ASCEND_HOME_PATH=$ROOT cmake -S "$REPO/examples/c_client" -B "$WORK/c_client" "${GEN[@]}" >/dev/null
cmake --build "$WORK/c_client" >/dev/null
mkdir -p "$WORK/c_out"
LD_LIBRARY_PATH=$ROOT/lib64 "$WORK/c_client/moe_round" "$WORK/c_out" 2

echo "wheel check passed in $(( $(date +%s) - start )) s"
