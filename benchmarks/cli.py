"""``python -m benchmarks``: options, the run of the selected sections, and the output (text, one JSON
document, or the README's markdown tables, optionally written into a file between its markers)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from aclnn_py.tools.cli_conventions import Parser, UsageError, int_at_least, positive_seconds, run_main

from . import plot as plt_
from . import report as rpt
from .host_overhead import host_overhead
from .pool import pool_alloc_free
from .progress import Progress
from .scaling import scaling, worlds_up_to
from .thread_worlds import DEFAULT_WORLDS, parse_world, thread_worlds
from .throughput import QUICK, REFERENCE, throughput

#: How the benchmarks are run: from the root of a source checkout (they are not installed).
PROG = "python -m benchmarks"
SECTIONS = ("host_overhead", "pool", "throughput", "scaling", "thread_worlds")


class Settings(argparse.Namespace):
    """Parsed options with the --quick defaults filled in (see :func:`resolve`)."""

    json: bool
    markdown: bool
    update: Path | None
    plot: Path | None
    saved_report: dict[str, Any] | None
    quick: bool
    quiet: bool
    sections: list[str]
    calls: int
    repeats: int
    rounds: int
    max_world: int
    scaling_tokens: int
    scaling_hidden: int
    scaling_topk: int
    mem_reserve_mb: float
    thread_world: list[tuple[str, int]]
    thread_tokens: int
    thread_hidden: int
    thread_topk: int
    thread_timeout: float
    thread_connect_timeout: float | None
    thread_fallback: bool


# full run, --quick run
DEFAULTS: dict[str, tuple[Any, Any]] = {
    "calls": (2000, 300),
    "repeats": (15, 3),
    "rounds": (5, 2),
    "max_world": (512, 4),
    "thread_world": (list(DEFAULT_WORLDS), ["Ascend910_93:8", "Ascend950:8"]),
}


def _sections(text: str) -> list[str]:
    names = [s.strip().replace("-", "_") for s in text.split(",") if s.strip()]
    bad = [n for n in names if n not in SECTIONS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown section(s) {bad}: choose from {', '.join(SECTIONS)}")
    return names


def _saved_report(path: str) -> dict[str, Any]:
    """--from: the report a `bench --json` run printed, read while the options are parsed."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        report = json.loads(data)
    except ValueError:  # not JSON, or not text at all
        report = None
    if not isinstance(report, dict) or not isinstance(report.get("machine"), dict) \
            or not any(isinstance(report.get(name), (dict, list)) for name in SECTIONS):
        raise argparse.ArgumentTypeError(f"{path} is not a report saved from `{PROG} --json` (a JSON "
                                         f"object with 'machine' and one of {', '.join(SECTIONS)})")
    return report


