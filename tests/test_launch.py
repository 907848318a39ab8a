"""aclnn_py.worlds: spawn (processes), run_threads, mpi_bootstrap (under mpiexec)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import package_pythonpath
from helpers import launch_ranks as lr
from helpers.hccl_ranks import pid_gone

REPO = Path(__file__).resolve().parents[1]


def _pids(pid_dir: Path) -> list[int]:
    return [int(p.read_text()) for p in pid_dir.iterdir() if p.read_text()]


def _children(pid: int) -> list[tuple[int, str]]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (d / "cmdline").read_text(errors="replace").replace("\0", " ")
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] not in ("Z", "X"):
            out.append((int(d.name), cmd))
    return out


def _no_children_left() -> bool:
    """No rank process is left: our only children are multiprocessing's fork server and resource
    tracker (which live as long as this process), and the fork server has no children."""
    for pid, cmd in _children(os.getpid()):
        if "resource_tracker" in cmd:
            continue
        if "forkserver" in cmd:
            if _children(pid):
                return False
            continue
        return False
    return True


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_spawn_returns_in_rank_order_with_device_set(acl, start_method):
    from aclnn_py import worlds

    n = 4 if start_method == "forkserver" else 2
    res = worlds.spawn(lr.identify, n, "x", timeout=60, start_method=start_method)
    assert [r["rank"] for r in res] == list(range(n))
    assert [r["device"] for r in res] == list(range(n))
    assert all(r["world_size"] == n and r["root_len"] == 4108 and r["tag"] == "x" for r in res)
    assert len({r["pid"] for r in res}) == n and os.getpid() not in {r["pid"] for r in res}
    assert len({r["root"] for r in res}) == 1


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_spawned_ranks_leave_what_they_inherit_out_of_their_collections(acl, start_method):
    # numpy and the package, imported before the rank's function runs: a rank's collections would
    # otherwise walk them all (and dirty the pages the fork shared)
    from aclnn_py import worlds

    for frozen, walked in worlds.spawn(lr.collection_reach, 2, timeout=60, start_method=start_method):
        assert frozen > 10_000
        assert walked < frozen / 4


LAUNCHER = """
import aclnn_py
from aclnn_py.worlds import spawn

def where(rank, world_size, root):
    import aclnn_py
    return aclnn_py.__file__

if __name__ == "__main__":
    print(set(spawn(where, 2, timeout=60)) == {aclnn_py.__file__})
"""


def test_spawn_from_a_folder_holding_another_copy_of_the_package(tmp_path):
    """A launcher whose working directory holds another aclnn_py (an installed package run from its
    source checkout): the ranks use the launcher's package, not the working directory's."""
    checkout = tmp_path / "checkout"
    (checkout / "aclnn_py").mkdir(parents=True)
    (checkout / "aclnn_py" / "__init__.py").write_text("DECOY = True\n")
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    env = dict(os.environ, PYTHONPATH=package_pythonpath(dict(os.environ)))
    env.pop("PYTHONSAFEPATH", None)  # as a user has it: `python -c` puts the working directory first
    res = subprocess.run([sys.executable, str(script)], cwd=checkout, env=env, capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.returncode == 0 and res.stdout.strip() == "True", res.stdout + res.stderr


PRELOADING = """
import sys
from aclnn_py.worlds import spawn

def probe(rank, world_size, root):
    import os
    loaded = "probe_mod" in sys.modules  # before the rank imports it itself
    from aclnn_py.ops import _layout
    layouts_inherited = bool(_layout._layouts)  # no operator was called in this process
    import probe_mod
    return loaded, probe_mod.IMPORTED_BY != os.getpid(), layouts_inherited

if __name__ == "__main__":
    print(set(spawn(probe, 2, timeout=60, preload=sys.argv[1:])))
