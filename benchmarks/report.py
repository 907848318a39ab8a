"""Rendering of a bench report: the machine it ran on, a plain-text summary, the README's
performance tables in markdown, and the update of the README between its markers."""

from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path
from typing import Any

from . import memory
from .throughput import model_label

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


class MarkerError(ValueError):
    """The file to update lacks the bench markers (or has them out of order / more than once)."""


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's "model name" from /proc/cpuinfo (the platform's processor string elsewhere)."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    """Cores, CPU model, memory, date (UTC) and Python of this run."""
    return {"cpus": os.cpu_count(), "cpu_model": cpu_model(), "memory_gib": round(memory.total_mb() / 1024, 1),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
            "python": platform.python_version()}


# ---- small formatting helpers ---------------------------------------------------------------------------

def _num(v: float) -> str:
    """Three significant digits without an exponent: 0.0543, 7.06, 62.9, 1234."""
    if v != v:  # NaN
        return "–"
    return f"{v:.0f}" if abs(v) >= 1000 else f"{v:.3g}"


def _x(v: float) -> str:
    return f"{v:.1f}×"


def _us(cell: dict[str, float]) -> str:
    return f"{_num(cell['median_us'])} [{_num(cell['min_us'])}–{_num(cell['max_us'])}]"


def _cell(reason: str, limit: int = 260) -> str:
    """A failure reason fit for a table cell: no "|", rank lists shortened, at most `limit` chars."""
    from .scaling import shorten_rank_lists

    text = shorten_rank_lists(reason).replace("|", "/")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


# ---- markdown ------------------------------------------------------------------------------------------

HOST_ROWS = (
    ("aclnn-py `MoeDistributeBuffer` (device Tensors, outputs reused)", "buffer"),
    ("aclnn-py `MoeDistributeBuffer`, host arrays in (copied into the set's kept Tensors)", "buffer_host"),
    ("aclnn-py `MoeDistributeBuffer`, token count varying (1, 2, 3 in turn)", "buffer_varying"),
    ("ctypes baseline (descriptors made per call)", "ctypes"),
    ("aclnn-py per call (one MoeConfig, caller's outputs)", "per_call"),
    ("C floor per call (phase 1 + 2, descriptors made once)", "c_per_call"),
    ("aclnn-py plan, new inputs each call", "plan"),
    ("C floor plan (`aclSetInputTensorAddr` + launch)", "c_plan"),
    ("aclnn-py plan, same inputs each call", "plan_reuse"),
    ("C floor plan, same inputs (launch only)", "c_plan_reuse"),
)
RATIO_ROWS = (
    ("buffer / C per call", "buffer_over_c_per_call"),
    ("buffer / per call", "buffer_over_per_call"),
    ("buffer, host arrays / device Tensors", "buffer_host_over_buffer"),
    ("buffer, token count varying / fixed", "buffer_varying_over_buffer"),
    ("per call / C per call", "per_call_over_c_per_call"),
    ("plan / C plan", "plan_over_c_plan"),
    ("plan / C plan, same inputs", "plan_reuse_over_c_plan_reuse"),
    ("ctypes / plan", "ctypes_over_plan"),
)


#: The host-overhead targets, judged on the same run: (what, the report's value, at most, unit).
TARGETS = (
    ("buffer ≤ 1.5× the C per-call loop", ("buffer_over_c_per_call",), 1.5, "×"),
    ("buffer ≤ 2× per call", ("buffer_over_per_call",), 2.0, "×"),
    ("per call ≤ 2× the C per-call loop", ("per_call_over_c_per_call",), 2.0, "×"),
    ("plan ≤ 1.3× the C plan loop", ("plan_over_c_plan",), 1.3, "×"),
    ("per call ≤ 10 µs", ("per_call", "median_us"), 10.0, " µs"),
)


def targets_line(h: dict[str, Any]) -> str:
    """Each target with every operator's value in this run and whether it is met."""
    parts = []
    for what, path, limit, unit in TARGETS:
        judged = []
        for op in ("dispatch", "combine"):
            value: Any = h.get(op, {})
            for key in path:
                value = value.get(key) if isinstance(value, dict) else None
            if isinstance(value, (int, float)):
                judged.append(f"{op} {value:.2f}{unit} {'met' if value <= limit else 'not met'}")
        if judged:
            parts.append(f"{what}: " + ", ".join(judged))
    return "Targets in this run — " + "; ".join(parts) + "." if parts else ""


