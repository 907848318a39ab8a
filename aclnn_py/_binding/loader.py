"""Find and load a backend — the real CANN libraries or the mock CANN root — and bind its symbols.

``aclnn_py._aclnn`` holds one trampoline per C function of ``include/`` (see build_ffi.py); this
module dlopens the backend's libraries in CANN's search order (custom op packages, vendors, then the
built-in op libraries; libhcomm before libhccl) and points each trampoline at the symbol it finds. Symbols a backend lacks stay bound to stubs; calling them through
:data:`Backend.lib` raises :class:`~aclnn_py.errors.MissingSymbolError` naming the symbol and the
libraries searched.
"""

from __future__ import annotations

import glob
import importlib
import os
import platform
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import env_values, errors
from . import package as _package

if TYPE_CHECKING:
    from .guard import AbiReport

#: Functions of libnnopbase.so; every other non-HCCL, non-op name is libascendcl.so's.
_META_FUNCTIONS = frozenset(
    """aclnnInit aclnnFinalize aclCreateTensor aclDestroyTensor aclGetDataType aclGetFormat
    aclGetViewOffset aclSetRawTensorAddr aclGetRawTensorAddr aclSetAclOpExecutorRepeatable
    aclDestroyAclOpExecutor aclSetInputTensorAddr aclSetOutputTensorAddr aclSetTensorAddr""".split()
)
#: HCCL communicator-management calls: libhcomm.so first on CANN >= 8.5.
_HCOMM_FUNCTIONS = frozenset(
    """HcclGetRootInfo HcclCommInitRootInfo HcclCommDestroy HcclGetCommName HcclGetRankId
    HcclGetRankSize HcclGetCommAsyncError HcclGetErrorString HcclCommGetHandleWithName
    HcclGetHcclBuffer HcclGetRemoteIpcHcclBuf HcclKfcAllocOpArgs HcclKfcFreeOpArgs
    HcclKfcOpArgsSetCommEngine HcclKfcOpArgsSetAlgConfig HcclCreateOpResCtx HcclCommInitAll
    HcclCommInitClusterInfo""".split()
)
_OPAPI_DOMAINS = ("transformer", "math", "nn", "cv", "oam", "legacy")

ENV_BACKEND = "ACLNN_PY_BACKEND"
ENV_MOCK_ROOT = "ACLNN_PY_MOCK_ROOT"


def symbol_group(name: str) -> str:
    """Which library group exports `name`: "runtime", "meta", "ops" or "hccl"."""
    if name.startswith("aclnnMoe"):
        return "ops"
    if name.startswith("Hccl"):
        return "hccl"
    if name in _META_FUNCTIONS:
        return "meta"
    return "runtime"


def mock_root() -> Path:
    """The mock CANN root shipped with the package (or ``$ACLNN_PY_MOCK_ROOT``)."""
    env = os.environ.get(ENV_MOCK_ROOT)
    if env:
        return Path(env)
    where = _package.origin()
    if where.compiled_dir is None:
        raise errors.BackendError(f"the mock CANN root was not found: {where.problem}")
    return where.compiled_dir / "mock_root"


def cann_candidates(environ: dict[str, str] | None = None) -> list[Path]:
    """Real-CANN roots to try, in order: $ASCEND_HOME_PATH, $ASCEND_TOOLKIT_HOME,
    /usr/local/Ascend/cann, /usr/local/Ascend/ascend-toolkit/latest."""
    env = os.environ if environ is None else environ
    out: list[Path] = []
    for var in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"):
        if env.get(var):
            out.append(Path(env[var]))
    out += [Path("/usr/local/Ascend/cann"), Path("/usr/local/Ascend/ascend-toolkit/latest")]
    return out


def find_cann_root(environ: dict[str, str] | None = None) -> Path | None:
    """The first candidate root that holds lib64/libascendcl.so, or None."""
    for cand in cann_candidates(environ):
        if (cand / "lib64" / "libascendcl.so").exists():
            return cand
    return None


