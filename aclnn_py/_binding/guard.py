"""The ABI guard: when a real CANN root is loaded, the prototype of every bound C function in its
installed headers is compared with the one aclnn-py was compiled for (:func:`check_root`). A different
prototype called through cffi is a crash or silent garbage, so :func:`enforce` refuses to load on any
difference, and warns about (or, with ``ACLNN_PY_ABI_CHECK=strict``, refuses) every bound function whose
prototype it could not compare.
"""

from __future__ import annotations

import os
import re
import sys
import types
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .headers import Extracted, extract_prototypes
from .prototypes import CompiledAbi, compiled_abi, first_difference

#: Environment variable that turns a refusal of the guard (a prototype mismatch, or under the strict
#: mode a prototype that could not be verified) into a warning.
ENV_SKIP = "ACLNN_PY_SKIP_ABI_CHECK"
#: Environment variable choosing what an unverifiable prototype does at load: "warn" (the default) or
#: "strict" (refuse to load).
ENV_MODE = "ACLNN_PY_ABI_CHECK"
_MODES = ("warn", "strict")



@dataclass(frozen=True)
class FunctionCheck:
    """The guard's result for one bound function."""

    name: str
    status: str            # "match", "mismatch", "not found" or "unreadable"
    header: str = ""       # the header whose prototype was compared
    detail: str = ""       # the difference, or why the prototype could not be read


@dataclass(frozen=True)
class AbiReport:
    """The guard's result for a loaded root.

    ``status``: "verified" (every bound function's installed prototype equals the compiled one),
    "partial" (those found are equal, some were not found or could not be read), "unverified" (no
    installed header declares any bound function) or "mismatch"."""

    status: str
    checks: tuple[FunctionCheck, ...] = ()
    note: str = ""
    headers: tuple[str, ...] = field(default=())

    @property
    def mismatches(self) -> list[FunctionCheck]:
        return [c for c in self.checks if c.status == "mismatch"]

    @property
    def unchecked(self) -> list[FunctionCheck]:
        return [c for c in self.checks if c.status in ("not found", "unreadable")]

    def summary(self) -> str:
        """One line for people: what was verified against what (the header paths are in ``headers``)."""
        n = sum(c.status == "match" for c in self.checks)
        if self.status == "mismatch":
            bad = self.mismatches
            return f"MISMATCH in {len(bad)} function(s): " + "; ".join(f"{c.name} ({c.header})" for c in bad)
        if self.status == "verified":
            return f"verified: all {n} bound prototypes equal the installed headers ({len(self.headers)} files)"
        if self.status == "partial":
            return (f"partially verified: {n} prototypes equal the installed headers ({len(self.headers)} files); "
                    f"not checked: {', '.join(c.name for c in self.unchecked)}")
        return "unverified: " + (self.note or "no installed header declares a bound function")

    def refusal(self) -> str:
        """The error message of a mismatch: every differing function, its header and first difference."""
        lines = [f"{c.name}: {c.detail} ({c.header})" for c in self.mismatches]
        return ("the installed CANN declares a different C prototype than the one aclnn-py was built for, "
                "so calling it would pass wrong arguments: " + "; ".join(lines))

    def unverified_text(self) -> str:
        """What the guard could not verify, as the load-time warning (or strict refusal) states it:
        every such function with the header it was looked for in and why; "" when every bound
        prototype was compared."""
        unchecked = self.unchecked
        if self.status == "unverified" and all(c.status == "not found" for c in unchecked):
            return (f"aclnn-py could not verify any of the {len(self.checks)} bound C prototypes against the "
                    f"installed headers ({self.note or 'no installed header declares a bound function'}), "
                    "so a different prototype there would go unnoticed")
        if not unchecked:
            return ""
        groups: dict[tuple[str, str], list[str]] = {}
        for c in unchecked:
            groups.setdefault((c.header, c.detail), []).append(c.name)
        parts = [f"{', '.join(names)} ({f'{header}: ' if header else ''}{detail})"
                 for (header, detail), names in groups.items()]
        return (f"aclnn-py could not verify {len(unchecked)} of the {len(self.checks)} bound C prototypes against "
                "the installed headers, so a different prototype there would go unnoticed: " + "; ".join(parts))

    def to_json(self) -> dict[str, object]:
        return {"status": self.status, "summary": self.summary(), "headers": list(self.headers),
                "functions": {c.name: {"status": c.status, "header": c.header, "detail": c.detail}
                              for c in self.checks}}


