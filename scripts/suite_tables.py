#!/usr/bin/env python3
"""The suite's tables and issue 20's suite targets, from `datahelix sim --suite` runs.

    for x in 0.5 0.75 1.0 1.25; do
        datahelix sim --suite scripts/workloads --cpu-per-accel $x --json > s8_$x.json
    done
    datahelix sim --suite scripts/workloads --ranks 64 --cpu-per-accel 1.0 --json > s64_1.0.json
    python3 scripts/suite_tables.py regimes s8_1.0.json
    python3 scripts/suite_tables.py budgets s8_0.5.json s8_0.75.json s8_1.0.json s8_1.25.json s64_1.0.json
    python3 scripts/suite_tables.py workloads --only egoexo4d-4k,miradata-long s8_1.0.json s64_1.0.json
    python3 scripts/suite_tables.py check s8_*.json s64_*.json

A run's budget `X` (`--cpu-per-accel`) is not in its JSON: it is read from the file's name,
the number after its last `_` (`s8_0.75.json`: X = 0.75), or given as `LABEL=FILE` with the
label `X` (`0.75=run.json`). The ranks are the JSON's own.

- `regimes FILE`: per regime, helix against rank-local, the actor pool and post-balance
  (geometric means), the mean miss and p95-wait reductions against rank-local, and rank-local's
  and helix's efficiency (geometric means), then the whole suite.
- `budgets FILE...`: helix / rank-local and helix / actor-pool per regime, one column a run.
- `workloads [--only A,B] FILE...`: per workload and run, the budget's cores a rank, rank-local's
  and helix's throughput (efficiency), helix against the three, and the miss rates.
- `check FILE...`: each of issue 20's targets on the suite that these runs can decide, with
  every case that fails it; exit status 1 when any fails.

Standard library only.
"""

import argparse
import json
import math
import os
import sys

# The regimes issue 20 added, which must reach NEW_VS_RL and NEW_VS_AP at 8 ranks, X = 1.0.
NEW_REGIMES = ("camera originals", "few samples a rank", "high frame rates", "long segments")
NEW_VS_RL, NEW_VS_AP = 1.8, 1.75
# The suite's geometric mean over rank-local and the actor pool at 8 ranks.
SUITE_VS = 1.33
# Efficiency at budgets up to 1.0: at 8 ranks, and at 64 ranks and more.
EFF_8, EFF_MANY = 0.90, 0.85
# Mean miss and p95 reductions against rank-local at the default budget and at 1.25.
MISS_CUT, P95_CUT = 0.80, 0.92
DEFAULT_BUDGET = 0.75
# Rank-local's miss rate from which helix must miss at most a third as often.
MISSES_WORTH_A_THIRD = 0.05


class Run:
    """One `sim --suite --json` document with its budget."""

    def __init__(self, arg):
        label, _, path = arg.rpartition("=")
        if not label:
            path = arg
            stem = os.path.splitext(os.path.basename(path))[0]
            label = stem.rpartition("_")[2]
        try:
            self.budget = float(label)
        except ValueError:
            sys.exit(f"{arg}: no budget X in the name (s8_0.75.json) or as X=FILE")
        with open(path) as f:
            doc = json.load(f)
        for key in ("regimes", "suite", "workloads"):
            if key not in doc:
                sys.exit(f"{path}: not a `sim --suite --json` document (no `{key}`)")
        self.path = path
        self.regimes = doc["regimes"]
        self.suite = doc["suite"]
        self.workloads = doc["workloads"]
        ranks = {w["ranks"] for w in self.workloads}
        if len(ranks) != 1:
            sys.exit(f"{path}: workloads at different ranks {sorted(ranks)}")
        self.ranks = ranks.pop()

    @property
    def name(self):
        return f"{self.ranks}, X={self.budget}"


def ratio(x):
    return f"{x:.2f}×"


