"""Every fenced ```python and ```bash block of the user docs runs as written (README.md, docs/*.md,
examples/**/README.md), one test per block, named ``<file>:<line of the opening fence>``.

A block is skipped only when the line right before its fence is ``<!-- doc-test: skip — <reason> -->``
with a non-empty reason (torch/CANN-only code, set-up commands that CI runs elsewhere).

Blocks run the way a user runs them, from the checkout root, in a fresh process:

* python: the block is saved to a file in a temporary folder and run as ``python <file>`` with this
  interpreter. Python puts the script's folder (not the working directory) first on ``sys.path``, so
  ``import aclnn_py`` finds what the user's environment provides: the installed package, or the
  source tree through ``PYTHONPATH`` (+ ``ACLNN_PY_BUILD_DIR``) in a development checkout.
* bash: ``bash -e <file>``; ``python`` is this interpreter (its folder first on ``PATH``, as in an
  activated virtual environment). In a development checkout, where the package is not installed and
  so has no ``aclnn-py`` console script, a stand-in that runs ``python -m aclnn_py`` is put on
  ``PATH``.

The environment is the caller's with ``ACLNN_PY_BACKEND=mock`` and short HCCL timeouts, minus the
``PYTHONSAFEPATH`` that conftest.py sets for other tests. A block may write files only under
``build/`` (CMake builds, example outputs); every block is checked for that.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

EXECUTED = ("python", "bash")
# info strings that would hide a runnable snippet from this test: use ```python / ```bash (or ```text)
UNTESTED_ALIASES = ("py", "python3", "pycon", "ipython", "sh", "shell", "console", "shell-session", "zsh")

FENCE_RE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
# a block must not change the environment that runs the tests
INSTALLS = re.compile(r"\b(pip3?|python3? -m pip|apt-get|apt|yum|dnf) +install\b")
SKIP_RE = re.compile(r"^<!-- doc-test: skip — (?P<reason>.*?) -->$")

# folders a block may not write into are everything but build/; these hold caches, not sources
UNTRACKED_DIRS = {".git", "build", "dist", "_skbuild", "__pycache__", ".pytest_cache", ".hypothesis",
                  ".mypy_cache", ".ruff_cache"}

PYTHON_TIMEOUT = 90
BASH_TIMEOUT = 240


@dataclass(frozen=True)
class DocBlock:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    marker: str | None  # the doc-test comment right before the fence, if any

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(REPO).as_posix()}:{self.line}"


def doc_files() -> list[Path]:
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
             *sorted((REPO / "examples").glob("**/README.md"))]
    return [f for f in files if f.is_file()]


def parse_blocks(path: Path) -> list[DocBlock]:
    """Every fenced block of a Markdown file (any info string), with the line before its fence."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[DocBlock] = []
    i = 0
    while i < len(lines):
        m = FENCE_RE.match(lines[i])
        if not m or "`" in m["info"]:
            i += 1
            continue
        fence, info = m["fence"], m["info"].strip()
        lang = info.split()[0] if info else ""
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            close = FENCE_RE.match(lines[j])
            if close and close["fence"][0] == fence[0] and len(close["fence"]) >= len(fence) and not close["info"].strip():
                break
            body.append(lines[j])
            j += 1
        else:
            raise AssertionError(f"{path}:{i + 1}: fenced block is never closed")
        prev = lines[i - 1].strip() if i > 0 else ""
        blocks.append(DocBlock(path, i + 1, lang, "\n".join(body) + "\n", prev if "doc-test" in prev else None))
        i = j + 1
    return blocks


ALL_BLOCKS = [b for f in doc_files() for b in parse_blocks(f)]
RUN_BLOCKS = [b for b in ALL_BLOCKS if b.lang in EXECUTED]


def skip_reason(block: DocBlock) -> str | None:
    """The reason of a well-formed skip marker, None without a marker."""
    if block.marker is None:
        return None
    m = SKIP_RE.match(block.marker)
    assert m, f"{block.id}: malformed marker {block.marker!r}; write <!-- doc-test: skip — <reason> -->"
    return m["reason"].strip()


# ------------------------------------------------------------------------------------------ form

def test_docs_have_blocks() -> None:
    # the collection itself works: the README's runnable round and the docs' snippets are found
    ids = {b.id for b in RUN_BLOCKS}
    assert any(i.startswith("README.md:") for i in ids)
    assert any(i.startswith("docs/quickstart.md:") for i in ids)
    assert any(b.lang == "bash" for b in RUN_BLOCKS) and any(b.lang == "python" for b in RUN_BLOCKS)


def test_wheel_names_carry_the_current_version() -> None:
    """A wheel or sdist name in the docs is the one `pip wheel .` makes from this source."""
    import runpy

    version = runpy.run_path(str(REPO / "aclnn_py" / "_version.py"))["__version__"]
    named = {(f.relative_to(REPO).as_posix(), m[1]) for f in doc_files()
             for m in re.finditer(r"\baclnn_py-(\d[^-\s*/]*?)(?:-|\.tar\.gz)", f.read_text(encoding="utf-8"))}
    assert ("docs/quickstart.md", version) in named, named
    assert {v for _, v in named} == {version}, f"wheel names with another version than {version}: {named}"