"""


@pytest.mark.parametrize("preload", [["probe_mod"], []])
def test_spawn_preload_imports_modules_once_in_the_fork_server(tmp_path, preload):
    """A module named in `preload` is imported by the fork server before it forks the ranks: each rank
    finds it loaded, imported by another process; without it, each rank imports it itself. Either way
    the server has parsed the run helpers' layouts, which a rank's first operator call needs."""
    (tmp_path / "probe_mod.py").write_text("import os\nIMPORTED_BY = os.getpid()\n")
    script = tmp_path / "launcher.py"
    script.write_text(PRELOADING)
    env = dict(os.environ, PYTHONPATH=package_pythonpath(dict(os.environ)))
    res = subprocess.run([sys.executable, str(script), *preload], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120, check=False)
    want = {(True, True, True)} if preload else {(False, False, True)}
    assert res.returncode == 0 and res.stdout.strip() == str(want), res.stdout + res.stderr


UNGUARDED = """
from aclnn_py.worlds import spawn


def rank_main(rank, world_size, root):
    return rank


print(spawn(rank_main, 2, start_method={start_method!r}, timeout=60))
"""


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_spawn_without_the_main_guard_fails_with_one_line_naming_it(tmp_path, start_method):
    """Each rank imports the launching script; an unguarded spawn() there used to print every rank's
    traceback and a RankError. The launcher raises one RuntimeError; the ranks exit silently."""
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED.format(start_method=start_method))
    env = dict(os.environ, PYTHONPATH=package_pythonpath(dict(os.environ)), ACLNN_PY_BACKEND="mock")
    res = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.returncode == 1 and res.stdout == "", res.stdout + res.stderr
    assert res.stderr.count("Traceback") == 1 and "RankError" not in res.stderr, res.stderr
    assert res.stderr.strip().splitlines()[-1] == (
        "RuntimeError: spawn() was called again in the rank processes: they import the launching script (as "
        "__mp_main__) and its top level calls spawn(); put that call under `if __name__ == \"__main__\":`")


def test_spawn_hccl_world(acl, monkeypatch):
    from aclnn_py import worlds

    monkeypatch.setenv("HCCL_BUFFSIZE", "2")
    names = worlds.spawn(lr.barrier_world, 3, timeout=60)
    assert len(set(names)) == 3


def test_spawn_propagates_exception_and_kills_the_rest(acl, tmp_path):
    from aclnn_py import worlds

    t0 = time.monotonic()
    with pytest.raises(ValueError, match="boom on rank 2") as ei:
        worlds.spawn(lr.fail_on, 4, 2, str(tmp_path), timeout=60)
    assert time.monotonic() - t0 < 20
    assert ei.value.rank == 2
    assert isinstance(ei.value.__cause__, worlds.RemoteTraceback)
    assert "fail_on" in str(ei.value.__cause__)  # the rank's own traceback
    pids = _pids(tmp_path)
    assert len(pids) >= 1
    assert all(pid_gone(p) for p in pids)
    assert _no_children_left()


def test_spawn_propagates_hccl_error_with_its_type(acl):
    from aclnn_py import worlds
    from aclnn_py.errors import HcclError

    with pytest.raises(HcclError) as ei:
        worlds.spawn(lr.hccl_error_on, 2, 1, timeout=60)
    assert ei.value.code == 1 and ei.value.name == "HCCL_E_PARA"
    assert "HcclGetRootInfo" in ei.value.message


def test_spawn_rank_killed_by_signal(acl, tmp_path):
    from aclnn_py import worlds

    with pytest.raises(worlds.RankError, match="rank 1: .*SIGKILL"):
        worlds.spawn(lr.die_on, 3, 1, str(tmp_path), timeout=60)
    assert all(pid_gone(p) for p in _pids(tmp_path))
    assert _no_children_left()


def test_spawn_timeout_kills_everything(acl, tmp_path):
    from aclnn_py import worlds

    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"ranks \[0, 1, 2\] of 3"):
        worlds.spawn(lr.sleep_forever, 3, str(tmp_path), timeout=1.5)
    assert time.monotonic() - t0 < 10
    pids = _pids(tmp_path)
    assert all(pid_gone(p) for p in pids)
    assert _no_children_left()


def test_spawn_rejects_fork(acl):
    from aclnn_py import worlds

    with pytest.raises(ValueError, match="fork"):
        worlds.spawn(lr.identify, 2, "x", start_method="fork")


def test_run_threads(acl):
    from aclnn_py import worlds

    res = worlds.run_threads(lr.identify, 5, "t", timeout=30)
    assert [r["rank"] for r in res] == list(range(5))
    assert [r["device"] for r in res] == list(range(5))
    assert {r["pid"] for r in res} == {os.getpid()}


def test_run_threads_propagates_exception(acl):
    from aclnn_py import worlds

    def fn(rank, world_size, root):
        if rank == 1:
            raise KeyError("thread boom")
        return rank

    with pytest.raises(KeyError, match="thread boom") as ei:
        worlds.run_threads(fn, 3, timeout=30)
    assert ei.value.rank == 1
    assert "thread boom" in str(ei.value.__cause__)


def test_run_threads_timeout(acl):
    import threading

    from aclnn_py import worlds

    stop = threading.Event()

    def fn(rank, world_size, root):
        if rank == 0:
            stop.wait(30)
        return rank

    try:
        with pytest.raises(TimeoutError, match=r"ranks \[0\]"):
            worlds.run_threads(fn, 2, timeout=0.5)
    finally:
        stop.set()


needs_two_cpus = pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                                    reason="needs a process that may use two CPUs or more")


def test_run_threads_widens_the_switch_interval_and_the_young_generation_while_its_world_runs(acl):
    """A thread world of W ranks runs with a switch interval of at least W ms (its waiting ranks ask for
    the GIL less often) and a first collector threshold of at least 100 objects per rank; the
    interpreter's own settings are back once the world has ended, also after a rank failed."""
    import gc

    from aclnn_py import worlds

    before, thresholds = sys.getswitchinterval(), gc.get_threshold()
    seen = worlds.run_threads(lambda rank, world_size, root: (sys.getswitchinterval(), gc.get_threshold()), 40,
                              timeout=30)
    assert set(seen) == {(max(before, 0.040), (max(thresholds[0], 4000), *thresholds[1:]))}
    assert (sys.getswitchinterval(), gc.get_threshold()) == (before, thresholds)

    def fails(rank, world_size, root):
        raise KeyError("boom")

    with pytest.raises(KeyError):
        worlds.run_threads(fails, 40, timeout=30)
    assert (sys.getswitchinterval(), gc.get_threshold()) == (before, thresholds)


