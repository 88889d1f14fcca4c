"""Side-by-side comparisons for the benchmark scenarios: runs of each variant recorded round by round (the
variants interleaved within a round, so machine noise hits them alike), each measure pooled over the
rounds, its ratio to the baseline's and the spread of the per-round ratios; rounds repeated until the
ratios settle or the budget is spent; printed as a table and written as the bench suite's JSON."""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .load import Run


@dataclass(frozen=True)
class Measure:
    """A number taken from a Run, in `unit` (what a row of the table shows)."""

    name: str
    unit: str
    of: Callable[[Run], float]


def ttft_ms(q: float, name: str = "TTFT", tag: str | None = None) -> Measure:
    """The q-th percentile of the time to first text in ms, of one request stream when `tag` is given."""
    return Measure(f"{name} p{q:g}", "ms", lambda run: (run if tag is None else run.only(tag)).ttft(q) * 1000)


THROUGHPUT = Measure("throughput", "req/s", lambda run: run.throughput)


class Comparison:
    """Variants against a baseline (the first of `variants`) on the same measures; `pairs` (variant, peer)
    add that variant's ratio to another peer than the baseline."""

    def __init__(
        self,
        label: str,
        variants: Sequence[str],
        measures: Sequence[Measure],
        pairs: Sequence[tuple[str, str]] = (),
    ) -> None:
        self.label = label
        self.variants = list(variants)
        self.baseline = self.variants[0]
        self.measures = list(measures)
        self.pairs = [(v, peer) for v, peer in pairs if v in self.variants and peer in self.variants]
        self.runs: dict[str, list[Run]] = {v: [] for v in self.variants}

    def record(self, variant: str, run: Run) -> None:
        self.runs[variant].append(run)

    @property
    def rounds(self) -> int:
        return min(len(runs) for runs in self.runs.values())

    def pooled(self, variant: str) -> Run:
        return functools.reduce(Run.merged, self.runs[variant][: self.rounds], Run())

    def value(self, measure: Measure, variant: str) -> float:
        return measure.of(self.pooled(variant))

    def round_ratios(self, measure: Measure, variant: str, peer: str | None = None) -> list[float]:
        peer = peer or self.baseline
        pairs = zip(self.runs[variant][: self.rounds], self.runs[peer][: self.rounds], strict=True)
        return [r for r in (_ratio(measure.of(v), measure.of(b)) for v, b in pairs) if r is not None]

    def _compared(self) -> list[tuple[str, str]]:
        return [(v, self.baseline) for v in self.variants[1:]] + self.pairs

    def ratios(self) -> dict[str, float | None]:
        """Pooled ratio of every (measure, variant, peer) compared: what the stop rule watches."""
        return {
            f"{m.name} | {v} vs {peer}": _ratio(self.value(m, v), self.value(m, peer))
            for m in self.measures
            for v, peer in self._compared()
        }

    def rows(self) -> list[dict[str, Any]]:
        """The bench suite's rows: one per measure and variant."""
        rows = []
        for m in self.measures:
            base = self.value(m, self.baseline)
            for v in self.variants:
                value = self.value(m, v)
                spread = self.round_ratios(m, v) if v != self.baseline else []
                rows.append(
                    {
                        "measure": f"{m.name}, {self.label}" if self.label else m.name,
                        "variant": v,
                        "value": _finite(value),
                        "unit": m.unit,
                        "baseline": None if v == self.baseline else self.baseline,
                        "ratio": None if v == self.baseline else _ratio(value, base),
                        "spread": [min(spread), max(spread)] if spread else None,
                        "rounds": self.rounds,
                    }
                )
            for v, peer in self.pairs:
                spread = self.round_ratios(m, v, peer)
                rows.append(
                    {
                        "measure": f"{m.name}, {self.label}" if self.label else m.name,
                        "variant": v,
                        "value": _finite(self.value(m, v)),
                        "unit": m.unit,
                        "baseline": peer,
                        "ratio": _ratio(self.value(m, v), self.value(m, peer)),
                        "spread": [min(spread), max(spread)] if spread else None,
                        "rounds": self.rounds,
                    }
                )
        return rows

    def print(self) -> None:
        width = 30
        print(f"\n   {self.label} ({self.rounds} rounds; ratio to {self.baseline} [min-max over rounds])")
        print("   " + " " * 22 + "".join(f"{v:>{width}}" for v in self.variants))
        for m in self.measures:
            base = self.value(m, self.baseline)
            cells = []
            for v in self.variants:
                value = self.value(m, v)
                cell = f"{value:.1f} {m.unit}"
                ratio, spread = _ratio(value, base), self.round_ratios(m, v)
                if v != self.baseline and ratio is not None and spread:
                    cell += f" {ratio:.2f}x [{min(spread):.2f}-{max(spread):.2f}]"
                cells.append(cell)
            print(f"   {m.name:22}" + "".join(f"{c:>{width}}" for c in cells))
            for v, peer in self.pairs:
                ratio, spread = _ratio(self.value(m, v), self.value(m, peer)), self.round_ratios(m, v, peer)
                if ratio is not None and spread:
                    print(f"   {'':22}{v} vs {peer}: {ratio:.2f}x [{min(spread):.2f}-{max(spread):.2f}]")


def _ratio(value: float, base: float) -> float | None:
    if not (math.isfinite(value) and math.isfinite(base)) or base == 0:
        return None
    return round(value / base, 4)


def _finite(value: float) -> float | None:
    return round(value, 4) if math.isfinite(value) else None


def settled(before: Mapping[str, float | None], after: Mapping[str, float | None], tolerance: float) -> bool:
    """Whether the last round moved no pooled ratio by more than `tolerance` (relative)."""
    if not before:
        return False
    for key, a in after.items():
        b = before.get(key)
        if a is None or b is None or abs(a / b - 1) > tolerance:
            return False
    return True


async def repeat_rounds(
    one_round: Callable[[int], Awaitable[None]],
    comparisons: Sequence[Comparison],
    min_rounds: int,
    max_rounds: int,
    budget_seconds: float,
    tolerance: float = 0.03,
) -> str:
    """Run rounds until every ratio settles (after min_rounds), max_rounds is reached or the next round
    would overrun the budget (rounds take about equally long); returns why it stopped."""
    start = time.monotonic()
    before: dict[str, float | None] = {}
    for done in range(1, max_rounds + 1):
        print(f"[bench] round {done} (up to {max_rounds}) at {time.monotonic() - start:.0f} s", flush=True)
        await one_round(done - 1)
        after = {f"{c.label}: {k}": r for c in comparisons for k, r in c.ratios().items()}
        if done >= min_rounds and settled(before, after, tolerance):
            return f"ratios settled within {tolerance:.0%} after {done} rounds"
        elapsed = time.monotonic() - start
        if elapsed / done * (done + 1) > budget_seconds:
            return f"time budget ({budget_seconds:.0f} s) reached after {done} rounds"
        before = after
    return f"round limit ({max_rounds}) reached"


def write_report(
    path: Path | None,
    scenario: str,
    title: str,
    seconds: float,
    comparisons: Sequence[Comparison],
    notes: Sequence[str],
) -> dict[str, Any]:
    """The scenario's JSON (bench suite contract), written to `path` when given; returns it."""
    report = {
        "scenario": scenario,
        "title": title,
        "seconds": round(seconds, 1),
        "rows": [row for c in comparisons for row in c.rows()],
        "notes": list(notes),
    }
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2))
    return report
