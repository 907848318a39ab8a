#!/usr/bin/env bash
# A copy of the installed mock root is a CANN root like any other: copy it to a temporary directory,
# then check that `aclnn-py doctor` loads it as kind "cann" with the ABI verified against its own
# headers and its version read from its version file, and that `aclnn-py demo` on it reports MATCH.
# Uses the aclnn_py the active Python imports (the installed wheel in CI); run from anywhere.
set -euo pipefail

PY=${PYTHON:-python}
if command -v aclnn-py >/dev/null 2>&1; then CLI=(aclnn-py); else CLI=("$PY" -m aclnn_py); fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
src=$("$PY" -c 'import aclnn_py; print(aclnn_py.mock_root())')
cp -r "$src" "$tmp/cann"
root="$tmp/cann"
echo "== mock root $src copied to $root"

echo "== aclnn-py doctor --backend $root --json --strict"
"${CLI[@]}" doctor --backend "$root" --json --strict > "$tmp/doctor.json"
"$PY" - "$tmp/doctor.json" "$root" <<'PYEOF'
import json
import sys

doc = json.load(open(sys.argv[1]))
root = sys.argv[2]
assert doc["backend"]["loaded"] and doc["backend"]["kind"] == "cann", doc["backend"]
assert doc["backend"]["root"] == root, doc["backend"]
assert doc["abi"]["status"] == "verified", doc["abi"]["summary"]
assert all(h.startswith(root) for h in doc["abi"]["headers"]), doc["abi"]["headers"]
assert doc["cann_version"]["version"] != "unknown", doc["cann_version"]
assert doc["exit_code"] == 0 and not doc["problems"], doc["problems"]
print(f"doctor: kind cann, {doc['abi']['summary']}, CANN {doc['cann_version']['version']}")
PYEOF

echo "== aclnn-py demo --backend $root --json"
"${CLI[@]}" demo --backend "$root" --world-size 4 --quant-mode 2 --rounds 2 --json > "$tmp/demo.json"
"$PY" - "$tmp/demo.json" <<'PYEOF'
import json
import sys

doc = json.load(open(sys.argv[1]))
assert doc["result"] == "MATCH", doc.get("mismatches") or doc.get("error")
print(f"demo: {doc['title']}: {doc['result']} ({len(doc['checks'])} outputs checked)")
PYEOF
echo "== OK"