# ---- where the installed headers are ----------------------------------------------------------------
_GROUP_INCLUDES = {"runtime": ("acl",), "meta": ("aclnn", "nnopbase"), "hccl": ("hccl", "hcomm"),
                   "ops": ("aclnnop",)}
_OP_HEADER_GLOB = "aclnn_moe_distribute*.h"


def header_dirs(root: Path, group: str, library: str | None) -> list[tuple[Path, str]]:
    """(directory, file glob) pairs to search, in order, for a function of `group` bound from `library`:
    the include folder next to that library first (an op package's ``op_api/include``, or the
    ``include/`` beside its ``lib64/``), then the root's own ``include/``."""
    bases: list[Path] = []
    out: list[tuple[Path, str]] = []
    if library:
        lib = Path(library)
        if group == "ops":
            for parent in lib.parents:
                if parent.name == "op_api":  # opp/vendors/<v>/op_api/lib or a built-in op_api/lib/linux/<arch>
                    out.append((parent / "include", _OP_HEADER_GLOB))
                    break
        if lib.parent.name == "lib64":
            bases.append(lib.parent.parent / "include")
    bases.append(root / "include")
    glob = _OP_HEADER_GLOB if group == "ops" else "*.h"
    for base in bases:
        for sub in _GROUP_INCLUDES[group]:
            pair = (base / sub, glob)
            if pair not in out:
                out.append(pair)
    return out


def _header_files(directory: Path, glob: str) -> list[Path]:
    try:
        return sorted(p for p in directory.rglob(glob) if p.is_file())
    except OSError:
        return []


def check_root(root: Path, bound: Mapping[str, str | None], groups: Mapping[str, str],
               compiled: CompiledAbi) -> AbiReport:
    """Compare every bound function (``bound``: name -> library it was bound from, None if missing;
    ``groups``: name -> library group) with its prototype in the installed headers of `root`."""
    texts: dict[Path, str] = {}
    plan: dict[tuple[tuple[Path, str], ...], list[str]] = {}
    for name, library in bound.items():
        if library is None or name not in compiled.functions:
            continue
        plan.setdefault(tuple(header_dirs(root, groups[name], library)), []).append(name)
    found: dict[str, Extracted] = {}  # the first header in search order that declares a name wins
    for dirs, names in plan.items():
        for directory, glob in dirs:
            if all(n in found for n in names):
                break
            for path in _header_files(directory, glob):
                if path not in texts:
                    try:
                        texts[path] = path.read_text(errors="replace")
                    except OSError:
                        texts[path] = ""
                found.update(extract_prototypes(texts[path], [n for n in names if n not in found],
                                                compiled.typedefs, str(path)))
    searched = {name: dirs for dirs, names in plan.items() for name in names}
    checks: list[FunctionCheck] = []
    for name in sorted(n for n, lib in bound.items() if lib is not None and n in compiled.functions):
        ex = found.get(name)
        if ex is None:
            checks.append(_not_found(name, searched[name], texts))
        elif ex.prototype is None:
            checks.append(FunctionCheck(name, "unreadable", ex.header, ex.error))
        else:
            diff = first_difference(compiled.functions[name], ex.prototype)
            checks.append(FunctionCheck(name, "match" if diff is None else "mismatch", ex.header, diff or ""))
    headers = tuple(sorted({c.header for c in checks if c.status in ("match", "mismatch")}))
    if any(c.status == "mismatch" for c in checks):
        status = "mismatch"
    elif all(c.status == "match" for c in checks) and checks:
        status = "verified"
    elif any(c.status == "match" for c in checks):
        status = "partial"
    else:
        status = "unverified"
    note = "" if status != "unverified" else f"no header under {root} declares a bound function"
    return AbiReport(status, tuple(checks), note, headers)