def _world(text: str) -> list[tuple[str, int]]:
    try:
        return parse_world(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


DESCRIPTION = """\
Measures host overhead per call (ctypes baseline, aclnn-py, C floors), one reference round against
the memcpy floor and the golden, process-world scaling and thread worlds, all on the mock. Progress
goes to stderr (silent with --quiet or --json).

What the default run (every section, full sizes) took, measured once on a 2-core machine with
23.5 GiB of memory (the progress lines' clock): about 1.5 minutes, and up to about 7 GiB in use at
once (the 512-process world's summed PSS; the 1024-thread world under 0.5 GiB). The scaling sweep
and the thread worlds leave out a size whose
estimated memory exceeds what is available minus --mem-reserve-mb, so a smaller machine runs fewer
sizes.
--quick takes a few seconds and under 0.2 GiB."""
EXIT_CODES = """exit status:
  0  the bench ran (or --from rendered a saved report); a target not met is reported, not an error
  2  a usage error: bad arguments, a --from file that is missing or not a saved report, an --update
     file without one pair of bench markers
  3  an internal error (a traceback is printed)
  130  interrupted (Ctrl-C)"""


def build_parser() -> Parser:
    p = Parser(prog=PROG, description=DESCRIPTION, epilog=EXIT_CODES)
    q = "; --quick: "

    def dflt(name: str) -> str:
        full, quick = DEFAULTS[name]
        return f"(default: {full}{q}{quick})"

    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print exactly one JSON document on stdout (implies quiet)")
    out.add_argument("--markdown", action="store_true",
                     help="print the README's performance tables, with the command and machine above them")
    out.add_argument("--update", type=Path, metavar="FILE",
                     help="with --markdown: write the tables into FILE between <!-- bench:begin --> and "
                          "<!-- bench:end --> instead of printing them (default: print)")
    out.add_argument("--from", dest="saved_report", type=_saved_report, metavar="REPORT.json",
                     help="render a saved --json report instead of running the bench (default: run)")
    out.add_argument("--plot", type=Path, metavar="DIR",
                     help="also draw the worlds' round time and memory against W into DIR/round_time.png and "
                          f"DIR/memory.png (needs matplotlib: {plt_.PLOT_EXTRA}); with --markdown the tables link "
                          "them (default: no plots)")
    out.add_argument("--quiet", action="store_true", help="no progress on stderr (default: progress shown)")
    run = p.add_argument_group("what to run")
    run.add_argument("--quick", action="store_true", help="small sizes and few repeats, seconds (default: full run)")
    run.add_argument("--sections", type=_sections, default=None, metavar="LIST",
                     help=f"comma-separated sections to run (default: {','.join(SECTIONS)})")
    count = int_at_least(1)
    run.add_argument("--calls", type=count, metavar="N", help=f"host overhead: calls per timed batch {dflt('calls')}")
    run.add_argument("--repeats", type=count, metavar="N",
                     help=f"host overhead: timed batches per path {dflt('repeats')}")
    run.add_argument("--rounds", type=count, metavar="N", help=f"reference round: timed rounds {dflt('rounds')}")
    run.add_argument("--max-world", type=int, metavar="N",
                     help=f"scaling: largest process world; sizes double from 2 up to N {dflt('max_world')}")
    run.add_argument("--scaling-tokens", type=int, default=8, metavar="N", help="scaling: tokens per rank")
    run.add_argument("--scaling-hidden", type=int, default=2048, metavar="H", help="scaling: hidden size")
    run.add_argument("--scaling-topk", type=int, default=4, metavar="K", help="scaling: experts per token")
    run.add_argument("--mem-reserve-mb", type=float, default=4096, metavar="MIB",
                     help="scaling and thread worlds: memory left to the machine; a size estimated to need "
                          "more than MemAvailable minus this is not run")
    run.add_argument("--thread-world", type=_world, action="append", metavar="SOC:W",
                     help="thread worlds to run, repeatable; SOC is A3 / Ascend910_93 or 950 / Ascend950, W "
                          f"one size or W1-W2 (doubling from W1 up to W2) {dflt('thread_world')}")
    run.add_argument("--thread-tokens", type=int, default=1, metavar="N", help="thread worlds: tokens per rank")
    run.add_argument("--thread-hidden", type=int, default=1024, metavar="H", help="thread worlds: hidden size")
    run.add_argument("--thread-topk", type=int, default=1, metavar="K", help="thread worlds: experts per token")
    run.add_argument("--thread-timeout", type=positive_seconds, default=900.0, metavar="S",
                     help="thread worlds: seconds before one world is abandoned")
    run.add_argument("--thread-connect-timeout", type=positive_seconds, default=None, metavar="S",
                     help="thread worlds: HCCL_CONNECT_TIMEOUT for the world's formation (default: the "
                          "environment's, else the mock's 120 s)")
    run.add_argument("--no-thread-fallback", dest="thread_fallback", action="store_false",
                     help="thread worlds: do not retry a failed size at half the ranks (default: retry, "
                          "down to 16)")
    return p


def resolve(args: argparse.Namespace) -> Settings:
    """Fill options left unset with their full or --quick default; check combinations."""
    s = Settings(**vars(args))
    for name, (full, quick) in DEFAULTS.items():
        if getattr(s, name, None) is None:
            value = quick if s.quick else full
            setattr(s, name, [parse_world(v) for v in value] if name == "thread_world" else value)
    groups = cast("list[list[tuple[str, int]]]", s.thread_world)  # one list per --thread-world (a range is several)
    s.thread_world = [world for group in groups for world in group]
    if s.sections is None:
        s.sections = list(SECTIONS)
    if s.update is not None and not s.markdown:
        raise UsageError("--update needs --markdown", PROG)
    if s.json and s.markdown:
        raise UsageError("choose one of --json and --markdown", PROG)
    if s.plot is not None and not plt_.available():
        raise UsageError(f"--plot needs matplotlib: {plt_.PLOT_EXTRA}", PROG)
    return s


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command as the user typed it: `python -m benchmarks ...`."""
    args = list(sys.argv[1:] if argv is None else argv)
    return shlex.join([*PROG.split(), *args])


def run(s: Settings, progress: Progress, command: str = PROG) -> dict[str, Any]:
    """Run the selected sections on the mock and return the report."""
    import aclnn_py

    aclnn_py.init("mock")
    t0 = time.perf_counter()
    report: dict[str, Any] = {"command": command, "machine": rpt.machine(), "quick": s.quick}
    if "host_overhead" in s.sections:
        report["host_overhead"] = host_overhead(calls=s.calls, repeats=s.repeats, progress=progress)
    if "pool" in s.sections:
        report["pool"] = {"alloc_free": pool_alloc_free(calls=max(s.calls // 10, 20), repeats=s.repeats,
                                                        progress=progress)}
    if "throughput" in s.sections:
        report["throughput"] = throughput(QUICK if s.quick else REFERENCE, rounds=s.rounds, progress=progress)
    if "scaling" in s.sections:
        report["scaling"] = scaling(worlds_up_to(s.max_world), tokens=s.scaling_tokens, hidden=s.scaling_hidden,
                                    topk=s.scaling_topk, reserve_mb=s.mem_reserve_mb, progress=progress)
    if "thread_worlds" in s.sections:
        report["thread_worlds"] = thread_worlds(s.thread_world, tokens=s.thread_tokens, hidden=s.thread_hidden,
                                                topk=s.thread_topk, timeout=s.thread_timeout,
                                                connect_timeout=s.thread_connect_timeout,
                                                fallback=s.thread_fallback, reserve_mb=s.mem_reserve_mb,
                                                progress=progress)
    report["elapsed_s"] = time.perf_counter() - t0
    progress(f"done in {report['elapsed_s']:.1f} s")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """The command line's entry point (``python -m benchmarks``); returns the exit status."""
    return run_main(PROG, lambda: _main(build_parser().parse_args(argv), argv))


def _main(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    s = resolve(args)
    progress = Progress(quiet=s.quiet or s.json)
    if s.update is not None:
        try:  # before a run of minutes, not after it
            rpt.check_markers(s.update)
        except (rpt.MarkerError, OSError) as e:
            print(f"{PROG}: {e}", file=sys.stderr)
            return 2
    if s.saved_report is not None:
        report = s.saved_report
    else:
        report = run(s, progress, command_line(argv))
    if s.plot is not None:
        report["plots"] = plt_.plot(report, s.plot)
        for path in report["plots"].values():
            progress(f"wrote {path}")
    if s.json:
        print(json.dumps(report, indent=2))
    elif s.markdown:
        md = rpt.markdown(report, s.update.parent if s.update is not None else None)
        if s.update is not None:
            try:
                rpt.update_file(s.update, md)
            except (rpt.MarkerError, OSError) as e:
                print(f"{PROG}: {e}", file=sys.stderr)
                return 2
            progress(f"updated {s.update}")
        else:
            print(md, end="")
    else:
        print(rpt.text(report))
    return 0