def _vendor_order(vendors_dir: Path) -> list[str]:
    """Vendors in config.ini's load_priority order, then any other vendor directory (sorted)."""
    names: list[str] = []
    ini = vendors_dir / "config.ini"
    if ini.is_file():
        for line in ini.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "load_priority":
                names += [v.strip() for v in value.split(",") if v.strip()]
    if vendors_dir.is_dir():
        names += sorted(p.name for p in vendors_dir.iterdir() if p.is_dir() and p.name not in names)
    return names


def op_library_candidates(root: Path, environ: dict[str, str] | None = None) -> list[Path]:
    """Where the aclnn operator symbols are looked up, first match wins (CANN's own order):
    $ASCEND_CUSTOM_OPP_PATH entries, opp/vendors/* (config.ini order), lib64/libopapi_*.so,
    lib64/libopapi.so, the legacy built-in libopapi.so."""
    env = os.environ if environ is None else environ
    out: list[Path] = []
    for p in filter(None, env.get("ASCEND_CUSTOM_OPP_PATH", "").split(":")):
        out.append(Path(p) / "op_api" / "lib" / "libcust_opapi.so")
    opp = Path(env["ASCEND_OPP_PATH"]) if env.get("ASCEND_OPP_PATH") else root / "opp"
    for vendor in _vendor_order(opp / "vendors"):
        out.append(opp / "vendors" / vendor / "op_api" / "lib" / "libcust_opapi.so")
    out += [root / "lib64" / f"libopapi_{d}.so" for d in _OPAPI_DOMAINS]
    out.append(root / "lib64" / "libopapi.so")
    arch = platform.machine()
    out.append(opp / "built-in" / "op_impl" / "ai_core" / "tbe" / "op_api" / "lib" / "linux" / arch / "libopapi.so")
    return out


def library_plan(root: Path, environ: dict[str, str] | None = None) -> dict[str, list[Path]]:
    """For each symbol group, the existing library files to search, in order."""
    lib64 = root / "lib64"
    plan = {
        "runtime": [lib64 / "libascendcl.so"],
        "meta": [lib64 / "libnnopbase.so"],
        "hccl": [lib64 / "libhcomm.so", lib64 / "libhccl.so"],
        "ops": op_library_candidates(root, environ),
    }
    return {g: [p for p in paths if p.exists()] for g, paths in plan.items()}


class _Lib:
    """Attribute access to the C functions and constants of the bound ABI.

    Present symbols are the cffi functions themselves (no per-call overhead); missing ones raise
    MissingSymbolError when called."""

    def __init__(self, raw: Any, missing: dict[str, str]):
        self._raw = raw
        for name, searched in missing.items():
            setattr(self, name, _missing_function(name, searched))

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._raw, name)
        setattr(self, name, value)
        return value


def _missing_function(name: str, searched: str) -> Callable[..., Any]:
    def call(*_args: Any, **_kw: Any) -> Any:
        raise errors.MissingSymbolError(name, searched)

    call.__name__ = name
    return call


@dataclass
class Backend:
    """A loaded backend: which kind, where, which libraries and symbols."""

    kind: str                      # "mock" or "cann"
    root: Path
    ffi: Any
    lib: Any
    libraries: dict[str, list[str]] = field(default_factory=dict)   # group -> loaded paths
    symbols: dict[str, str | None] = field(default_factory=dict)    # symbol -> library or None
    abi: AbiReport | None = None   # the ABI guard's result for a CANN root (None: the package's mock)

    @property
    def missing(self) -> list[str]:
        return sorted(n for n, where in self.symbols.items() if where is None)

    @property
    def is_mock(self) -> bool:
        return self.kind == "mock"

    def function_pointer(self, name: str) -> Any:
        """``void *`` to the C function `name`, for the extension's own helpers that call it (the
        trampoline's address: a symbol the library lacks still fails with its status)."""
        raw = self.lib._raw if isinstance(self.lib, _Lib) else self.lib
        return self.ffi.cast("void *", self.ffi.addressof(raw, name))

    def __repr__(self) -> str:
        present = sum(1 for where in self.symbols.values() if where)
        return f"Backend({self.kind!r}, root={str(self.root)!r}, {present}/{len(self.symbols)} symbols bound)"


_lock = threading.Lock()
_backend: Backend | None = None


