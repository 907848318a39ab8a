"""`aclnn-py doctor`: which aclnn_py was imported and where its compiled parts came from, which
backend was loaded from which root, libraries and symbols, the SoC and device count, the CANN version
the install's version files state, and whether the installed headers declare the bound functions
exactly as aclnn-py was compiled (the ABI guard).

The same facts are available as one JSON document (``--json``) for tools.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .cli_conventions import UsageError

ENV_VARS = (
    "ACLNN_PY_BACKEND", "ACLNN_PY_MOCK_ROOT", "ACLNN_PY_BUILD_DIR", "ACLNN_PY_SKIP_ABI_CHECK", "ACLNN_PY_ABI_CHECK",
    "ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "ASCEND_OPP_PATH", "ASCEND_CUSTOM_OPP_PATH", "ACLNN_MOCK_SOC",
    "ACLNN_MOCK_CANN_VERSION", "ACLNN_MOCK_DEVICE_COUNT", "ACLNN_MOCK_POISON", "ACLNN_PY_POOL", "HCCL_BUFFSIZE",
    "HCCL_CONNECT_TIMEOUT", "HCCL_EXEC_TIMEOUT",
)
GROUPS = ("runtime", "meta", "hccl", "ops")

DESCRIPTION = """\
What is loaded from where: the aclnn_py package and its compiled parts, the backend (mock or a CANN
root), its libraries and symbols, the SoC and device count, the CANN version its version files state,
and the ABI guard's result (verified against the installed headers / unverified / mismatch)."""
EXIT_OK, EXIT_PROBLEM, EXIT_USAGE = 0, 1, 2
EXIT_CODES = """exit status:
  0  the backend loads, its runtime answers and the ABI guard found no difference
  1  a problem: the backend does not load (not found, a library fails, the installed headers
     declare a bound function differently), a runtime query fails; with --strict also any
     missing symbol or an ABI that is not fully verified
  2  a usage error (bad arguments)"""


# ---- the CANN version, from the install's version files ----------------------------------------------
@dataclass(frozen=True)
class CannVersion:
    """What an install's version files say. ``version`` is "unknown" when none was found."""

    version: str = "unknown"
    source: str | None = None            # the file the version came from
    package: str | None = None           # package_name= of an *_install.info
    components: dict[str, str] = field(default_factory=dict)  # other versions found (ops package, runtime)

    def describe(self) -> str:
        if self.source is None:
            return "unknown (no version file: <arch>-linux/ascend_toolkit_install.info, version.cfg, runtime/version.info)"
        what = f"{self.package}, " if self.package else ""
        extra = "".join(f"; {k} {v}" for k, v in self.components.items())
        return f"{self.version} ({what}from {self.source}){extra}"


