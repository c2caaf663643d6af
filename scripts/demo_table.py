#!/usr/bin/env python3
"""The README's demo table: median (range) of several `scripts/demo.sh` runs, per policy.

    OUT=target/demo-1 scripts/demo.sh; OUT=target/demo-2 scripts/demo.sh; ...
    python3 scripts/demo_table.py target/demo-1 target/demo-2 target/demo-3

Each folder is one run's `--out-dir` (the `<policy>.json` results `datahelix compare` writes).
Prints a Markdown table (samples/s, the ratio over rank-local within each run, misses over 1 and
10 ms, p95 input wait, efficiency against the sound bound), then helix's ratio over every other
policy run by run, and its largest wait in each run.
"""
import json
import statistics
import sys
from pathlib import Path

POLICIES = ["rank-local", "actor-pool", "post-balance", "helix-batching", "helix-placement", "helix"]


def load(folder):
    """{policy: summary} for the policies this run has."""
    runs = {}
    for policy in POLICIES:
        path = Path(folder) / f"{policy}.json"
        if not path.exists():
            continue
        try:
            summary = json.loads(path.read_text())["summary"]
            for key in ("throughput", "miss_rate", "miss_rate_10ms", "p95_wait_s", "efficiency", "max_wait_s"):
                float(summary[key])
            if not float(summary["throughput"]) > 0:
                raise ValueError(f"throughput {summary['throughput']}")
        except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError) as e:
            sys.exit(
                f"demo_table: {path} is not a `datahelix train` result ({type(e).__name__}: {e}); "
                "rerun that policy or move the file out of the folder"
            )
        runs[policy] = summary
    if not runs:
        sys.exit(f"demo_table: no <policy>.json in {folder}: is it a `datahelix compare --out-dir`?")
    return runs


def cell(values, fmt, unit=""):
    mid = statistics.median(values)
    return f"{mid:{fmt}} ({min(values):{fmt}}–{max(values):{fmt}}){unit}"


def main(folders):
    runs = [load(f) for f in folders]
    policies = [p for p in POLICIES if all(p in run for run in runs)]
    for p in POLICIES:
        if p not in policies and any(p in run for run in runs):
            print(f"demo_table: {p} is left out: not every run has it", file=sys.stderr)
    if "rank-local" not in policies:
        lacking = [f for f, run in zip(folders, runs) if "rank-local" not in run]
        sys.exit(f"demo_table: no rank-local.json in {', '.join(map(str, lacking))}: the ratios are over rank-local")
    print(f"Median (range) of {len(runs)} runs.\n")
    print("| policy | samples/s | over rank-local | miss > 1 ms | miss > 10 ms | p95 wait ms | efficiency |")
    print("|---|---|---|---|---|---|---|")
    for p in policies:
        per = [run[p] for run in runs]
        over = [run[p]["throughput"] / run["rank-local"]["throughput"] for run in runs]
        print(
            f"| {p} | {cell([s['throughput'] for s in per], '.2f')} | {cell(over, '.2f', '×')} "
            f"| {cell([100 * s['miss_rate'] for s in per], '.1f', '%')} "
            f"| {cell([100 * s['miss_rate_10ms'] for s in per], '.1f', '%')} "
            f"| {cell([1e3 * s['p95_wait_s'] for s in per], '.1f')} "
            f"| {cell([s['efficiency'] for s in per], '.2f')} |"
        )
    if "helix" in policies:
        print()
        for p in policies:
            if p == "helix":
                continue
            ratios = [run["helix"]["throughput"] / run[p]["throughput"] for run in runs]
            print(f"helix over {p}: {cell(ratios, '.3f', '×')}, runs: {', '.join(f'{r:.3f}' for r in ratios)}")
        waits = [1e3 * run["helix"]["max_wait_s"] for run in runs]
        print(f"helix's largest wait, ms: {', '.join(f'{w:.2f}' for w in waits)}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