#: The device nodes of Ascend's driver: on a host that has them, no backend named and no CANN root
#: found is an error, not the mock (a module attribute so a test can point it elsewhere).
DEVICE_NODES = "/dev/davinci[0-9]*"


def ascend_device_nodes() -> list[str]:
    """The Ascend device nodes this host shows (``/dev/davinci0`` ...), sorted."""
    return sorted(glob.glob(DEVICE_NODES))


def _resolve_request(backend: str | os.PathLike[str] | None) -> tuple[str, Path]:
    req = backend if backend is not None else os.environ.get(ENV_BACKEND) or None
    if req is None:
        root = find_cann_root()
        if root is None:
            nodes = ascend_device_nodes()
            if nodes:
                # a serving engine on an NPU host with a broken ASCEND_HOME_PATH must not run on the
                # CPU mock and look right
                tried = ", ".join(str(p) for p in cann_candidates())
                raise errors.BackendError(
                    f"this host has Ascend devices ({', '.join(nodes[:3])}{' ...' if len(nodes) > 3 else ''}) but no "
                    f"CANN root was found (looked for lib64/libascendcl.so in {tried}): set ASCEND_HOME_PATH "
                    f"(source CANN's set_env.sh) or pass a CANN root (init('/path/to/cann') or "
                    f"{ENV_BACKEND}=/path/to/cann); to run on the CPU mock here, choose it: "
                    f"init('mock') or {ENV_BACKEND}=mock")
            return "mock", mock_root()
        return (_kind_of(root), root)  # ASCEND_HOME_PATH may point at the mock root itself
    if isinstance(req, str) and req == "mock":
        return "mock", mock_root()
    if isinstance(req, str) and req == "cann":
        root = find_cann_root()
        if root is None:
            tried = ", ".join(str(p) for p in cann_candidates())
            raise errors.BackendError(f"no CANN installation found (looked for lib64/libascendcl.so in {tried})")
        return "cann", root
    root = Path(req)
    if not (root / "lib64" / "libascendcl.so").exists():
        raise errors.BackendError(f"{root} is not a CANN root: {root / 'lib64' / 'libascendcl.so'} does not exist")
    return _kind_of(root), root


def _kind_of(root: Path) -> str:
    """The backend kind of a CANN root: "mock" for the package's mock root, else "cann"."""
    try:
        return "mock" if root.resolve() == mock_root().resolve() else "cann"
    except errors.BackendError:
        return "cann"


def _load(kind: str, root: Path) -> Backend:
    try:
        _aclnn: Any = importlib.import_module("aclnn_py._aclnn")  # the compiled cffi module
    except ImportError as exc:
        problem = _package.origin().problem or str(exc)
        raise errors.BackendError(f"the compiled binding aclnn_py._aclnn cannot be imported: {problem}") from exc
    ffi, raw = _aclnn.ffi, _aclnn.lib
    plan = library_plan(root)
    handles: dict[Path, Any] = {}
    loaded: dict[str, list[str]] = {}
    names = [ffi.string(raw.aclnnpy_symbol_name(i)).decode() for i in range(raw.aclnnpy_symbol_count())]
    for group in ("runtime", "meta", "hccl", "ops"):
        # operators not yet found: once an op library holds them all, the later candidates (CANN's
        # built-in libraries behind a custom package) are not opened
        unfound = {n for n in names if symbol_group(n) == "ops"}
        for path in plan[group]:
            if group == "ops" and not unfound:
                break
            handle = raw.aclnnpy_dlopen(str(path).encode(), 1)
            if handle == ffi.NULL:
                err = raw.aclnnpy_dlerror()
                msg = ffi.string(err).decode(errors="replace") if err != ffi.NULL else "unknown error"
                if group in ("runtime", "meta"):
                    raise errors.BackendError(f"cannot load {path}: {msg}")
                continue  # optional groups: report through doctor / missing symbols
            handles[path] = handle
            loaded.setdefault(group, []).append(str(path))
            if group == "ops":
                unfound = {n for n in unfound if raw.aclnnpy_dlsym(handle, n.encode()) == ffi.NULL}
    symbols: dict[str, str | None] = {}
    missing: dict[str, str] = {}
    for i, name in enumerate(names):
        group = symbol_group(name)
        search = plan[group]
        if group == "hccl" and name not in _HCOMM_FUNCTIONS:
            search = [p for p in search if p.name != "libhcomm.so"]
        symbols[name] = None
        for path in search:
            h = handles.get(path)
            if h is None:
                continue
            addr = raw.aclnnpy_dlsym(h, name.encode())
            if addr != ffi.NULL:
                raw.aclnnpy_bind_symbol(i, addr)
                symbols[name] = str(path)
                break
        if symbols[name] is None:
            missing[name] = ", ".join(str(p) for p in search) or f"no {group} library under {root}"
    abi = None
    if kind == "cann":
        from .guard import guard

        try:
            abi = guard(root, symbols, _aclnn, symbol_group)
        except errors.BackendError:
            for i in range(raw.aclnnpy_symbol_count()):
                raw.aclnnpy_bind_symbol(i, ffi.NULL)  # refused: no call may reach a differing prototype
            raise
    lib = _Lib(raw, missing)
    errors.set_message_reader(lambda: _recent_message(ffi, lib))
    made = Backend(kind=kind, root=root, ffi=ffi, lib=lib, libraries=loaded, symbols=symbols, abi=abi)
    _bind_core(made)
    return made


