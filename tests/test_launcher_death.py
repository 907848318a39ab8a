"""No rank outlives its launcher: a launching process killed with SIGKILL or SIGTERM takes every rank
process of :func:`aclnn_py.worlds.spawn` with it within a second, with either start method, and the
demo's process world likewise; Ctrl-C pressed again and again while the ranks are stopped ends the
launcher with one line, no traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import package_pythonpath

LAUNCHER = r"""
import os, sys, time
from aclnn_py.worlds import spawn

def rank(rank, world_size, root, folder):
    with open(os.path.join(folder, f"rank{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(120)
    return rank

if __name__ == "__main__":
    spawn(rank, 2, sys.argv[2], start_method=sys.argv[1], timeout=300)
"""


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (a dead process waiting for its parent to reap it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2:][:1] not in (b"Z", b"X")


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = package_pythonpath(env)
    return env


def _wait_gone(pids: set[int], limit: float) -> float:
    """Seconds until none of `pids` is alive (checked every 10 ms), or `limit` + a bit when some still are."""
    start = time.monotonic()
    while time.monotonic() - start < limit + 1.0:
        if not any(_alive(p) for p in pids):
            return time.monotonic() - start
        time.sleep(0.01)
    return float("inf")


def _kill_all(pids: set[int]) -> None:
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_killing_the_launcher_ends_every_rank(acl: object, tmp_path: Path, start_method: str,
                                             how: signal.Signals) -> None:
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    launcher = subprocess.Popen([sys.executable, str(script), start_method, str(tmp_path)], env=_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ranks: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        while len(ranks) < 2 and time.monotonic() < deadline and launcher.poll() is None:
            ranks = {int(p.read_text()) for p in tmp_path.glob("rank*.pid") if p.read_text()}
            time.sleep(0.05)
        assert len(ranks) == 2, f"the ranks did not start: {launcher.stderr.read() if launcher.stderr else ''}"
        launcher.send_signal(how)
        launcher.wait(30)
        took = _wait_gone(ranks, 1.0)
        assert took <= 1.0, f"ranks {sorted(p for p in ranks if _alive(p))} outlived the launcher ({how.name})"
    finally:
        launcher.kill()
        _kill_all(ranks)


def _demo_with_ranks_running() -> tuple[subprocess.Popen[str], set[int]]:
    """``aclnn-py demo`` with its 4 rank processes (and their fork server) in their rounds."""
    demo = subprocess.Popen([sys.executable, "-m", "aclnn_py", "demo", "--rounds", "1000"], env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert demo.stderr is not None
    for line in demo.stderr:  # the demo computes the golden of every round first (progress on stderr)
        if "starting" in line:
            break
    ranks: set[int] = set()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and demo.poll() is None and len(ranks) < 5:
        ranks = _descendants(demo.pid)
        time.sleep(0.05)
    if len(ranks) < 5:
        demo.kill()
        raise AssertionError(f"the demo did not start its ranks: {ranks}")
    time.sleep(0.3)  # the rounds are running
    return demo, ranks


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_killing_the_demo_ends_its_rank_processes(acl: object, how: signal.Signals) -> None:
    demo, ranks = _demo_with_ranks_running()
    try:
        demo.send_signal(how)
        demo.wait(30)
        took = _wait_gone(ranks, 1.0)
        assert took <= 1.0, f"processes {sorted(p for p in ranks if _alive(p))} outlived the demo ({how.name})"
    finally:
        demo.kill()
        _kill_all(ranks)


def test_repeated_ctrl_c_ends_the_demo_with_one_line(acl: object) -> None:
    demo, ranks = _demo_with_ranks_running()
    try:
        for _ in range(4):  # again and again, while the launcher stops its ranks
            demo.send_signal(signal.SIGINT)
            time.sleep(0.05)
        _, err = demo.communicate(timeout=30)
        # 130, or ended by a SIGINT that arrived after the interpreter restored the default handler on exit
        assert demo.returncode in (130, -signal.SIGINT), err
        assert "Traceback" not in err, err
        assert err.strip().splitlines()[-1].endswith("interrupted"), err
        assert _wait_gone(ranks, 1.0) <= 1.0
    finally:
        demo.kill()
        _kill_all(ranks)


REPORTING_LAUNCHER = LAUNCHER.replace(
    '    spawn(rank, 2, sys.argv[2], start_method=sys.argv[1], timeout=300)',
    '    try:\n'
    '        spawn(rank, 2, sys.argv[2], start_method=sys.argv[1], timeout=300)\n'
    '    except Exception as exc:\n'
    '        print(exc, flush=True)')


def test_a_killed_fork_server_is_named_as_the_ranks_end(acl: object, tmp_path: Path) -> None:
    """The fork server killed under the ranks: they die with it (their parent-death signal), and the
    launcher says so instead of multiprocessing's stand-in exit code 255."""
    script = tmp_path / "launcher.py"
    script.write_text(REPORTING_LAUNCHER)
    launcher = subprocess.Popen([sys.executable, str(script), "forkserver", str(tmp_path)], env=_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ranks: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        while len(ranks) < 2 and time.monotonic() < deadline and launcher.poll() is None:
            ranks = {int(p.read_text()) for p in tmp_path.glob("rank*.pid") if p.read_text()}
            time.sleep(0.05)
        assert len(ranks) == 2, "the ranks did not start"
        servers = {p for p in _descendants(launcher.pid) - ranks
                   if b"forkserver" in Path(f"/proc/{p}/cmdline").read_bytes()}
        assert len(servers) == 1, servers
        os.kill(servers.pop(), signal.SIGKILL)
        out, err = launcher.communicate(timeout=30)
        assert "fork server that started it was killed" in out, (out, err)
        assert "code 255" not in out
    finally:
        launcher.kill()
        _kill_all(ranks)