def test_run_threads_leaves_a_disabled_young_threshold_alone(acl):
    """A process that set the first threshold to 0 (no automatic collection) keeps it in a thread world."""
    import gc

    from aclnn_py import worlds

    thresholds = gc.get_threshold()
    gc.set_threshold(0, *thresholds[1:])
    try:
        seen = worlds.run_threads(lambda rank, world_size, root: gc.get_threshold()[0], 8, timeout=30)
        assert seen == [0] * 8
    finally:
        gc.set_threshold(*thresholds)


@needs_two_cpus
def test_run_threads_shares_one_cpu_when_told(acl):
    """With share_one_cpu the rank threads run on one CPU, the same for every rank, and the launching
    thread keeps its CPUs; by default each rank keeps the CPUs it was given."""
    from aclnn_py import worlds

    allowed = os.sched_getaffinity(0)
    shared = worlds.run_threads(lambda rank, world_size, root: os.sched_getaffinity(0), 4, timeout=30,
                                share_one_cpu=True)
    assert len(shared[0]) == 1 and shared[0] <= allowed and all(a == shared[0] for a in shared)
    assert os.sched_getaffinity(0) == allowed
    spread = worlds.run_threads(lambda rank, world_size, root: os.sched_getaffinity(0), 4, timeout=30)
    assert all(a == allowed for a in spread)


@needs_two_cpus
def test_run_threads_starts_the_ranks_from_the_cpu_they_share(acl, monkeypatch):
    """With share_one_cpu the launching thread starts each rank from the CPU the ranks share (a start
    waits for the new thread to run: on one CPU that hand-over costs half as much), and runs where it
    ran before once they have started."""
    import threading

    from aclnn_py import worlds

    allowed = os.sched_getaffinity(0)
    starters: list[set[int]] = []
    real_start = threading.Thread.start

    def start(self):
        starters.append(os.sched_getaffinity(0))
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    ranks = worlds.run_threads(lambda rank, world_size, root: os.sched_getaffinity(0), 4, timeout=30,
                               share_one_cpu=True)
    assert len(starters) == 4 and all(s == ranks[0] for s in starters) and len(ranks[0]) == 1
    assert os.sched_getaffinity(0) == allowed