def _key_values(path: Path) -> dict[str, str]:
    """``key=value`` lines of a version file (``#`` comments skipped); {} when unreadable."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return {}
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.lstrip().startswith("#"):
            out[key.strip()] = value.strip()
    return out


def _bracketed_version(value: str) -> str:
    """``[7.6.0.1.220:8.0.0]`` (version.cfg) → ``8.0.0``; the release name follows the colon."""
    value = value.strip().strip("[]")
    return value.rpartition(":")[2] or value


def cann_version(root: Path, arch: str | None = None) -> CannVersion:
    """Read the CANN version of the install at `root`, the way its own files state it:

    * ``<root>/<arch>-linux/ascend_toolkit_install.info`` (``version=``; CANN >= 8.0 toolkit, also
      ``<root>/ascend_toolkit_install.info`` when `root` is the arch directory itself), with the ops
      package's ``ascend_ops_install.info`` beside it;
    * ``<root>/version.cfg`` (``runtime_running_version=[<inner>:<release>]``, toolkit <= 8.3);
    * ``<root>/runtime/version.info`` (``Version=``, the runtime component's own number).
    """
    arch = arch or platform.machine()
    components: dict[str, str] = {}
    for d in (root / f"{arch}-linux", root):
        ops = _key_values(d / "ascend_ops_install.info")
        if ops.get("version"):
            components[ops.get("package_name", "ops package")] = ops["version"]
            break
    for d in (root / f"{arch}-linux", root):
        info = d / "ascend_toolkit_install.info"
        kv = _key_values(info)
        if kv.get("version"):
            return CannVersion(kv["version"], str(info), kv.get("package_name"), components)
    cfg = root / "version.cfg"
    kv = _key_values(cfg)
    for key in ("toolkit_running_version", "runtime_running_version"):
        if kv.get(key):
            return CannVersion(_bracketed_version(kv[key]), str(cfg), key.partition("_")[0], components)
    info = root / "runtime" / "version.info"
    kv = _key_values(info)
    if kv.get("Version"):
        return CannVersion(kv["Version"], str(info), "runtime component", components)
    return CannVersion(components=components)


# ---- the report --------------------------------------------------------------------------------------
def _module_file(name: str) -> str | None:
    """Where a module would be imported from, without importing it (``_mock`` would load the
    package's mock libraries into a process that may run another root)."""
    mod = sys.modules.get(name)
    if mod is not None:
        return getattr(mod, "__file__", None)
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None else None


def collect(request: str | None) -> dict[str, Any]:
    """Load the requested backend and describe it; never raises for a backend that fails to load
    (that is part of the report). ``problems`` lists what makes the exit status 1."""
    import aclnn_py as acl
    from aclnn_py._binding import loader as _loader
    from aclnn_py._binding import package as _package

    origin = _package.origin()
    doc: dict[str, Any] = {
        "aclnn_py": {"version": acl.__version__, "package": str(origin.package_dir),
                     "origin": origin.describe(), "problem": origin.problem,
                     "compiled": {"_aclnn": _module_file("aclnn_py._aclnn"),
                                  "_core": _module_file("aclnn_py._core"),
                                  "_mock": _module_file("aclnn_py._mock")}},
        "backend": {"requested": request or "auto", "loaded": False},
        "problems": [], "warnings": [],
    }
    problems: list[str] = doc["problems"]
    try:
        doc["aclnn_py"]["mock_root"] = str(_loader.mock_root())
    except acl.BackendError:
        doc["aclnn_py"]["mock_root"] = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            b = acl.init(request)
        except acl.BackendError as e:
            b = None
            doc["backend"]["error"] = str(e)
            problems.append(f"backend not loaded: {e}")
            report = getattr(e, "abi_report", None)
            doc["abi"] = report.to_json() if report is not None else None
        except acl.AclnnPyError as e:  # aclInit / aclnnInit refused
            b = acl.backend()
            doc["backend"]["error"] = str(e)
            problems.append(f"runtime initialisation failed: {e}")
    doc["warnings"] = [str(w.message) for w in caught]
    if b is not None:
        _describe_backend(doc, b, problems)
    doc["environment"] = {v: os.environ.get(v) for v in ENV_VARS}
    return doc


def _why_this_backend(doc: dict[str, Any], b: Any) -> str:
    """How the loaded backend was chosen, in a few words."""
    from aclnn_py._binding import loader as _loader

    if doc["backend"]["requested"] != "auto":
        return "requested with --backend"
    if os.environ.get(_loader.ENV_BACKEND):
        return f"requested with {_loader.ENV_BACKEND}"
    if _loader.find_cann_root() is not None:
        return "the first CANN root found (ASCEND_HOME_PATH, ASCEND_TOOLKIT_HOME, /usr/local/Ascend/...)"
    return "the default where no CANN root is found and the host shows no Ascend device"


def _describe_backend(doc: dict[str, Any], b: Any, problems: list[str]) -> None:
    import aclnn_py as acl
    from aclnn_py import _aclnn
    from aclnn_py._binding import guard as _abi
    from aclnn_py._binding import loader as _loader
    from aclnn_py.ops import generations

    doc["backend"].update(loaded=True, kind=b.kind, root=str(b.root), reason=_why_this_backend(doc, b))
    doc["libraries"] = {g: b.libraries.get(g, []) for g in GROUPS}
    symbols: dict[str, Any] = {}
    for g in GROUPS:
        names = sorted(n for n in b.symbols if _loader.symbol_group(n) == g)
        missing = [n for n in names if not b.symbols[n]]
        symbols[g] = {"present": len(names) - len(missing), "total": len(names), "missing": missing}
    doc["symbols"] = symbols
    report = b.abi
    if report is None:  # the package's own mock root is not guarded at load; check it for the report
        compiled = _abi.compiled_abi(_aclnn)
        report = (_abi.check_root(b.root, b.symbols, {n: _loader.symbol_group(n) for n in b.symbols}, compiled)
                  if compiled is not None else _abi.AbiReport("unverified", note="no prototype table compiled in"))
    doc["abi"] = report.to_json()
    if report.status == "mismatch":
        why = ("loaded anyway because ACLNN_PY_SKIP_ABI_CHECK=1" if b.abi is not None
               else "the package's own mock root is not guarded at load")
        problems.append(f"ABI mismatch ({why}): {report.refusal()}")
    doc["cann_version"] = asdict(cann_version(Path(b.root)))
    present = generations.exported(b)
    doc["generations"] = {"exported": [g.number for g in present], "used": present[0].number if present else None}
    if not present:
        problems.append("no generation of the MoE dispatch / combine operators is exported (each needs its four "
                        "entry points; see the symbols above)")
    doc["soc"] = doc["devices"] = doc["cann_rules"] = None
    if "error" not in doc["backend"]:
        try:
            doc["soc"] = acl.soc_name()
            doc["devices"] = acl.Device.count()
            doc["cann_rules"] = _rules(b)
        except acl.AclnnPyError as e:
            doc["runtime_error"] = str(e)
            problems.append(f"runtime query failed: {e}")


def _rules(b: Any) -> dict[str, str]:
    """The rule set the operators apply where CANN releases differ (ops.releases)."""
    from aclnn_py.ops import releases

    if not b.is_mock:
        return {"name": "CANN's own", "source": "the installed release checks its own rules"}
    from aclnn_py import _mock

    active = releases.active()
    given = _mock.cann_version()
    how = f"{releases.VARIABLE}={given}" if given else f"{releases.VARIABLE} unset: the default"
    return {"name": active.name, "source": f"{how}; {active.source}"}


def strict_problems(doc: dict[str, Any]) -> list[str]:
    """What --strict adds: missing symbols, an ABI that is not fully verified."""
    out = []
    for g, s in (doc.get("symbols") or {}).items():
        if s["missing"]:
            out.append(f"{g}: missing {', '.join(s['missing'])}")
    abi = doc.get("abi")
    if doc["backend"].get("loaded") and abi and abi["status"] != "verified":
        out.append(f"ABI {abi['status']}: {abi['summary']}")
    return out


def render(doc: dict[str, Any]) -> str:
    """The human-readable report."""
    from aclnn_py.ops import generations

    pkg = doc["aclnn_py"]
    lines = [f"aclnn_py   {pkg['version']} imported from {pkg['origin']}",
             f"compiled   _aclnn:    {pkg['compiled']['_aclnn'] or '(not found)'}",
             f"           _core:     {pkg['compiled']['_core'] or '(not found)'}",
             f"           _mock:     {pkg['compiled']['_mock'] or '(not found)'}",
             f"mock root  {pkg.get('mock_root') or '(not found)'}"]
    be = doc["backend"]
    if not be["loaded"]:
        lines.append(f"backend    NOT LOADED (requested: {be['requested']})")
        lines.append(f"           {be.get('error', '')}")
    else:
        what = "the package's mock root" if be["kind"] == "mock" else "a CANN root"
        lines += [f"backend    {be['kind']} ({what}; requested: {be['requested']}: {be['reason']})",
                  f"root       {be['root']}"]
        lines.append(f"CANN       {CannVersion(**doc['cann_version']).describe()}")
    abi = doc.get("abi")
    lines.append(f"ABI        {abi['summary'] if abi else 'not checked'}")
    if abi:
        lines += [f"           {h}" for h in abi["headers"]]
        for name, c in abi["functions"].items():
            if c["status"] in ("mismatch", "unreadable"):
                lines.append(f"           {name}: {c['detail']} ({c['header']})")
    if be["loaded"]:
        lines.append(f"soc        {doc['soc'] if doc['soc'] is not None else '(query failed)'}")
        lines.append(f"devices    {doc['devices'] if doc['devices'] is not None else '(query failed)'}")
        rules = doc.get("cann_rules")
        lines.append(f"rules      {rules['name']} ({rules['source']})" if rules else "rules      (query failed)")
        gens = doc["generations"]
        used = (f"calls use {generations.GENERATIONS[generations.NEWEST - gens['used']]} unless a config names "
                "another" if gens["used"] else "no operator can run")
        lines.append(f"operators  generations {', '.join(map(str, gens['exported'])) or 'none'} exported; {used}")
        if be.get("error"):
            lines.append(f"runtime    {be['error']}")
        if doc.get("runtime_error"):
            lines.append(f"runtime    {doc['runtime_error']}")
        lines.append("libraries")
        for g in GROUPS:
            libs = doc["libraries"][g] or ["(none found)"]
            lines += [f"  {g:8} {libs[0]}"] + [f"  {'':8} {extra}" for extra in libs[1:]]
        lines.append("symbols")
        for g in GROUPS:
            s = doc["symbols"][g]
            miss = f"; missing: {', '.join(s['missing'])}" if s["missing"] else ""
            lines.append(f"  {g:8} {s['present']}/{s['total']} present{miss}")
    for w in doc["warnings"]:
        lines.append(f"warning    {w}")
    lines.append("environment")
    for var, value in doc["environment"].items():
        lines.append(f"  {var}={value}" if value is not None else f"  {var} (unset)")
    problems = doc["problems"]
    lines.append("result     " + ("OK" if not problems else f"{len(problems)} problem(s): " + " | ".join(problems)))
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    if not args.backend:
        raise UsageError("--backend: give auto, mock, cann or the path of a CANN root")
    doc = collect(None if args.backend == "auto" else args.backend)
    if args.strict:
        doc["problems"] += strict_problems(doc)
    code = EXIT_PROBLEM if doc["problems"] else EXIT_OK
    doc["exit_code"] = code
    print(json.dumps(doc, indent=2) if args.json else render(doc))
    return code


def add_parser(sub: Any) -> None:
    d = sub.add_parser("doctor", help="which aclnn_py, backend, libraries, symbols, SoC, CANN version and "
                                      "ABI check", description=DESCRIPTION, epilog=EXIT_CODES)
    d.add_argument("--backend", default="auto",
                   help='"mock", "cann" or the path of a CANN root; auto: $ACLNN_PY_BACKEND if set, else the '
                        "installed CANN when found, else the mock")
    d.add_argument("--strict", action="store_true",
                   help="also exit 1 when a bound symbol is missing or the ABI is not fully verified")
    d.add_argument("--json", action="store_true", help="print one JSON document (nothing on stderr)")
    d.set_defaults(func=main)


__all__ = ["CannVersion", "add_parser", "cann_version", "collect", "main", "render", "strict_problems"]