def host_table(h: dict[str, Any]) -> list[str]:
    ops: list[str] = [op for op in ("dispatch", "combine") if op in h]
    rows = [[label] + [_us(h[op][key]) for op in ops] for label, key in HOST_ROWS if all(key in h[op] for op in ops)]
    rows += [[label] + [_x(h[op][key]) for op in ops] for label, key in RATIO_ROWS if all(key in h[op] for op in ops)]
    return _table(["host µs per call, median [min–max], kernels skipped"] + ops, rows)


def pool_sizes(p: dict[str, Any]) -> str:
    return ", ".join(f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n / 2**10:g} KiB" if n >= 2**10 else f"{n} B"
                     for n in p["sizes_bytes"])


def pool_table(p: dict[str, Any]) -> list[str]:
    rows = [["memory pool (`Tensor.empty` + `close`)", _us(p["pooled"])],
            ["`aclrtMalloc` + `aclrtFree` (`set_allocator(None)`)", _us(p["aclrtmalloc_aclrtfree"])],
            ["pool / aclrtMalloc + aclrtFree", _x(p["pooled_over_aclrtmalloc"])]]
    return _table([f"µs per allocation + free, median [min–max] ({pool_sizes(p)} in turn)", "µs"], rows)


def throughput_table(t: dict[str, Any]) -> list[str]:
    title = f"reference round ({model_label(t['model'])})"
    med = t["round_s"]["median"]
    rows = [
        ["dispatch + combine on the mock", f"{_num(1e3 * med)} ms [{_num(1e3 * t['round_s']['min'])}–"
                                           f"{_num(1e3 * t['round_s']['max'])}]"],
        [f"memcpy of the same {t['bytes_moved'] / 1e6:.0f} MB (numpy, same run)",
         f"{_num(1e3 * t['memcpy_floor_s'])} ms → the round is {_x(t['round_over_memcpy_floor'])} the memcpy floor"],
    ]
    if t.get("golden_round_s") == t.get("golden_round_s"):  # not NaN
        rows.append(["numpy golden of the same round",
                     f"{_num(t['golden_round_s'])} s → the mock is {_x(t['golden_over_round'])} faster"])
    rows.append(["memory: peak RSS per rank / whole world (sum of PSS) / windows touched",
                 f"{_num(t['peak_rss_mb_per_rank'])} / {_num(t.get('pss_mb_total', float('nan')))} / "
                 f"{_num(t.get('shm_touched_mb', float('nan')))} MiB"])
    return _table([title, ""], rows)


def _growth(r: dict[str, Any]) -> str:
    return f"{r['growth']:.2f}×" if "growth" in r else "–"


def scaling_table(rows: list[dict[str, Any]]) -> list[str]:
    ok = [r for r in rows if "error" not in r]
    out: list[str] = []
    if ok:
        r0 = ok[0]
        header = [f"W (processes, BS = {r0['tokens']}, H = {r0['hidden']}, K = {r0['topk']}, E = 2W)"]
        header += [str(r["world_size"]) for r in ok]
        body = [
            ["start-up (launch to every buffer ready), s"] + [_num(r["startup_s"]) for r in ok],
            ["first round, ms"] + [_num(r["first_round_ms"]) for r in ok],
            ["steady round, device Tensors, ms"] + [_num(r["round_ms"]) for r in ok],
            ["steady round, host arrays, ms"] + [_num(r["host_round_ms"]) for r in ok],
            ["steady round (device) × per doubling of W"] + [_growth(r) for r in ok],
            ["teardown, s"] + [_num(r["teardown_s"]) for r in ok],
            ["peak RSS per rank, MiB"] + [_num(r["peak_rss_mb_per_rank"]) for r in ok],
            ["whole world (sum of PSS), MiB"] + [_num(r.get("pss_mb_total", float("nan"))) for r in ok],
            [f"shared memory touched, MiB (windows {r0['window_mb_per_rank']} MiB × W)"]
            + [_num(r["shm_touched_mb"]) for r in ok],
        ]
        out += _table(header, body)
    for r in rows:
        if "error" in r:
            out += ["", f"W = {r['world_size']} processes: {_cell(r['error'], 400)}"]
    return out