def test_api_reference_is_current_and_shows_the_buffer_constructor_and_attributes() -> None:
    r = subprocess.run([sys.executable, "docs/gen_api.py", "--check"], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    text = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    assert ("#### `MoeDistributeBuffer.__init__(self, comm: Communicator, ccl_buffer_size: int = 0, "
            "comm_alg: int = 0, *, generation: int = 0, tp_comm: Communicator | None = None, "
            "result_sets: int = 2)`") in text
    assert "#### `MoeDistributeBuffer.low_latency_dispatch(self, x: TensorArg," in text  # the compiled method
    for attr in ("comm", "rank_id", "world_size", "group_name", "context", "ccl_buffer_size", "soc", "generation"):
        assert f"- **`MoeDistributeBuffer.{attr}`** (attribute) — " in text, attr


def test_no_snippet_hides_behind_another_language() -> None:
    hidden = [f"{b.id} (```{b.lang})" for b in ALL_BLOCKS if b.lang.lower() in UNTESTED_ALIASES]
    assert not hidden, f"label runnable snippets ```python or ```bash so they are tested: {hidden}"


def test_skip_markers_are_well_formed_and_placed() -> None:
    problems = []
    for f in doc_files():
        lines = f.read_text(encoding="utf-8").splitlines()
        for n, text in enumerate(lines):
            if "doc-test" not in text:
                continue
            where = f"{f.relative_to(REPO).as_posix()}:{n + 1}"
            m = SKIP_RE.match(text.strip())
            if not m or not m["reason"].strip():
                problems.append(f"{where}: needs <!-- doc-test: skip — <reason> --> with a reason")
                continue
            nxt = FENCE_RE.match(lines[n + 1]) if n + 1 < len(lines) else None
            if not nxt or nxt["info"].strip().split()[:1] not in (["python"], ["bash"]):
                problems.append(f"{where}: a skip marker must be the line right before a ```python/```bash fence")
    assert not problems, "\n".join(problems)


LINK_RE = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the lines outside fenced blocks."""
    out, fence = [], None
    for n, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = FENCE_RE.match(text)
        if m and fence is None and "`" not in m["info"]:
            fence = m["fence"]
        elif m and fence is not None and m["fence"][0] == fence[0] and len(m["fence"]) >= len(fence) \
                and not m["info"].strip():
            fence = None
        elif fence is None:
            out.append((n, text))
    return out


def heading_anchors(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped, spaces to
    hyphens, repeated headings numbered."""
    seen: dict[str, int] = {}
    anchors = set()
    for _, text in prose_lines(path):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", text)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m[1].lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def test_relative_links_and_anchors_resolve() -> None:
    broken = []
    for f in [*doc_files(), REPO / "CHANGELOG.md"]:
        for n, text in prose_lines(f):
            for target in LINK_RE.findall(text):
                if re.match(r"^[a-z]+:", target):
                    continue  # http(s), mailto: not checked here
                path_part, _, anchor = target.partition("#")
                dest = (f.parent / path_part).resolve() if path_part else f
                where = f"{f.relative_to(REPO).as_posix()}:{n}: {target}"
                if not dest.exists():
                    broken.append(f"{where} (no such file)")
                elif anchor and dest.suffix == ".md" and anchor not in heading_anchors(dest):
                    broken.append(f"{where} (no heading with that anchor)")
    assert not broken, "\n".join(broken)


# ------------------------------------------------------------------------------------------ running

def _tree_state() -> dict[str, tuple[int, int]]:
    """(mtime, size) of every file of the checkout outside build/ and cache folders."""
    state: dict[str, tuple[int, int]] = {}
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in UNTRACKED_DIRS and not d.endswith(".egg-info")]
        for name in files:
            p = os.path.join(root, name)
            try:
                st = os.stat(p)
            except FileNotFoundError:
                continue
            state[os.path.relpath(p, REPO)] = (st.st_mtime_ns, st.st_size)
    return state


def _user_env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONSAFEPATH", None)
    env["ACLNN_PY_BACKEND"] = "mock"
    env["HCCL_EXEC_TIMEOUT"] = "15"
    env["HCCL_CONNECT_TIMEOUT"] = "15"
    path = [str(Path(sys.executable).parent)]
    if shutil.which("aclnn-py", path=os.pathsep.join(path + [env.get("PATH", "")])) is None:
        shim = tmp / "bin"
        shim.mkdir()
        script = shim / "aclnn-py"
        script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m aclnn_py "$@"\n')
        script.chmod(0o755)
        path.insert(0, str(shim))
    env["PATH"] = os.pathsep.join(path + [env.get("PATH", "")])
    return env


def _run(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[int, str, str]:
    """Run in a new session so that, on a timeout, the block and everything it started are killed
    (the block's process still leads its group then, so the group id is certainly its own)."""
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"timed out after {timeout} s\n--- stdout\n{out}--- stderr\n{err}")
    return proc.returncode, out, err


@pytest.mark.parametrize("block", RUN_BLOCKS, ids=[b.id for b in RUN_BLOCKS])
def test_doc_block(block: DocBlock, tmp_path: Path) -> None:
    reason = skip_reason(block)
    if reason is not None:
        assert reason, f"{block.id}: a skipped block needs a reason"
        pytest.skip(reason)
    assert not INSTALLS.search(block.code), (
        f"{block.id} installs packages into the environment running the tests; mark it "
        "<!-- doc-test: skip — <reason> --> and run it where it belongs (.ci/run)")
    env = _user_env(tmp_path)
    stem = re.sub(r"\W", "_", block.id)
    before = _tree_state()
    if block.lang == "python":
        script = tmp_path / f"{stem}.py"
        script.write_text(block.code)
        cmd, timeout = [sys.executable, str(script)], PYTHON_TIMEOUT
    else:
        script = tmp_path / f"{stem}.sh"
        script.write_text(block.code)
        cmd, timeout = ["bash", "-e", str(script)], BASH_TIMEOUT
    returncode, out, err = _run(cmd, env, timeout)
    assert returncode == 0, (f"{block.id} exited with {returncode}\n--- block\n{block.code}"
                             f"--- stdout\n{out}--- stderr\n{err}")
    after = _tree_state()
    changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
    assert not changed, f"{block.id} wrote outside build/: {changed}"