_UNREAD_DECLARATION = ("the header names it, but no C declaration of it could be read there (an #if or "
                       "extern \"C\" block left open hides the rest of the file, or the declaration is not plain C)")


def _not_found(name: str, dirs: Iterable[tuple[Path, str]], texts: Mapping[Path, str]) -> FunctionCheck:
    """The check of a bound function whose declaration was not found: "unreadable" in the first
    searched header that names it outside comments (a malformed header), else "not found", naming the
    folders searched."""
    dirs = list(dirs)
    pattern = re.compile(rf"\b{re.escape(name)}\s*\(")
    for directory, glob in dirs:
        for path in _header_files(directory, glob):
            text = texts.get(path, "")
            if name in text and pattern.search(_without_comments(text)):
                return FunctionCheck(name, "unreadable", str(path), _UNREAD_DECLARATION)
    where = ", ".join(str(d) for d, _ in dirs)
    return FunctionCheck(name, "not found", "", f"no installed header declares it (searched {where})")


def _without_comments(text: str) -> str:
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", " ", text, flags=re.S))


def abi_check_mode() -> str:
    """The mode of ``ACLNN_PY_ABI_CHECK``: "warn" (unset or empty) or "strict"; BackendError for any
    other value."""
    value = os.environ.get(ENV_MODE, "").strip().lower() or "warn"
    if value not in _MODES:
        from ..errors import BackendError

        raise BackendError(f"{ENV_MODE} must be 'warn' or 'strict' (got {os.environ[ENV_MODE]!r})")
    return value


def enforce(report: AbiReport) -> None:
    """Raise BackendError for a mismatch, and under ``ACLNN_PY_ABI_CHECK=strict`` for any bound
    function whose prototype could not be verified (its ``abi_report`` attribute is `report`); warn
    (RuntimeWarning) about the unverified ones otherwise. ``ACLNN_PY_SKIP_ABI_CHECK=1`` turns every
    refusal into a warning."""
    mode = abi_check_mode()
    from .. import env_values

    skip = env_values.flag(ENV_SKIP, False)
    if report.status == "mismatch":
        if not skip:
            raise _refusal_error(report, f"{report.refusal()}. Install the CANN / op package whose headers match")
        _warn(f"{report.refusal()} ({ENV_SKIP}=1: loading anyway; a call to these functions may crash or return "
              "garbage)")
    text = report.unverified_text()
    if not text:
        return
    if mode == "strict" and not skip:
        raise _refusal_error(report, f"{text}. {ENV_MODE}=strict refuses such a load: install headers that declare "
                             f"them readably; unset {ENV_MODE} to load with a warning")
    _warn(f"{text} ({f'{ENV_SKIP}=1: loading anyway' if mode == 'strict' else f'{ENV_MODE}=strict refuses this'})")


def _warn(message: str) -> None:
    """A RuntimeWarning attributed to the first caller outside the package (the init() or first use
    that loaded the backend)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # aclnn_py, not _binding
    level = 2  # _warn's caller
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package + os.sep):
        frame = frame.f_back
        level += 1
    warnings.warn(message, RuntimeWarning, stacklevel=level)


def _refusal_error(report: AbiReport, message: str) -> Exception:
    """A BackendError carrying the report (``abi_report``), so that doctor can show it in detail."""
    from ..errors import BackendError

    exc = BackendError(f"{message}, or set {ENV_SKIP}=1 to load anyway")
    exc.abi_report = report  # type: ignore[attr-defined]
    return exc


def guard(root: Path, symbols: Mapping[str, str | None], module: object,
          group_of: Callable[[str], str]) -> AbiReport:
    """The loader's check of a CANN root: :func:`check_root` of every bound symbol of the compiled
    `module`, then :func:`enforce`."""
    compiled = compiled_abi(module)
    if compiled is None:
        report = AbiReport("unverified", note="the compiled module has no prototype table (built before it "
                           "existed); rebuild aclnn-py")
    else:
        report = check_root(root, symbols, {n: group_of(n) for n in symbols}, compiled)
    enforce(report)
    return report