def thread_worlds_table(rows: list[dict[str, Any]]) -> list[str]:
    body = []
    for r in rows:
        model = f"BS {r['tokens']}, H {r['hidden']}, K {r['topk']}, E {r['experts']}"
        if "error" in r:
            body.append([r["soc"], str(r["world_size"]), model, "failed: " + _cell(r["error"])] + [""] * 8)
        else:
            c_loop = r.get("c_loop_round_ms")
            c_cell = ("not run: " + _cell(r.get("c_loop_error", "–"), 60) if c_loop is None
                      else f"{_num(c_loop)} ms ({_num(r['round_ms'] / c_loop)}×)")
            body.append([r["soc"], str(r["world_size"]), model, f"{_num(r['startup_s'])} s",
                         f"{_num(r['first_round_ms'])} ms", f"{_num(r['round_ms'])} ms", c_cell,
                         f"{_num(r['host_round_ms'])} ms", _growth(r), f"{_num(r['teardown_s'])} s",
                         f"{_num(r['peak_rss_mb'])} MiB",
                         "bit for bit" if r["golden_match"] else f"MISMATCH (ranks {r['mismatched_ranks']})"])
    return _table(["profile", "W (threads)", "model", "start-up", "first round", "steady round, device Tensors",
                   "the same from a C loop (device ÷ C)", "steady round, host arrays", "× per doubling", "teardown",
                   "peak RSS", "vs golden"], body)


def _plots(report: dict[str, Any], relative_to: Path | None) -> list[str]:
    out = []
    for title, path in report.get("plots", {}).items():
        shown = os.path.relpath(path, relative_to) if relative_to is not None else path
        out.append(f"![{title}]({Path(shown).as_posix()})")
    return out


def markdown(report: dict[str, Any], relative_to: Path | None = None) -> str:
    """The performance section's tables, with the command and the machine above them; the plots of
    ``--plot`` linked relative to `relative_to` (the folder of the file they are written into)."""
    mc = report.get("machine", {})
    lines = [
        f"Measured with `{report.get('command', 'python -m benchmarks')}` on {mc.get('cpus', '?')} cores "
        f"({mc.get('cpu_model', '?')}), {mc.get('memory_gib', '?')} GiB, {mc.get('date', '?')}; "
        "medians with [min–max] over the repeats; a ratio is the median of the two paths' ratio within each "
        "repeat. Generated by `python -m benchmarks --markdown`.",
    ]
    if "host_overhead" in report:
        lines += ["", "Host overhead runs with the mock's kernels switched off (`_mock.set_skip_kernels`) and its "
                  "poison fill off (CANN fills nothing): Python + the C API + the mock's phase-2 bookkeeping. "
                  "The C floors call the same "
                  "library functions from a C loop with the same descriptors, executor and stream.", ""]
        lines += host_table(report["host_overhead"])
        target = targets_line(report["host_overhead"])
        if target:
            lines += ["", target]
    if "pool" in report:
        lines += [""] + pool_table(report["pool"]["alloc_free"])
    if "throughput" in report:
        lines += [""] + throughput_table(report["throughput"])
    if report.get("scaling") or report.get("thread_worlds"):
        lines += ["", "Worlds: each rank runs MoeDistributeBuffer rounds (dispatch → expert → combine) as users "
                  "write them: first with device Tensors (inputs uploaded once, an identity expert on the device "
                  "side), then with host arrays (numpy in, `.numpy()` out, a numpy expert writing the received rows into "
                  "`np.empty_like`, `.numpy()` of the combine's result). Two warm-up rounds (device) or one "
                  "(host), each after a barrier, last until the slowest rank ends them; the steady rounds follow "
                  "back to back after one barrier, as a serving loop runs them, and a steady round lasts from the "
                  "slowest rank's end of the round before to its end of this one (the median of 2048 / W rounds, 5 "
                  "to 32); memory is read after a barrier. × per doubling: how many times the "
                  "previous size's steady round a size takes, per doubling of W (above 64; 2 is O(W) per rank)."]
    if report.get("scaling"):
        lines += [""] + scaling_table(report["scaling"])
    if report.get("thread_worlds"):
        lines += ["", "The ranks as threads of one process sharing one CPU (`run_threads(..., share_one_cpu=True)`: "
                  "with one small token per rank the wake-ups, not the copies, bound the round), "
                  "checked against `aclnn_py.golden` (the last host round of every rank). The C loop is the "
                  "floor: the same dispatch and combine on repeatable executors, launched and synchronised by a C "
                  "loop without the interpreter (benchmarks/c_floor.c), rounds back to back, timed as the steady "
                  "rounds are:", ""]
        lines += thread_worlds_table(report["thread_worlds"])
    plots = _plots(report, relative_to)
    if plots:
        lines += [""] + plots
    return "\n".join(lines) + "\n"


