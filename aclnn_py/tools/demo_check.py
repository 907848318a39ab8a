"""Comparison of one demo round's outputs with the golden, and the demo's report (text and JSON).

Every output is compared element by element on its *encoding* (the bytes of fp16/bf16/float32/int
values, the codes of fp8 / HiFloat8 / fp4 / e8m0 values), so "equal" means bit for bit. For people the
report also gives the largest absolute difference between the *decoded* values: how big a mismatch is.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..golden import casts

#: Every output of a round, in the order the operators produce them.
DISPATCH_OUTPUTS = ("expand_x", "dynamic_scales", "assist_info_for_combine", "expert_token_nums", "ep_recv_counts",
                    "expand_scales")
OUTPUTS = DISPATCH_OUTPUTS + ("x_out",)
FP8 = ("float8_e4m3fn", "float8_e5m2")
FP4 = ("float4_e2m1", "float4_e1m2")


def elements(a: np.ndarray, fmt: str = "") -> tuple[np.ndarray, np.ndarray]:
    """(codes, values): one integer code per element (its exact encoding) and its float64 value.
    `fmt` names an encoding numpy does not know: an fp8 / fp4 / HiFloat8 format or "e8m0"."""
    a = np.ascontiguousarray(a)
    if fmt in FP4:
        codes = casts.unpack_fp4(a.view(np.uint8))
        return codes, casts.decode(codes, casts.MINIFLOATS[fmt]).astype(np.float64)
    if fmt in FP8:
        codes = a.view(np.uint8)
        return codes, casts.decode(codes, casts.MINIFLOATS[fmt]).astype(np.float64)
    if fmt == "hifloat8":
        codes = a.view(np.uint8)
        return codes, casts.hif8_decode(codes).astype(np.float64)
    if fmt == "e8m0":
        codes = a.view(np.uint8)
        return codes, casts.e8m0_to_float32(codes).astype(np.float64)
    codes = a.view(f"u{a.dtype.itemsize}") if a.dtype.itemsize in (1, 2, 4, 8) else a
    return codes, a.astype(np.float64)


@dataclass(frozen=True)
class OutputCheck:
    """One output of one rank in one round, compared with the golden."""

    output: str
    rank: int
    round: int
    produced: bool = True          # False: this round does not produce the output (nothing to compare)
    equal: bool = True
    max_abs_diff: float = 0.0      # over decoded values; inf when shapes differ or one side is NaN
    differing: int = 0             # elements whose encodings differ
    total: int = 0
    first_index: tuple[int, ...] | None = None
    ours: float | None = None      # decoded values at first_index
    golden: float | None = None
    note: str = ""

    def sentence(self) -> str:
        """The mismatch in words: which output, which rank, first differing index, how big."""
        where = f"round {self.round + 1}, rank {self.rank}, {self.output}"
        if self.note:
            return f"{where}: {self.note}"
        idx = ", ".join(map(str, self.first_index or ()))
        return (f"{where}: {self.differing} of {self.total} elements differ; the first at [{idx}] is {self.ours!r} "
                f"here and {self.golden!r} in the golden; largest |difference| {_num(self.max_abs_diff)}")

    def to_json(self) -> dict[str, Any]:
        return {"produced": self.produced, "equal": self.equal, "max_abs_diff": _json_num(self.max_abs_diff),
                "differing": self.differing, "total": self.total,
                "first_index": list(self.first_index) if self.first_index is not None else None,
                "ours": _json_num(self.ours), "golden": _json_num(self.golden), "note": self.note}


def _wrap(text: str, indent: str = "") -> str:
    return textwrap.fill(text, width=110, initial_indent=indent, subsequent_indent=indent + "  ")


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def _json_num(v: float | None) -> float | str | None:
    if v is None or math.isfinite(v):
        return v
    return str(v)  # inf / nan are not JSON numbers


def compare(output: str, rank: int, rnd: int, ours: np.ndarray | None, gold: np.ndarray | None,
            fmt: str = "", rows: np.ndarray | None = None) -> OutputCheck:
    """Compare one output; `gold` None means the round does not produce it (ours is then not read).
    `rows`: the original row index of each compared row, when only some rows were selected."""
    if gold is None:
        return OutputCheck(output, rank, rnd, produced=False)
    gold = np.asarray(gold)
    if ours is None:
        return OutputCheck(output, rank, rnd, equal=False, max_abs_diff=math.inf, total=gold.size,
                           note="the golden produces it, the backend returned nothing")
    ours = np.asarray(ours)
    if ours.shape != gold.shape:
        return OutputCheck(output, rank, rnd, equal=False, max_abs_diff=math.inf, total=gold.size,
                           note=f"shape {ours.shape} here but {gold.shape} in the golden")
    oc, ov = elements(ours, fmt)
    gc, gv = elements(gold, fmt)
    differ = oc != gc
    n = int(np.count_nonzero(differ))
    if n == 0:
        return OutputCheck(output, rank, rnd, total=int(gc.size))
    with np.errstate(invalid="ignore"):
        diff = np.abs(ov - gv)
    both_nan = np.isnan(ov) & np.isnan(gv)
    diff = np.where(both_nan, 0.0, np.where(np.isnan(diff), np.inf, diff))
    first = tuple(int(i) for i in np.argwhere(differ)[0])
    index = first if rows is None else (int(rows[first[0]]),) + first[1:]
    return OutputCheck(output, rank, rnd, equal=False, max_abs_diff=float(diff.max()), differing=n,
                       total=int(gc.size), first_index=index, ours=float(ov[first]), golden=float(gv[first]))


@dataclass
class RankRow:
    """What the report shows per rank (of the last round)."""

    rank: int
    device: int
    tokens_per_expert: list[int]
    times_ms: tuple[float, float, float]


@dataclass
class DemoResult:
    """All checks of a demo run, with what the report says around them."""

    title: str                         # first line: ranks, launcher, backend
    description: list[str]             # the model and its options, in words
    rows: list[RankRow]
    checks: list[OutputCheck]
    wall_s: float
    facts: dict[str, Any] = field(default_factory=dict)   # for the JSON document

    @property
    def ok(self) -> bool:
        return all(c.equal for c in self.checks)

    @property
    def mismatches(self) -> list[OutputCheck]:
        return [c for c in self.checks if not c.equal]

    def _worst(self, rank: int, outputs: tuple[str, ...]) -> float:
        vals = [c.max_abs_diff for c in self.checks if c.rank == rank and c.output in outputs and c.produced]
        return max(vals, default=0.0)

    def text(self, max_mismatches: int = 10) -> str:
        compared = sorted({c.output for c in self.checks if c.produced}, key=OUTPUTS.index)
        skipped = [o for o in OUTPUTS if o not in compared]
        rounds = 1 + max((c.round for c in self.checks), default=0)
        lines = [self.title, *(_wrap(d, "  ") for d in self.description),
                 f"{'rank':>4} {'device':>6}  {'tokens per local expert':<28} {'dispatch max|diff|':>18} "
                 f"{'combine max|diff|':>17} {'dispatch ms':>11} {'expert ms':>9} {'combine ms':>10}"]
        for row in self.rows:
            per_expert = ",".join(map(str, row.tokens_per_expert))
            td, te, tc = row.times_ms
            lines.append(f"{row.rank:>4} {row.device:>6}  {per_expert:<28} "
                         f"{_num(self._worst(row.rank, DISPATCH_OUTPUTS)):>18} "
                         f"{_num(self._worst(row.rank, ('x_out',))):>17} {td:>11.2f} {te:>9.2f} {tc:>10.2f}")
        lines += [
            _wrap("columns: tokens per local expert = rows this rank received for each expert it hosts (a "
                  "shared-expert rank hosts one); max|diff| = the largest absolute difference between this rank's "
                  "outputs and the golden's, over the decoded values of every element (dispatch: "
                  + ", ".join(o for o in compared if o != "x_out") + "; combine: x_out): 0 means equal values, "
                  "and MATCH below means equal bits; ms = this rank's time per phase in the last round."),
            _wrap(f"checked {len(self.checks) - sum(not c.produced for c in self.checks)} outputs "
                  f"({len(compared)} per rank per round, {rounds} round(s)) element by element on their encoding"
                  + (f"; not produced by this configuration: {', '.join(skipped)}" if skipped else "")
                  + f"; wall time {self.wall_s:.2f} s"),
        ]
        if not self.ok:
            bad = self.mismatches
            lines.append(f"mismatches ({len(bad)} outputs; the first {min(len(bad), max_mismatches)}):")
            lines += [_wrap(c.sentence(), "  ") for c in bad[:max_mismatches]]
        lines.append("result: " + ("MATCH (bit for bit with the golden)" if self.ok else "MISMATCH"))
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "result": "MATCH" if self.ok else "MISMATCH", "title": self.title,
            "description": self.description, **self.facts, "wall_time_s": self.wall_s,
            "ranks": [{"rank": r.rank, "device": r.device, "tokens_per_local_expert": r.tokens_per_expert,
                       "times_ms": {"dispatch": r.times_ms[0], "expert": r.times_ms[1], "combine": r.times_ms[2]}}
                      for r in self.rows],
            "checks": [{"round": c.round, "rank": c.rank, "output": c.output, **c.to_json()} for c in self.checks],
            "mismatches": [c.sentence() for c in self.mismatches],
        }


__all__ = ["DISPATCH_OUTPUTS", "OUTPUTS", "DemoResult", "OutputCheck", "RankRow", "compare", "elements"]