needs_batch_policy = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH") or os.sched_getscheduler(0) != os.SCHED_OTHER,
                                        reason="needs Linux scheduling policies and a thread of the normal one")


@needs_two_cpus
@needs_batch_policy
def test_ranks_sharing_a_cpu_run_as_batch_threads(acl):
    """Sharing a CPU, the ranks are batch threads (a rank woken by its peers does not preempt the one
    running, which may hold the GIL); the launching thread keeps its policy, and ranks spread over the
    CPUs keep the normal one."""
    from aclnn_py import worlds

    def policy(rank, world_size, root):
        return os.sched_getscheduler(0)

    assert worlds.run_threads(policy, 4, timeout=30, share_one_cpu=True) == [os.SCHED_BATCH] * 4
    assert os.sched_getscheduler(0) == os.SCHED_OTHER
    assert worlds.run_threads(policy, 4, timeout=30) == [os.SCHED_OTHER] * 4


@needs_two_cpus
@needs_batch_policy
@pytest.mark.parametrize("refused", ["setting", "other policy"])
def test_ranks_sharing_a_cpu_keep_the_policy_they_may_not_or_should_not_leave(acl, monkeypatch, refused):
    """Where the policy cannot be set (a sandbox refuses it) the world runs with the normal one; a
    launching thread of another policy (real-time, say) is left as it is."""
    from aclnn_py import worlds

    policy_of = os.sched_getscheduler
    if refused == "setting":
        def refuse(pid, policy, param):
            raise PermissionError(1, "Operation not permitted")

        monkeypatch.setattr(worlds.os, "sched_setscheduler", refuse)
    else:
        monkeypatch.setattr(worlds.os, "sched_getscheduler", lambda pid: os.SCHED_FIFO)
    ranks = worlds.run_threads(lambda rank, world_size, root: policy_of(0), 4, timeout=30, share_one_cpu=True)
    assert ranks == [os.SCHED_OTHER] * 4
    assert policy_of(0) == os.SCHED_OTHER


@needs_batch_policy
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs a thread that can be bound to one CPU")
def test_spawned_ranks_outnumbering_the_cpus_run_as_batch_processes(acl):
    """Launched from a thread bound to one CPU (a fresh interpreter per rank inherits it), two ranks
    outnumber their CPUs and run as batch processes; one rank does not."""
    from aclnn_py import worlds

    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})
    try:
        two = worlds.spawn(lr.scheduling_policy, 2, timeout=120, start_method="spawn")
        one = worlds.spawn(lr.scheduling_policy, 1, timeout=120, start_method="spawn")
    finally:
        os.sched_setaffinity(0, allowed)
    assert two == [os.SCHED_BATCH] * 2
    assert one == [os.SCHED_OTHER]