def check_markers(path: Path) -> tuple[str, str]:
    """The text of `path` before its begin marker and after its end marker; MarkerError unless it
    has exactly one of each, in that order."""
    text = path.read_text()
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise MarkerError(f"{path}: needs exactly one {BEGIN} and one {END} around the generated tables "
                          f"(found {text.count(BEGIN)} and {text.count(END)})")
    head, rest = text.split(BEGIN)
    if END in head:
        raise MarkerError(f"{path}: {END} comes before {BEGIN}")
    return head, rest.split(END)[1]


def update_file(path: Path, generated: str) -> None:
    """Replace the text between the bench markers of `path` with `generated` (markers kept)."""
    head, tail = check_markers(path)
    path.write_text(f"{head}{BEGIN}\n{generated.rstrip()}\n{END}{tail}")


# ---- plain text ----------------------------------------------------------------------------------------

def text(report: dict[str, Any]) -> str:
    """The human summary printed without --json / --markdown."""
    out: list[str] = []
    h = report.get("host_overhead")
    if h:
        out.append("host overhead, µs per call (median [min, max]); kernels skipped")
        for op in ("dispatch", "combine"):
            row = h[op]
            out.append(f"  {op}")
            for label, key in HOST_ROWS:
                if key in row:  # a report of an earlier version may lack a row
                    out.append(f"    {label:<56} {_us(row[key])}")
            out.append("    " + "  ".join(f"{label} {_x(row[key])}" for label, key in RATIO_ROWS if key in row))
        out.append(targets_line(h))
    p = report.get("pool")
    if p:
        a = p["alloc_free"]
        out.append(f"pool.alloc_free ({pool_sizes(a)} in turn): pool {_us(a['pooled'])} µs, aclrtMalloc + "
                   f"aclrtFree {_us(a['aclrtmalloc_aclrtfree'])} µs per pair ({_x(a['pooled_over_aclrtmalloc'])})")
    t = report.get("throughput")
    if t:
        out.append(f"round ({model_label(t['model'])}): {1e3 * t['round_s']['median']:.2f} ms, "
                   f"memcpy floor {1e3 * t['memcpy_floor_s']:.3f} ms ({_x(t['round_over_memcpy_floor'])}), golden "
                   f"{1e3 * t['golden_round_s']:.1f} ms ({_x(t['golden_over_round'])} slower than the mock)")
    if report.get("scaling"):
        out.append("scaling (processes):")
        for s in report["scaling"]:
            if "error" in s:
                out.append(f"  W={s['world_size']:4}  {s['error']}")
            else:
                out.append(f"  W={s['world_size']:4}  start-up {s['startup_s']:.2f} s  first {s['first_round_ms']:.1f} ms"
                           f"  round {s['round_ms']:.2f} ms (host arrays {s['host_round_ms']:.2f} ms, "
                           f"{_growth(s)} per doubling)  teardown {s['teardown_s']:.2f} s  peak RSS/rank "
                           f"{s['peak_rss_mb_per_rank']:.0f} MiB  world PSS {s['pss_mb_total']:.0f} MiB")
    if report.get("thread_worlds"):
        out.append("thread worlds:")
        for r in report["thread_worlds"]:
            if "error" in r:
                out.append(f"  {r['soc']:<13} W={r['world_size']:5}  {r['error']}")
            else:
                c_loop = r.get("c_loop_round_ms")
                out.append(f"  {r['soc']:<13} W={r['world_size']:5}  start-up {r['startup_s']:.2f} s  first "
                           f"{r['first_round_ms']:.1f} ms  round {r['round_ms']:.1f} ms"
                           + ("" if c_loop is None else f" (C loop {c_loop:.1f} ms)") + " (host arrays "
                           f"{r['host_round_ms']:.1f} ms, {_growth(r)} per doubling)  teardown {r['teardown_s']:.2f} s"
                           f"  peak RSS {r['peak_rss_mb']:.0f} MiB  golden {'match' if r['golden_match'] else 'MISMATCH'}")
    return "\n".join(out)
