"""``python -m benchmarks`` (run from the checkout's root): the quick run end to end (every figure of the README is in its one JSON
document, including the C floors and the thread worlds), progress and quiet, the C floor calling
the backend's own functions, the markdown tables and the README update, and the failure rows of the
scaling sweep and of thread worlds, the command line's user errors. No timing assertions: performance
is measured, not asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import package_pythonpath

REPO = Path(__file__).resolve().parents[2]
# The benchmarks are a package of the checkout, not of the wheel. Appended, so that aclnn_py itself
# still comes from the installation under test.
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))

from benchmarks import report, scaling, thread_worlds  # noqa: E402
from benchmarks.progress import Progress  # noqa: E402

PATHS = ("buffer", "buffer_host", "buffer_varying", "ctypes", "per_call", "c_per_call", "plan", "c_plan", "plan_reuse", "c_plan_reuse")
RATIOS = ("ctypes_over_plan", "per_call_over_plan", "plan_over_c_plan", "per_call_over_c_per_call",
          "plan_reuse_over_c_plan_reuse", "buffer_over_per_call", "buffer_over_c_per_call", "buffer_host_over_buffer",
          "buffer_varying_over_buffer")


def run_bench(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks <args>`` in the checkout's root, as its docs say to run it."""
    env = dict(os.environ, ACLNN_PY_BACKEND="mock")
    env["PYTHONPATH"] = package_pythonpath(env)
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def test_bench_quick_json():
    proc = run_bench("--quick", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout)  # exactly one document: trailing text would fail here
    assert "host overhead" not in proc.stderr and "scaling: W=" not in proc.stderr  # --json is quiet
    assert r["command"] == "python -m benchmarks --quick --json"
    assert r["machine"]["cpus"] == os.cpu_count() and r["machine"]["cpu_model"] and r["machine"]["date"]
    for op in ("dispatch", "combine"):
        row = r["host_overhead"][op]
        for path in PATHS:
            assert 0 < row[path]["min_us"] <= row[path]["median_us"] <= row[path]["max_us"], (op, path)
        for key in RATIOS:
            assert row[key] > 0, (op, key)
        for key, a, b in (("plan_over_c_plan", "plan", "c_plan"),
                          ("per_call_over_c_per_call", "per_call", "c_per_call"),
                          ("buffer_over_per_call", "buffer", "per_call")):
            # a median of per-repeat ratios lies within what the two paths' ranges allow
            assert row[a]["min_us"] / row[b]["max_us"] <= row[key] <= row[a]["max_us"] / row[b]["min_us"], (op, key)
    assert r["host_overhead"]["dispatch"]["plan_rebinds"] == ["x", "expert_ids"]
    pool = r["pool"]["alloc_free"]
    assert pool["sizes_bytes"] and all(n > 0 for n in pool["sizes_bytes"])
    for path in ("pooled", "aclrtmalloc_aclrtfree"):
        assert 0 < pool[path]["min_us"] <= pool[path]["median_us"] <= pool[path]["max_us"], path
    assert pool["pooled_over_aclrtmalloc"] > 0
    assert "pool.alloc_free (256 B, 64 KiB, 1 MiB, 14 MiB in turn): pool " in report.text(r)
    t = r["throughput"]
    assert t["bytes_moved"] > 0 and t["round_s"]["median"] > 0 and t["memcpy_floor_s"] > 0
    assert t["golden_round_s"] > 0 and t["round_over_memcpy_floor"] > 0
    assert [s["world_size"] for s in r["scaling"]] == [2, 4]
    phases = ("startup_s", "first_round_ms", "round_ms", "host_round_ms", "teardown_s")
    assert all(all(s[k] > 0 for k in phases) and s["round_ms_min"] <= s["round_ms"] <= s["round_ms_max"]
               and s["peak_rss_mb_per_rank"] > 0 and s["pss_mb_total"] > 0 and s["shm_touched_mb"] > 0
               for s in r["scaling"]), r["scaling"]
    tw = r["thread_worlds"]
    assert [(w["soc"], w["world_size"]) for w in tw] == [("Ascend910_93", 8), ("Ascend950", 8)]
    assert all(w["golden_match"] and all(w[k] > 0 for k in phases) and w["peak_rss_mb"] > 0
               and w["shm_touched_mb"] > 0 and w["c_loop_round_ms"] > 0 for w in tw), tw