def _bind_core(b: Backend) -> None:
    """The compiled core calls these backend functions by address (the trampolines); on the mock, also
    the refill of reused memory with the poison of new memory."""
    from .. import _core

    def address(name: str) -> int:
        return int(b.ffi.cast("uintptr_t", b.function_pointer(name)))

    refill = 0
    if b.is_mock:
        from .. import _mock

        refill = int(_mock.refill_poison_async_address())
    _core.bind_backend(create_tensor_address=address("aclCreateTensor"),
                       destroy_tensor_address=address("aclDestroyTensor"),
                       set_input_addr_address=address("aclSetInputTensorAddr"),
                       set_output_addr_address=address("aclSetOutputTensorAddr"),
                       destroy_executor_address=address("aclDestroyAclOpExecutor"),
                       format_nd_value=b.lib.ACL_FORMAT_ND, refill_poison_address=refill,
                       hccl_barrier_address=address("HcclBarrier") if b.symbols.get("HcclBarrier") else 0,
                       get_device_address=address("aclrtGetDevice"),
                       launch_may_block=not b.is_mock)  # the mock's launch appends to an unbounded queue
    _core.bind_copies(memcpy_async_address=address("aclrtMemcpyAsync"), memcpy_address=address("aclrtMemcpy"),
                      host_to_device=b.lib.ACL_MEMCPY_HOST_TO_DEVICE, device_to_host=b.lib.ACL_MEMCPY_DEVICE_TO_HOST)
    _core.bind_waits(sync_with_timeout_address=address("aclrtSynchronizeStreamWithTimeout"),
                     comm_init_root_info_address=address("HcclCommInitRootInfo"))


def _recent_message(ffi: Any, lib: Any) -> str | None:
    try:
        p = lib.aclGetRecentErrMsg()
    except errors.MissingSymbolError:
        return None
    return None if p == ffi.NULL else str(ffi.string(p).decode(errors="replace"))


def load(backend: str | os.PathLike[str] | None = None) -> Backend:
    """Load the requested backend ("mock", "cann", a CANN root path, or None for
    $ACLNN_PY_BACKEND / real CANN when found / the mock). Idempotent; asking for a different backend
    once one is loaded raises BackendError (the symbols are process-wide)."""
    global _backend
    with _lock:
        if _backend is not None:
            if backend is None:
                return _backend
            kind, root = _resolve_request(backend)
            if root.resolve() != _backend.root.resolve():
                raise errors.BackendError(
                    f"backend {_backend.kind} at {_backend.root} is already loaded in this process; "
                    f"cannot switch to {root}"
                )
            return _backend
        kind, root = _resolve_request(backend)
        env_values.check(mock=kind == "mock")  # before anything reads a value that cannot be read
        _backend = _load(kind, root)
        return _backend


def backend() -> Backend:
    """The loaded backend, loading the default one on first use."""
    b = _backend
    return b if b is not None else load()


def loaded() -> Backend | None:
    """The backend if one was loaded, else None (never loads)."""
    return _backend
