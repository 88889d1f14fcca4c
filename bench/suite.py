"""`make bench`: every benchmark scenario, one after another, alone on the machine; one table, one JSON.

Each scenario is a script of its own (bench/<name>_bench.py) that starts the real parts it measures,
prints its progress and table, and writes its results as JSON (the format is in bench/README.md). This
runs them in turn, prints the combined table (ratios against the peer measured in the same run, with
their spread over rounds), writes bench/results/latest.json and, with --readme, puts the table with
the date and the machine into the README's Performance section.

Nothing here is a pass/fail test: the numbers are reported, never asserted.
Usage: .venv/bin/python bench/suite.py [--quick] [--only NAME ...] [--readme]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"
README = REPO / "README.md"
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
#: In the order they run: the cheapest first, so a broken part shows early.
SCENARIOS = ("operator", "gateway", "gateway_profile", "routing", "engine", "lora_affinity", "tiers")


def machine() -> str:
    cpus = os.cpu_count()
    mem = next(
        (
            int(line.split()[1]) // 1024**2
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal:")
        ),
        0,
    )
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return f"{cpus} x {model}, {mem} GiB, {platform.system()} {platform.release()}, no accelerator"


def run_scenario(name: str, quick: bool) -> dict[str, Any]:
    out = RESULTS / f"{name}.json"
    out.unlink(missing_ok=True)
    argv = [sys.executable, str(HERE / f"{name}_bench.py"), "--json", str(out)] + (
        ["--quick"] if quick else []
    )
    print(f"\n=== {name}: {' '.join(argv[1:])}", flush=True)
    started = time.monotonic()
    code = subprocess.run(argv, cwd=REPO, check=False).returncode
    seconds = time.monotonic() - started
    if code != 0 or not out.exists():
        print(f"=== {name}: FAILED (exit {code}) after {seconds:.0f} s", flush=True)
        return {
            "scenario": name,
            "failed": True,
            "exit": code,
            "seconds": round(seconds),
            "rows": [],
            "notes": [],
        }
    result: dict[str, Any] = json.loads(out.read_text())
    result["seconds"] = round(seconds)
    print(f"=== {name}: {seconds:.0f} s", flush=True)
    return result


def _number(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def table(results: list[dict[str, Any]]) -> str:
    """One Markdown table of every row: measure, variant, value, ratio to the baseline and its spread."""
    lines = [
        "| scenario | measure | variant | value | vs | ratio | spread |",
        "|---|---|---|---|---|---|---|",
    ]
    for result in results:
        if result.get("failed"):
            lines.append(f"| {result['scenario']} | FAILED (exit {result['exit']}) | | | | | |")
        for row in result["rows"]:
            spread = row.get("spread")
            lines.append(
                f"| {result['scenario']} | {row['measure']} | {row['variant']} | "
                f"{_number(row['value'])} {row.get('unit', '')} | {row.get('baseline') or ''} | "
                f"{_number(row.get('ratio'))} | {'' if not spread else f'{spread[0]:.2f}-{spread[1]:.2f}'} |"
            )
    return "\n".join(lines)


def readme_section(
    results: list[dict[str, Any]], when: str, where: str, seconds: float, kept: dict[str, list[str]]
) -> str:
    """The Performance section; `kept` holds, per scenario left out of this run, its table rows and notes
    from the section before (each scenario's notes say when it was measured)."""
    notes = [f"- {r['scenario']}: measured {when} on {where}" for r in results]
    notes += [f"- {result['scenario']}: {note}" for result in results for note in result.get("notes", [])]
    rows = table(results).splitlines()
    for lines in kept.values():
        rows += [line for line in lines if line.startswith("| ")]
        notes += [line for line in lines if line.startswith("- ")]
    scope = "every scenario" if not kept else f"{', '.join(r['scenario'] for r in results)}; the others kept"
    return "\n".join(
        [
            BEGIN,
            f"`make bench` ({scope}) in {seconds / 60:.0f} min; ratios: value / the peer's value in the same"
            " run; spread: lowest and highest ratio over the rounds.",
            "",
            *rows,
            "",
            *notes,
            END,
        ]
    )


def _section(text: str) -> str:
    return text.partition(BEGIN)[2].partition(END)[0] if BEGIN in text and END in text else ""


def kept_scenarios(ran: list[str]) -> dict[str, list[str]]:
    """Per scenario in the README's section now but not in `ran`: its table rows and notes. A section
    written before scenarios carried their own date gives its date to each of them in a note."""
    section = _section(README.read_text())
    lines = section.splitlines()
    dated = next((line for line in lines if line.startswith("Measured ")), "")
    when = dated.removeprefix("Measured ").split(" by `make bench`")[0]
    kept: dict[str, list[str]] = {}
    for line in lines:
        cells = line.split(" | ")
        if line.startswith("| ") and not line.startswith(("| scenario |", "|---")) and len(cells) > 1:
            name = cells[0].removeprefix("| ")
            if name not in ran:
                kept.setdefault(name, []).append(line)
    for name, rows in kept.items():
        notes = [line for line in lines if line.startswith(f"- {name}: ")]
        if when and not any(note.startswith(f"- {name}: measured ") for note in notes):
            notes.insert(0, f"- {name}: measured {when}")
        rows += notes
    return kept


def update_readme(section: str) -> None:
    text = README.read_text()
    if BEGIN in text and END in text:
        head, _, rest = text.partition(BEGIN)
        _, _, tail = rest.partition(END)
        README.write_text(head + section + tail)
    else:
        README.write_text(text.rstrip() + "\n\n## Performance\n\n" + section + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="every scenario's smoke mode")
    parser.add_argument("--only", nargs="+", choices=SCENARIOS, help="run these scenarios only")
    parser.add_argument("--readme", action="store_true", help="write the table into README.md")
    args = parser.parse_args()
    RESULTS.mkdir(exist_ok=True)
    started = time.monotonic()
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    results = [run_scenario(name, args.quick) for name in args.only or SCENARIOS]
    seconds = time.monotonic() - started
    where = machine()
    print(f"\nAll scenarios in {seconds / 60:.1f} min ({when}, {where}):\n")
    print(table(results))
    summary = {
        "when": when,
        "machine": where,
        "seconds": round(seconds),
        "quick": args.quick,
        "scenarios": results,
    }
    (RESULTS / "latest.json").write_text(json.dumps(summary, indent=1))
    print(f"\nwrote {RESULTS / 'latest.json'}")
    if args.readme:
        kept = kept_scenarios([r["scenario"] for r in results]) if args.only else {}
        update_readme(readme_section(results, when, where, seconds, kept))
        print(f"wrote the Performance section of {README}")
    sys.exit(1 if any(r.get("failed") for r in results) else 0)


if __name__ == "__main__":
    main()