def test_progress_on_stderr_names_stages_and_sizes():
    proc = run_bench("--sections", "scaling", "--max-world", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "scaling: W=2 processes" in proc.stderr
    assert "W=   2  start-up" in proc.stdout and "scaling: W=" not in proc.stdout
    quiet = run_bench("--sections", "scaling", "--max-world", "2", "--quiet")
    assert quiet.returncode == 0 and quiet.stderr == "" and "W=   2  start-up" in quiet.stdout


def test_help_shows_defaults():
    proc = run_bench("--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    for expected in ("(default: 2000; --quick: 300)", "(default: 15; --quick: 3)", "(default: 512; --quick: 4)", "A3:64-768",
                     "950:128-1024", "(default: 4096)"):
        assert expected in text, expected


def test_every_option_says_its_default():
    from benchmarks.cli import build_parser

    parser = build_parser()
    formatter = parser._get_formatter()
    for action in parser._actions:
        if action.nargs == 0:
            continue  # flags and --help
        text = formatter._expand_help(action)
        assert "(default: " in text, (action.option_strings, text)


def test_help_states_exit_codes_and_what_the_default_run_takes():
    proc = run_bench("--help")
    assert proc.returncode == 0 and proc.stdout.startswith("usage: python -m benchmarks")
    text = " ".join(proc.stdout.split())
    for expected in ("exit status: 0 the bench ran", "2 a usage error", "3 an internal error",
                     "2-core machine with 23.5 GiB", "about 1.5 minutes", "about 7 GiB in use at once",
                     "--quick takes a few seconds"):
        assert expected in text, expected


def test_quick_prints_readable_lines_not_python_dicts():
    r = run_bench("--quick")
    assert r.returncode == 0, r.stderr[-3000:]
    model = "W = 4 processes, 16 tokens/rank, H = 2048, K = 4, 16 experts, quant 2, bf16"
    assert f"round ({model}): " in r.stdout and f"throughput: 2 timed rounds ({model})" in r.stderr
    for text in (r.stdout, r.stderr):
        assert "{'" not in text and "': " not in text, text


USER_ERRORS = [
    (["--calls", "0"], "python -m benchmarks: error: argument --calls: must be >= 1 (got 0)"),
    (["--repeats", "0"], "python -m benchmarks: error: argument --repeats: must be >= 1 (got 0)"),
    (["--rounds", "x"], "python -m benchmarks: error: argument --rounds: invalid int value: 'x'"),
    (["--from", "/nonexistent/report.json"],
     "python -m benchmarks: error: argument --from: cannot read /nonexistent/report.json: No such file or directory"),
    (["--json", "--markdown"], "python -m benchmarks: error: choose one of --json and --markdown"),
]


@pytest.mark.parametrize("argv,expected", USER_ERRORS, ids=[" ".join(a) for a, _ in USER_ERRORS])
def test_user_errors_are_one_line_and_exit_2(argv, expected, capsys):
    assert cli_main(*argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(expected) and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("content", ["not json at all", "[1, 2]", '{"machine": {}}', '{"host_overhead": {}}',
                                     "\x00\xff binary"])
def test_from_a_file_that_is_not_a_saved_report_is_a_user_error(tmp_path, content):
    saved = tmp_path / "report.json"
    saved.write_bytes(content.encode("latin-1"))
    r = run_bench("--from", str(saved))
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr == (f"python -m benchmarks: error: argument --from: {saved} is not a report saved from `python "
                        "-m benchmarks --json` (a JSON object with 'machine' and one of host_overhead, pool, "
                        "throughput, scaling, thread_worlds) (see python -m benchmarks --help)\n")


def test_internal_error_prints_its_traceback_and_exits_3(monkeypatch, capsys):
    from benchmarks import cli

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the bench")

    monkeypatch.setattr(cli, "run", broken)
    assert cli_main("--quick", "--quiet") == 3
    err = capsys.readouterr().err
    assert "RuntimeError: a bug in the bench" in err
    assert err.strip().endswith("python -m benchmarks: internal error (traceback above)")


# ---- the C floor -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def floor(acl):
    from benchmarks.c_floor import CFloor

    return CFloor()


def test_c_floor_is_compiled_from_the_checkout_once(tmp_path, monkeypatch):
    from benchmarks import c_floor

    monkeypatch.setenv(c_floor.ENV_BUILD, str(tmp_path / "floor"))
    lib = c_floor.library_path()
    assert lib.parent == tmp_path / "floor" and lib.name.startswith("libaclnnpy_floor-") and lib.is_file()
    built = lib.stat().st_mtime_ns
    assert c_floor.library_path() == lib and lib.stat().st_mtime_ns == built  # reused, not rebuilt
    assert [f.name for f in lib.parent.iterdir()] == [lib.name]  # no temporary file left behind
    monkeypatch.setenv("CC", "cc -DAN_OPTION_THAT_CHANGES_THE_BUILD")
    assert c_floor.library_path() != lib  # another compiler command is another build


def test_c_floor_build_failure_names_the_command(tmp_path, monkeypatch):
    from benchmarks import c_floor

    monkeypatch.setenv(c_floor.ENV_BUILD, str(tmp_path))
    monkeypatch.setenv("CC", "cc -DFLOOR_BROKEN=1 -include /nonexistent/header.h")
    with pytest.raises(c_floor.FloorError, match=r"compiling the C floor failed \(cc -DFLOOR_BROKEN=1 .*nonexistent"):
        c_floor.library_path()
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with pytest.raises(c_floor.FloorError, match="cannot run the C compiler '/nonexistent/cc'"):
        c_floor.library_path()
    assert list(tmp_path.iterdir()) == []


def test_c_floor_calls_the_bindings_own_functions(acl, floor):
    from benchmarks.c_floor import SYMBOLS

    b = acl.backend()
    lib = b.lib._raw
    index = {b.ffi.string(lib.aclnnpy_symbol_name(i)).decode(): i for i in range(lib.aclnnpy_symbol_count())}
    for sym in SYMBOLS:
        assert floor.bound_address(sym) == lib.aclnnpy_address_of(index[sym]) != 0, sym


def test_c_floor_loops_reach_each_function_and_report_its_status(floor):
    from benchmarks.c_floor import COMBINE, DISPATCH, FloorError

    # NULL descriptors: phase 1 refuses them, so the loop stops at its first call and says which
    with pytest.raises(FloorError, match=r"aclnnMoeDistributeDispatchV5GetWorkspaceSize returned 161001"):
        floor.dispatch_per_call([0] * 15, [2, 0, 2, 1] + [0] * 11, b"", 0, 0, 0, 5)
    with pytest.raises(FloorError, match=r"aclnnMoeDistributeCombineV5GetWorkspaceSize returned 161001"):
        floor.combine_per_call([0] * 20, [2, 0, 2, 1] + [0] * 12, b"", 0, 0, 0, 5)
    # a NULL executor: the rebinding call refuses it first; without slots, the launch does
    with pytest.raises(FloorError, match=r"aclSetInputTensorAddr returned 561103"):
        floor.plan(DISPATCH, 0, [1], [0], [[0]], 0, 0, 0, 3)
    with pytest.raises(FloorError, match=r"aclnnMoeDistributeCombineV5 returned 561103"):
        floor.plan(COMBINE, 0, [], [], [[]], 0, 0, 0, 3)
    with pytest.raises(ValueError, match="need 15 tensors"):
        floor.dispatch_per_call([0] * 14, [0] * 15, b"", 0, 0, 0, 1)


# ---- markdown and the README update ---------------------------------------------------------------------

def _us(m: float) -> dict[str, float]:
    return {"median_us": m, "min_us": m * 0.9, "max_us": m * 1.5}


def small_report() -> dict:
    paths = dict(ctypes=90.0, per_call=40.0, c_per_call=8.0, plan=12.0, c_plan=6.0, plan_reuse=5.0, c_plan_reuse=2.0)
    op = {p: _us(v) for p, v in paths.items()}
    op.update(ctypes_over_plan=7.5, per_call_over_plan=3.33, plan_over_c_plan=2.0, per_call_over_c_per_call=5.0,
              plan_reuse_over_c_plan_reuse=2.5, plan_rebinds=["x", "expert_ids"])
    return {
        "command": "python -m benchmarks --json --max-world 8",
        "machine": {"cpus": 2, "cpu_model": "Test CPU 9000", "memory_gib": 23.4, "date": "2025-01-02"},
        "host_overhead": {"dispatch": op, "combine": op},
        "pool": {"alloc_free": {"sizes_bytes": [256, 65536, 1 << 20], "pooled": _us(2.0),
                                "aclrtmalloc_aclrtfree": _us(6.0), "pooled_over_aclrtmalloc": 0.33}},
        "throughput": {"model": dict(world_size=8, tokens=128, hidden=7168, topk=8, experts=64, quant_mode=2),
                       "round_s": {"median": 0.09, "min": 0.08, "max": 0.1}, "bytes_moved": 176_000_000,
                       "memcpy_floor_s": 0.043, "golden_round_s": 2.35, "round_over_memcpy_floor": 2.09,
                       "golden_over_round": 26.1, "peak_rss_mb_per_rank": 300.0, "pss_mb_total": 1800.0},
        "scaling": [
            {"world_size": 2, "tokens": 8, "hidden": 2048, "topk": 4, "startup_s": 1.5, "first_round_ms": 3.0,
             "round_ms": 0.2, "host_round_ms": 0.9, "teardown_s": 0.05, "peak_rss_mb_per_rank": 41.0,
             "pss_mb_total": 60.0, "shm_touched_mb": 1.0, "window_mb_per_rank": 400, "wall_s": 0.5},
            {"world_size": 4, "tokens": 8, "hidden": 2048, "topk": 4, "startup_s": 1.6, "first_round_ms": 4.0,
             "round_ms": 1.5, "host_round_ms": 2.5, "teardown_s": 0.06, "growth": 7.5, "peak_rss_mb_per_rank": 42.0,
             "pss_mb_total": 110.0, "shm_touched_mb": 2.0, "window_mb_per_rank": 400, "wall_s": 0.9},
            {"world_size": 8, "tokens": 8, "hidden": 2048, "topk": 4, "error": "TimeoutError: ranks [3] did not finish"},
        ],
        "thread_worlds": [
            {"soc": "Ascend910_93", "world_size": 768, "tokens": 1, "hidden": 1024, "topk": 1, "experts": 768,
             "error": "HcclTimeoutError: rank 3 | gave up"},
            {"soc": "Ascend910_93", "world_size": 384, "tokens": 1, "hidden": 1024, "topk": 1, "experts": 384,
             "startup_s": 0.4, "first_round_ms": 90.0, "round_ms": 25.0, "host_round_ms": 280.0, "teardown_s": 0.1,
             "c_loop_round_ms": 20.0, "peak_rss_mb": 700.0, "golden_match": True, "mismatched_ranks": []},
        ],
    }


def test_markdown_tables():
    md = report.markdown(small_report())
    lines = md.splitlines()
    assert lines[0].startswith("Measured with `python -m benchmarks --json --max-world 8` on 2 cores (Test CPU 9000), "
                               "23.4 GiB, 2025-01-02")
    assert "| host µs per call, median [min–max], kernels skipped | dispatch | combine |" in lines
    assert "| C floor per call (phase 1 + 2, descriptors made once) | 8 [7.2–12] | 8 [7.2–12] |" in lines
    assert "| C floor plan (`aclSetInputTensorAddr` + launch) | 6 [5.4–9] | 6 [5.4–9] |" in lines
    assert "| plan / C plan | 2.0× | 2.0× |" in lines
    assert "| per call / C per call | 5.0× | 5.0× |" in lines
    assert ("Targets in this run — per call ≤ 2× the C per-call loop: dispatch 5.00× not met, combine 5.00× not "
            "met; plan ≤ 1.3× the C plan loop: dispatch 2.00× not met, combine 2.00× not met; per call ≤ 10 µs: "
            "dispatch 40.00 µs not met, combine 40.00 µs not met.") in lines
    assert "| µs per allocation + free, median [min–max] (256 B, 64 KiB, 1 MiB in turn) | µs |" in lines
    assert "| memory pool (`Tensor.empty` + `close`) | 2 [1.8–3] |" in lines
    assert "| pool / aclrtMalloc + aclrtFree | 0.3× |" in lines
    assert any(ln.startswith("| reference round (W = 8 processes, 128 tokens/rank, H = 7168") for ln in lines)
    assert "| numpy golden of the same round | 2.35 s → the mock is 26.1× faster |" in lines
    assert "| W (processes, BS = 8, H = 2048, K = 4, E = 2W) | 2 | 4 |" in lines
    assert "| steady round, device Tensors, ms | 0.2 | 1.5 |" in lines
    assert "| steady round, host arrays, ms | 0.9 | 2.5 |" in lines
    assert "| steady round (device) × per doubling of W | – | 7.50× |" in lines
    assert "| start-up (launch to every buffer ready), s | 1.5 | 1.6 |" in lines
    assert "W = 8 processes: TimeoutError: ranks [3] did not finish" in lines
    # a failure row keeps the table's shape: no raw "|" from the reason
    assert ("| Ascend910_93 | 768 | BS 1, H 1024, K 1, E 768 | failed: HcclTimeoutError: rank 3 / gave up "
            "|  |  |  |  |  |  |  |  |") in lines
    assert ("| Ascend910_93 | 384 | BS 1, H 1024, K 1, E 384 | 0.4 s | 90 ms | 25 ms | 20 ms (1.25×) | 280 ms | – "
            "| 0.1 s | 700 MiB | bit for bit |") in lines
    for ln in lines:  # every table row has as many cells as its header
        if ln.startswith("|"):
            assert ln.count("|") >= 3


def test_paired_ratio_takes_the_median_of_per_repeat_ratios():
    from benchmarks.host_overhead import paired_ratio

    # a burst slowed repeat 1 for both paths: its pair keeps the ratio 2, a ratio of medians would not
    assert paired_ratio([2.0, 20.0, 2.2, 2.0], [1.0, 10.0, 1.1, 1.0]) == 2.0
    assert paired_ratio([3.0, 1.0, 2.0], [1.0, 1.0, 1.0]) == 2.0


def test_python_paths_are_timed_with_the_calls_written_out_and_the_collector_on():
    import gc

    from benchmarks.host_overhead import _written_out

    seen: list[tuple[int, bool]] = []
    run = _written_out("f(a)\nf(b)", f=lambda v: seen.append((v, gc.isenabled())), a=1, b=2)
    assert run(6) > 0
    assert seen == [(1, True), (2, True)] * 3  # each call in turn, as many as asked, GC as in a serving loop


def test_targets_are_judged_per_operator():
    h = small_report()["host_overhead"]
    h = {"dispatch": dict(h["dispatch"], per_call_over_c_per_call=2.0, plan_over_c_plan=1.29,
                          per_call={"median_us": 9.5, "min_us": 9.0, "max_us": 11.0}),
         "combine": dict(h["combine"], per_call_over_c_per_call=2.01)}
    line = report.targets_line(h)
    assert "per call ≤ 2× the C per-call loop: dispatch 2.00× met, combine 2.01× not met" in line
    assert "plan ≤ 1.3× the C plan loop: dispatch 1.29× met, combine 2.00× not met" in line
    assert "per call ≤ 10 µs: dispatch 9.50 µs met, combine 40.00 µs not met" in line
    assert report.targets_line({}) == ""


def test_update_replaces_only_between_markers(tmp_path: Path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\n## Performance\n\n{report.BEGIN}\nold tables\n{report.END}\n\n## Next\ntext\n")
    md = report.markdown(small_report())
    report.update_file(readme, md)
    first = readme.read_text()
    assert first.startswith("# Title\n\n## Performance\n\n" + report.BEGIN + "\nMeasured with")
    assert first.endswith(report.END + "\n\n## Next\ntext\n")
    assert "old tables" not in first and "| plan / C plan | 2.0× | 2.0× |" in first
    report.update_file(readme, md)
    assert readme.read_text() == first  # idempotent


@pytest.mark.parametrize("content", ["no markers at all\n", f"{report.BEGIN}\nonly the start\n",
                                     f"{report.END}\nreversed\n{report.BEGIN}\n",
                                     f"{report.BEGIN}\n{report.END}\n{report.BEGIN}\n{report.END}\n"])
def test_update_refuses_a_file_without_one_pair_of_markers(tmp_path: Path, content: str):
    f = tmp_path / "README.md"
    f.write_text(content)
    with pytest.raises(report.MarkerError, match="bench:"):
        report.update_file(f, "tables\n")
    assert f.read_text() == content


def test_cli_markdown_update_from_a_saved_report(tmp_path: Path, capsys):
    saved = tmp_path / "bench.json"
    saved.write_text(json.dumps(small_report()))
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{report.BEGIN}\n{report.END}\n")
    assert cli_main("--from", str(saved), "--markdown", "--update", str(readme)) == 0
    assert readme.read_text() == f"intro\n{report.BEGIN}\n{report.markdown(small_report()).rstrip()}\n{report.END}\n"
    out, err = capsys.readouterr()
    assert out == "" and f"updated {readme}" in err  # progress on stderr ...
    assert cli_main("--from", str(saved), "--markdown", "--update", str(readme), "--quiet") == 0
    assert capsys.readouterr() == ("", "")  # ... and nothing with --quiet
    assert cli_main("--from", str(saved), "--markdown") == 0
    assert capsys.readouterr().out == report.markdown(small_report())
    broken = tmp_path / "OTHER.md"
    broken.write_text("no markers\n")
    assert cli_main("--from", str(saved), "--markdown", "--update", str(broken)) == 2
    assert "bench:begin" in capsys.readouterr().err and broken.read_text() == "no markers\n"
    assert cli_main("--from", str(saved), "--update", str(readme)) == 2  # a usage error: one line, exit 2
    assert capsys.readouterr().err == "python -m benchmarks: error: --update needs --markdown\n"


def cli_main(*argv: str) -> int:
    from benchmarks.cli import main

    return main(list(argv))


def test_cpu_model_from_cpuinfo(tmp_path: Path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: X\nmodel name\t: Example CPU @ 2.0GHz\n\nprocessor\t: 1\n")
    assert report.cpu_model(str(info)) == "Example CPU @ 2.0GHz"


# ---- scaling sweep and thread worlds: sizes and failure rows -------------------------------------------

def test_world_sizes_double_up_to_the_maximum():
    assert scaling.worlds_up_to(256) == [2, 4, 8, 16, 32, 64, 128, 256]
    assert scaling.worlds_up_to(48) == [2, 4, 8, 16, 32, 48]
    assert scaling.worlds_up_to(2) == [2]


def test_scaling_reports_a_size_that_does_not_fit_as_its_last_row():
    rows = scaling.scaling([2, 4], reserve_mb=1e12)
    assert len(rows) == 1 and rows[0]["world_size"] == 2
    assert rows[0]["error"].startswith("not run: about") and "kept in reserve" in rows[0]["error"]


def test_scaling_reports_a_failed_size_and_stops(monkeypatch):
    seen = []

    def fake_world(spec, timeout):
        seen.append(spec.world_size)
        if spec.world_size == 4:
            raise TimeoutError("spawn: ranks [1, 3] of 4 did not finish within 9 s\nsecond line")
        return {"round_ms": 1.0, "peak_rss_mb_per_rank": 40.0, "pss_mb_total": 70.0, "shm_touched_mb": 0.0}

    monkeypatch.setattr(scaling, "run_process_world", fake_world)
    rows = scaling.scaling([2, 4, 8])
    assert seen == [2, 4]
    assert rows[0]["round_ms"] == 1.0 and rows[0]["pss_mb_total"] == 70.0
    assert rows[1] == {**rows[1], "world_size": 4,
                       "error": "TimeoutError: spawn: ranks [1, 3] of 4 did not finish within 9 s"}


def test_failure_reasons_are_short():
    exc = TimeoutError("HcclCommInitRootInfo: waiting for ranks [3, 5, 8, 9, 12, 13, ... (40 more)] to join "
                       "(12 of 64 joined)\ntraceback line")
    assert scaling.short_reason(exc) == ("TimeoutError: HcclCommInitRootInfo: waiting for ranks [3, 5, 8, 9, …] to join "
                                         "(12 of 64 joined)")
    assert scaling.shorten_rank_lists("ranks [1, 2] and [1, 2, 3, 4]") == "ranks [1, 2] and [1, 2, 3, 4]"
    assert len(scaling.short_reason(RuntimeError("x" * 1000))) == 300


def test_parse_thread_world():
    assert thread_worlds.parse_world("A3:768") == [("Ascend910_93", 768)]
    assert thread_worlds.parse_world("950:1024") == [("Ascend950", 1024)]
    assert thread_worlds.parse_world("Ascend950:16") == [("Ascend950", 16)]
    assert thread_worlds.parse_world("A3:64-768") == [("Ascend910_93", w) for w in (64, 128, 256, 512, 768)]
    for bad in ("A3", "A5:8", "A3:x", "A3:1", "A3:64-32", "A3:8-"):
        with pytest.raises(ValueError, match="SOC:W"):
            thread_worlds.parse_world(bad)


def test_thread_world_failure_is_a_row_and_smaller_sizes_are_tried():
    # H = 100 is outside the operator's hidden range: every rank's dispatch is refused in phase 1
    rows = thread_worlds.thread_worlds([("Ascend910_93", 32)], hidden=100, timeout=120, smallest=16,
                                       progress=Progress(quiet=True))
    assert [(r["world_size"], r["requested_world_size"]) for r in rows] == [(32, 32), (16, 32)]
    for r in rows:
        assert "161002" in r["error"] or "ParamInvalid" in r["error"], r["error"]
        assert "round_ms" not in r


def test_golden_check_of_a_thread_world_finds_a_wrong_rank(acl):
    from aclnn_py.worlds import run_threads

    tw = thread_worlds.ThreadWorld(soc="Ascend910_93", world_size=4, tokens=2, hidden=1024, topk=2)
    ranks = run_threads(thread_worlds.rank_rounds, 4, tw.rounds(), 0.0, timeout=120)
    assert thread_worlds.golden_mismatches(tw, ranks) == []
    x = ranks[2]["x_out"]
    x.view(np.uint16)[0, 0] ^= 1  # one bit of one element
    assert thread_worlds.golden_mismatches(tw, ranks) == [2]


def test_no_rank_makes_its_inputs_before_every_rank_has_ended_its_start_up(acl):
    from aclnn_py.worlds import run_threads
    from benchmarks.world_rounds import WorldRounds, rank_rounds

    inputs_made: list[float] = []

    class Recorded(WorldRounds):
        def demo_model(self):  # the first step of a rank's work after start-up
            inputs_made.append(time.perf_counter())
            return super().demo_model()

    spec = Recorded(8, 1, 1024, 1, experts=8, warmup=0, rounds=1)
    ranks = run_threads(rank_rounds, 8, spec, 0.0, timeout=120)
    # a rank making its inputs early holds the GIL the last ranks need to end their start-up
    assert len(inputs_made) == 8 and min(inputs_made) >= max(r["t_ready"] for r in ranks)


def test_the_timed_host_round_downloads_what_a_user_does_and_the_goldens_keepsakes_come_after(acl, monkeypatch):
    from aclnn_py.tensor import Tensor
    from aclnn_py.worlds import run_threads
    from benchmarks import world_rounds

    timing = threading.local()
    downloads: list[tuple[bool, tuple[int, ...]]] = []  # (inside a timed round, shape)
    numpy = Tensor.numpy

    def recorded(self, *args, **kwargs):
        downloads.append((getattr(timing, "on", False), tuple(self.shape)))
        return numpy(self, *args, **kwargs)

    def timed(phase):
        def run(*args):
            timing.on = True
            try:
                return phase(*args)
            finally:
                timing.on = False
        return run

    monkeypatch.setattr(Tensor, "numpy", recorded)
    for phase in ("_timed_round", "_steady_rounds"):
        monkeypatch.setattr(world_rounds, phase, timed(getattr(world_rounds, phase)))
    tw = thread_worlds.ThreadWorld(soc="Ascend910_93", world_size=2, tokens=2, hidden=1024, topk=2)
    spec = tw.rounds()
    ranks = run_threads(world_rounds.rank_rounds, 2, spec, 0.0, timeout=120)
    assert thread_worlds.golden_mismatches(tw, ranks) == []
    x_out_shape = (2, 1024)
    inside = [shape for on, shape in downloads if on]
    after = [shape for on, shape in downloads if not on]
    # per rank and host round (a warm-up one, the steady ones and one after them): ep_recv_counts,
    # expand_x, expert_token_nums and the combine's x_out
    host_rounds = 1 + spec.rounds + 2
    assert len(inside) == 2 * host_rounds * 4
    assert inside.count(x_out_shape) == 2 * host_rounds
    assert len(after) == 2 and x_out_shape not in after  # each rank's assist info, once, untimed


def test_steady_rounds_run_back_to_back_after_one_barrier(acl, monkeypatch):
    from aclnn_py.hccl import Communicator
    from aclnn_py.worlds import run_threads
    from benchmarks.world_rounds import WorldRounds, rank_rounds

    barriers: list[int] = []
    barrier = Communicator.barrier

    def counted(self, *args, **kwargs):
        barriers.append(self.rank)
        return barrier(self, *args, **kwargs)

    monkeypatch.setattr(Communicator, "barrier", counted)
    counts = []
    for rounds in (1, 4):
        barriers.clear()
        ranks = run_threads(rank_rounds, 2, WorldRounds(2, 1, 1024, 1, experts=2, rounds=rounds), 0.0, timeout=120)
        counts.append(barriers.count(0))
        # the round before the timed ones, then the timed ones
        assert all(len(r["device_ends"]) == len(r["host_ends"]) == rounds + 1 for r in ranks)
    assert counts[0] == counts[1]  # a steady round adds no barrier


def test_a_steady_round_lasts_from_the_slowest_ranks_end_of_the_round_before_to_its_end():
    from benchmarks.world_rounds import WorldRounds, summarize

    spec = WorldRounds(2, 1, 1024, 1, experts=2, rounds=3)
    rank = {"t_launch": 0.0, "t_ready": 0.5, "t_close": 3.0, "device_s": [0.2, 0.1], "host_s": [0.3],
            "peak_rss_mb": 1.0, "pss_mb": 1.0, "shm_mb": 1.0}
    ranks = [{**rank, "device_ends": [1.0, 1.1, 1.3, 1.4], "host_ends": [2.0, 2.5, 2.6, 2.8]},
             {**rank, "device_ends": [1.05, 1.2, 1.3, 1.45], "host_ends": [2.1, 2.4, 2.6, 2.7], "device_s": [0.4, 0.1]}]
    got = summarize(spec, ranks, 3.5)
    # the world's ends: device 1.05, 1.2, 1.3, 1.45 (rounds of 0.15, 0.1, 0.15); host 2.1, 2.5, 2.6, 2.8
    assert got["round_ms"] == pytest.approx(150.0) and got["round_ms_min"] == pytest.approx(100.0)
    assert got["host_round_ms"] == pytest.approx(200.0)
    assert got["first_round_ms"] == pytest.approx(400.0)  # the slowest rank's first warm-up round


def test_small_worlds_run_more_steady_rounds_than_large_ones(monkeypatch):
    from benchmarks.world_rounds import steady_rounds

    assert [steady_rounds(w) for w in (2, 64, 128, 256, 512, 768, 1024)] == [32, 32, 16, 8, 5, 5, 5]
    assert thread_worlds.ThreadWorld(soc="Ascend950", world_size=128).rounds().rounds == 16
    # the process worlds take the same count, unless the caller gives one
    specs = []

    def recorded(spec, timeout):
        specs.append(spec)
        return {"round_ms": 1.0, "pss_mb_total": 1.0}

    monkeypatch.setattr(scaling, "run_process_world", recorded)
    monkeypatch.setattr(scaling, "FIRST_GUESS_MB_PER_RANK", 1.0)  # no memory estimate refuses a size here
    scaling.scaling([64, 256])
    scaling.scaling([64], rounds=3)
    assert [s.rounds for s in specs] == [32, 8, 3]


def test_growth_per_doubling_compares_each_size_with_the_previous_one():
    from benchmarks.world_rounds import growth_per_doubling

    rows = [{"world_size": 32, "round_ms": 1.0}, {"world_size": 64, "round_ms": 2.0},
            {"world_size": 128, "round_ms": 8.0}, {"world_size": 512, "round_ms": 32.0},
            {"world_size": 768, "error": "x"}]
    growth_per_doubling(rows)
    assert "growth" not in rows[0] and "growth" not in rows[1]  # below 64, and the first size above it
    assert rows[2]["growth"] == 4.0 and rows[3]["growth"] == 2.0  # O(W^2), then O(W) over two doublings


def test_plot_draws_round_time_and_memory(tmp_path: Path):
    pytest.importorskip("matplotlib")
    from benchmarks import plot

    r = small_report()
    r["thread_worlds"].append({**r["thread_worlds"][1], "world_size": 768, "round_ms": 40.0})
    written = plot.plot(r, tmp_path / "plots")
    assert sorted(Path(p).name for p in written.values()) == ["memory.png", "round_time.png"]
    for p in written.values():
        assert Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = report.markdown({**r, "plots": written}, relative_to=tmp_path)
    assert "![round time against W](plots/round_time.png)" in md.splitlines()


def test_the_c_loop_round_runs_from_the_round_before_the_timed_ones_to_the_last_or_says_why_not():
    from benchmarks.world_rounds import WorldRounds, _c_loop_figures

    spec = WorldRounds(2, 1, 1024, 1, 2, rounds=2, c_loop=True)
    # rank 1 left the barrier later: the world's rounds run from its first end on
    got = _c_loop_figures(spec, [{"c_loop": [1.0, 1.5, 2.0]}, {"c_loop": [1.2, 1.6, 2.1]}])
    assert got == {"c_loop_round_ms": pytest.approx(1e3 * (2.1 - 1.2) / 2)}
    why = "cannot run the C compiler 'cc' for the C floor"
    assert _c_loop_figures(spec, [{"c_loop": why}] * 2) == {"c_loop_error": why}
    assert _c_loop_figures(WorldRounds(2, 1, 1024, 1, 2), [{}, {}]) == {}
    row = {**small_report()["thread_worlds"][1], "c_loop_error": why}
    del row["c_loop_round_ms"]
    assert any(f"| not run: {why} |" in ln for ln in report.thread_worlds_table([row]))


def test_plot_draws_the_c_loop_of_each_thread_series_as_its_floor(tmp_path: Path, monkeypatch):
    from benchmarks import plot

    drawn: dict[str, tuple[list, list]] = {}
    monkeypatch.setattr(plot, "_draw", lambda path, title, ylabel, lines, floors=(): drawn.update(
        {Path(path).name: (lines, list(floors))}))
    r = small_report()
    r["thread_worlds"].append({**r["thread_worlds"][1], "world_size": 768, "round_ms": 40.0, "c_loop_round_ms": 30.0})
    plot.plot(r, tmp_path)
    lines, floors = drawn["round_time.png"]
    assert floors == [("threads, Ascend910_93, C loop", [384, 768], [20.0, 30.0])]
    assert [label for label, _, _ in lines] == ["threads, Ascend910_93", "processes"]
    assert drawn["memory.png"][1] == []


def test_plot_without_matplotlib_is_a_usage_error(monkeypatch, capsys):
    from benchmarks import cli, plot

    monkeypatch.setattr(plot, "available", lambda: False)
    assert cli.main(["--plot", "out"]) == 2
    assert "--plot needs matplotlib: pip install \".[plot]\"" in capsys.readouterr().err


def test_thread_world_estimated_not_to_fit_is_a_row_not_a_run(monkeypatch):
    from benchmarks import memory

    monkeypatch.setattr(memory, "available_mb", lambda: 10_000.0)
    ran = [{"soc": "Ascend950", "world_size": 256, "peak_rss_mb": 1000.0}]
    assert thread_worlds.memory_refusal(ran, "Ascend950", 512, reserve_mb=4096) is None  # 4000 MiB fits
    why = thread_worlds.memory_refusal(ran, "Ascend950", 1024, reserve_mb=4096)           # 16000 MiB does not
    assert why == ("not run: about 16000 MiB needed (W = 256 took 1000 MiB, x (W / 256)^2), 10000 MiB available, "
                   "4096 MiB kept in reserve")
    assert thread_worlds.memory_refusal(ran, "Ascend910_93", 1024, reserve_mb=4096) is None  # another profile