def test_run_threads_share_one_cpu_binds_nothing_where_the_process_has_one_cpu(acl, monkeypatch):
    """Where the process may use a single CPU (or threads cannot be bound), share_one_cpu changes
    nothing: the ranks run with the CPUs they were given, and no affinity call is made."""
    from aclnn_py import worlds

    calls: list[object] = []
    monkeypatch.setattr(worlds.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    monkeypatch.setattr(worlds.os, "sched_setaffinity", lambda pid, cpus: calls.append(cpus), raising=False)
    assert worlds.run_threads(lambda rank, world_size, root: rank, 4, timeout=30, share_one_cpu=True) == [0, 1, 2, 3]
    assert calls == []


def test_run_threads_runs_no_rank_when_its_threads_cannot_all_start(acl, monkeypatch):
    """Ranks start together once every thread exists; when the process can start no more threads, the
    error is raised and none of the threads started runs the function (it would wait for peers that
    never come)."""
    import threading

    from aclnn_py import worlds

    ran: list[int] = []
    real_start = threading.Thread.start
    starts = []

    def start(self):
        starts.append(self)
        if len(starts) == 3:
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    before = sys.getswitchinterval()
    with pytest.raises(RuntimeError, match="can't start new thread"):
        worlds.run_threads(lambda rank, world_size, root: ran.append(rank), 4, timeout=30)
    for t in starts[:2]:
        t.join(10)
        assert not t.is_alive()
    assert ran == []
    assert sys.getswitchinterval() == before


# ---- on_rank_failure="wait" -------------------------------------------------------------------------
def test_spawn_wait_returns_every_outcome_in_rank_order(acl, tmp_path):
    from aclnn_py import worlds

    res = worlds.spawn(lr.mixed_outcomes, 4, str(tmp_path), timeout=60, on_rank_failure="wait")
    assert res[0] == 0 and res[3] == 30          # the others ran to their end
    assert isinstance(res[1], worlds.RankError) and res[1].rank == 1
    assert "killed by signal 9 (SIGKILL)" in str(res[1])
    assert isinstance(res[2], ValueError) and str(res[2]) == "boom on rank 2"
    assert res[2].rank == 2
    assert isinstance(res[2].__cause__, worlds.RemoteTraceback) and "mixed_outcomes" in str(res[2].__cause__)
    assert all(pid_gone(p) for p in _pids(tmp_path))
    assert _no_children_left()


def test_spawn_stop_is_the_default(acl, tmp_path):
    from aclnn_py import worlds

    t0 = time.monotonic()
    with pytest.raises((worlds.RankError, ValueError)):
        worlds.spawn(lr.mixed_outcomes, 4, str(tmp_path), timeout=60)
    assert time.monotonic() - t0 < 20
    assert _no_children_left()


def test_spawn_wait_still_times_out(acl, tmp_path):
    from aclnn_py import worlds

    with pytest.raises(TimeoutError, match=r"ranks \[0, 1\] of 2"):
        worlds.spawn(lr.sleep_forever, 2, str(tmp_path), timeout=1.5, on_rank_failure="wait")
    assert all(pid_gone(p) for p in _pids(tmp_path))
    assert _no_children_left()


def test_on_rank_failure_is_checked(acl):
    from aclnn_py import worlds

    for run in (worlds.spawn, worlds.run_threads):
        with pytest.raises(ValueError, match="on_rank_failure must be 'stop' or 'wait'"):
            run(lr.identify, 2, "x", on_rank_failure="ignore")  # type: ignore[call-overload]


def test_spawn_wait_when_rank0_fails_before_the_root_info(acl):
    """The other ranks would wait for a root info that never comes: they are told, and fail."""
    import multiprocessing as mp

    from aclnn_py import worlds

    ctx = mp.get_context("forkserver")
    procs, conns = [], []
    for r in range(3):
        parent_end, child_end = ctx.Pipe(duplex=True)
        if r == 0:
            p = ctx.Process(target=lr.rank0_without_root, args=(child_end,))
        else:
            me = (os.getpid(), worlds._process_start_time(os.getpid()))
            p = ctx.Process(target=worlds._child_main,
                            args=(r, 3, child_end, me, lr.identify, ("x",), False, dict(os.environ)))
        p.start()
        child_end.close()
        procs.append(p)
        conns.append(parent_end)
    try:
        res = worlds._Supervisor(procs, conns, keep_going=True).run(30)
    finally:
        worlds._stop(procs)
    assert isinstance(res[0], OSError) and res[0].rank == 0
    for r in (1, 2):
        assert isinstance(res[r], RuntimeError) and "rank 0 failed before it made the HCCL root info" in str(res[r])


def test_run_threads_wait(acl):
    from aclnn_py import worlds

    def fn(rank, world_size, root):
        if rank == 1:
            raise KeyError("thread boom")
        time.sleep(0.2)
        return rank

    res = worlds.run_threads(fn, 3, timeout=30, on_rank_failure="wait")
    assert res[0] == 0 and res[2] == 2
    assert isinstance(res[1], KeyError) and res[1].rank == 1
    assert "thread boom" in str(res[1].__cause__)


def test_mpi_bootstrap_under_mpiexec():
    mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        pytest.skip("mpiexec is not installed (CI installs pip's mpich and mpi4py)")
    pytest.importorskip("mpi4py", reason="mpi4py is not installed (pip install 'aclnn-py[mpi]')")
    env = dict(os.environ, ACLNN_PY_BACKEND="mock", HCCL_BUFFSIZE="2")
    env["PYTHONPATH"] = package_pythonpath(env)
    script = REPO / "tests" / "helpers" / "mpi_world.py"
    res = subprocess.run([mpiexec, "-n", "4", sys.executable, str(script)],
                         capture_output=True, text=True, timeout=120, env=env, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "MPI-OK 4" in res.stdout
