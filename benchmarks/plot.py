"""``--plot DIR``: the worlds' steady round time and memory against W, log-log, one line per series
(thread worlds per SoC profile, process worlds), each with an O(W) reference line through its
smallest size, so a curve steeper than its reference shows growth faster than linear at a glance.
matplotlib is an optional extra (``pip install ".[plot]"``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

PLOT_EXTRA = 'pip install ".[plot]"'


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _series(report: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]], str]]:
    """(label, rows with figures, memory key) per series of the report."""
    out = []
    threads = [r for r in report.get("thread_worlds", []) if "error" not in r]
    for soc in dict.fromkeys(r["soc"] for r in threads):
        rows = sorted((r for r in threads if r["soc"] == soc), key=lambda r: r["world_size"])
        out.append((f"threads, {soc}", rows, "peak_rss_mb"))
    processes = [r for r in report.get("scaling", []) if "error" not in r]
    if processes:
        out.append(("processes", processes, "pss_mb_total"))
    return out


def _draw(path: Path, title: str, ylabel: str, lines: list[tuple[str, list[int], list[float]]],
          floors: Sequence[tuple[str, list[int], list[float]]] = ()) -> None:
    """Each line with its O(W) reference from its smallest W; `floors` dotted, without one."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for label, ws, ys in lines:
        (line,) = ax.plot(ws, ys, marker="o", label=label)
        if len(ws) > 1 and ys[0] > 0:
            ax.plot(ws, [ys[0] * w / ws[0] for w in ws], linestyle="--", color=line.get_color(), alpha=0.5,
                    label=f"O(W) from W = {ws[0]}")
    for label, ws, ys in floors:
        ax.plot(ws, ys, marker=".", linestyle=":", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("W (ranks)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot(report: dict[str, Any], directory: Path) -> dict[str, str]:
    """Write round_time.png and memory.png into `directory`; {title: path} of what was written (nothing
    when the report has no world with figures)."""
    series = _series(report)
    if not series:
        return {}
    directory.mkdir(parents=True, exist_ok=True)
    rounds = directory / "round_time.png"
    memory = directory / "memory.png"
    _draw(rounds, "Steady round through MoeDistributeBuffer (device Tensors)", "ms",
          [(label, [r["world_size"] for r in rows], [r["round_ms"] for r in rows]) for label, rows, _ in series],
          [(f"{label}, C loop", [r["world_size"] for r in rows], [r["c_loop_round_ms"] for r in rows])
           for label, rows, _ in series if rows and all("c_loop_round_ms" in r for r in rows)])
    _draw(memory, "Memory: peak RSS of a thread world, sum of PSS of a process world", "MiB",
          [(label, [r["world_size"] for r in rows], [r[key] for r in rows]) for label, rows, key in series])
    return {"round time against W": str(rounds), "memory against W": str(memory)}