def pct(x):
    return f"{100 * x:.0f}%"


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def regime_row(name, n, g):
    """A row of the regime table: `g` is a regime's (or the suite's) summary of `n` workloads."""
    vs, eff = g["geomean_speedup_vs"], g["geomean_efficiency"]
    return [
        name,
        n,
        ratio(vs["rank-local"]),
        ratio(vs["actor-pool"]),
        ratio(vs["post-balance"]),
        pct(g["mean_miss_reduction_vs_rank_local"]),
        pct(g["mean_p95_reduction_vs_rank_local"]),
        f"{eff['rank-local']:.2f}",
        f"{eff['helix']:.2f}",
    ]


def regimes(runs):
    for run in runs:
        rows = [regime_row(name, len(g["workloads"]), g) for name, g in sorted(run.regimes.items())]
        rows.append(regime_row("**all**", len(run.workloads), run.suite))
        header = ["regime", "n", "helix / rank-local", "/ actor-pool", "/ post-balance",
                  "miss reduction", "p95 reduction", "eff. rank-local", "eff. helix"]
        print(f"{run.name} ({run.path}):\n")
        print(table(header, rows))
        print()


def budgets(runs):
    names = sorted({name for run in runs for name in run.regimes})

    def cell(g):
        if g is None:
            return "–"
        vs = g["geomean_speedup_vs"]
        return f"{ratio(vs['rank-local'])} / {ratio(vs['actor-pool'])}"

    rows = [[name] + [cell(run.regimes.get(name)) for run in runs] for name in names]
    rows.append(["**all**"] + [cell(run.suite) for run in runs])
    print(table(["regime"] + [run.name for run in runs], rows))


def workloads(runs, only):
    header = ["workload", "ranks", "X", "cores/rank", "rank-local samples/s (eff.)",
              "helix samples/s (eff.)", "helix / rank-local", "/ actor-pool", "/ post-balance",
              "miss rank-local → helix"]
    rows = []
    for run in runs:
        for w in sorted(run.workloads, key=lambda w: w["workload"]):
            if only and w["workload"] not in only:
                continue
            p = w["policies"]
            h, rl = p["helix"], p["rank-local"]
            rows.append([
                w["workload"], run.ranks, f"{run.budget}", f"{w['cores_per_rank']:.2f}",
                f"{rl['throughput']:.3g} ({rl['efficiency']:.2f})",
                f"{h['throughput']:.3g} ({h['efficiency']:.2f})",
                ratio(h["throughput"] / rl["throughput"]),
                ratio(h["throughput"] / p["actor-pool"]["throughput"]),
                ratio(h["throughput"] / p["post-balance"]["throughput"]),
                f"{rl['miss_rate']:.3f} → {h['miss_rate']:.3f}",
            ])
    print(table(header, rows))


def ceiling(summary):
    """What a loader blind to the noise can expect at most against the sound bound, as a suffix:
    `efficiency / blind_efficiency` is the run's `ideal_s / blind_ideal_s`, the same for every
    policy of it (fact 5 of the bound; empty for runs without `blind_efficiency`)."""
    blind = summary.get("blind_efficiency")
    return f"; a loader blind to the noise can expect at most {summary['efficiency'] / blind:.3f}" if blind else ""


def check(runs):
    """Issue 20's suite targets; returns whether all hold. Then, not a target, the efficiency
    floors against the bound for loaders that split before the noise is drawn (fact 5,
    `src/metrics/bound/blind.rs`: `blind_efficiency`, absent in runs before it)."""
    fails, blind = {}, {}

    def target(name, bad):
        fails.setdefault(name, []).extend(bad)

    for run in runs:
        at = f"{run.ranks} ranks, X = {run.budget}"
        for w in run.workloads:
            p, name = w["policies"], w["workload"]
            h, rl, pb = p["helix"], p["rank-local"], p["post-balance"]
            target("no policy above efficiency 1",
                   [f"{name} {q} {v['efficiency']:.3f} ({at})" for q, v in p.items() if v["efficiency"] > 1])
            floor = EFF_8 if run.ranks <= 8 else EFF_MANY
            if run.budget <= 1.0:
                target(f"helix at {EFF_8} of the bound at 8 ranks, {EFF_MANY} at 64 and 512 (X ≤ 1.0)",
                       [f"{name} {h['efficiency']:.3f} ({at}{ceiling(h)})"] if h["efficiency"] < floor else [])
                if "blind_efficiency" in h:
                    blind.setdefault(f"helix at {EFF_8} / {EFF_MANY} of the blind bound (X ≤ 1.0)", []).extend(
                        [f"{name} {h['blind_efficiency']:.3f} ({at})"] if h["blind_efficiency"] < floor else [])
            for key, ms in (("miss_rate", "1 ms"), ("miss_rate_10ms", "10 ms")):
                target("helix misses no more often than rank-local",
                       [f"{name} {ms} {h[key]:.3f} > {rl[key]:.3f} ({at})"] if h[key] > rl[key] else [])
                worth = rl[key] >= MISSES_WORTH_A_THIRD and h[key] > rl[key] / 3
                target("helix misses ≤ 1/3 of rank-local's where it misses ≥ 5%",
                       [f"{name} {ms} {h[key]:.3f} > {rl[key]:.3f} / 3 ({at})"] if worth else [])
            target("helix ahead of post-balance",
                   [f"{name} ({at})"] if h["throughput"] <= pb["throughput"] else [])
        vs = run.suite["geomean_speedup_vs"]
        if run.ranks == 8:
            target(f"suite ≥ {SUITE_VS}× rank-local and the actor pool at 8 ranks",
                   [f"{min(vs['rank-local'], vs['actor-pool']):.2f}× ({at})"]
                   if min(vs["rank-local"], vs["actor-pool"]) < SUITE_VS else [])
            if run.budget in (DEFAULT_BUDGET, 1.25):
                miss, p95 = (run.suite["mean_miss_reduction_vs_rank_local"],
                             run.suite["mean_p95_reduction_vs_rank_local"])
                target(f"≥ {pct(MISS_CUT)} miss and ≥ {pct(P95_CUT)} p95 reduction (8 ranks, X = 0.75 and 1.25)",
                       [f"{pct(miss)} / {pct(p95)} ({at})"] if miss < MISS_CUT or p95 < P95_CUT else [])
            if run.budget == 1.0:
                for name in NEW_REGIMES:
                    rv = run.regimes.get(name, {}).get("geomean_speedup_vs")
                    short = rv and (rv["rank-local"] < NEW_VS_RL or rv["actor-pool"] < NEW_VS_AP)
                    target(f"new regimes ≥ {NEW_VS_RL}× rank-local and ≥ {NEW_VS_AP}× the actor pool (8 ranks, X = 1.0)",
                           [f"{name} {ratio(rv['rank-local'])} / {ratio(rv['actor-pool'])}"] if short else [])
    ok = True
    for name, bad in fails.items():
        print(f"{'holds' if not bad else 'FAILS'}: {name}")
        for b in bad:
            print(f"    {b}")
        ok &= not bad
    for name, bad in blind.items():
        print(f"{'holds' if not bad else 'fails'} (not a target): {name}")
        for b in bad:
            print(f"    {b}")
    print(f"runs: {', '.join(run.name for run in runs)}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["regimes", "budgets", "workloads", "check"])
    ap.add_argument("--only", default="", help="workloads: these workloads only (comma-separated)")
    ap.add_argument("runs", nargs="+", help="`sim --suite --json` documents (X=FILE or *_X.json)")
    args = ap.parse_args()
    runs = sorted((Run(a) for a in args.runs), key=lambda r: (r.ranks, r.budget))
    if args.what == "regimes":
        regimes(runs)
    elif args.what == "budgets":
        budgets(runs)
    elif args.what == "workloads":
        workloads(runs, set(filter(None, args.only.split(","))))
    elif not check(runs):
        sys.exit(1)


if __name__ == "__main__":
    main()
