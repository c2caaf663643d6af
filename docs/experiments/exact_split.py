#!/usr/bin/env python3
"""How far the sound bound's accelerator term is from the best split that knows the noise.

Fact 1 of the bound (`src/metrics/bound.rs`) allows each step the least length any split of its
samples over its ranks reaches, knowing each rank's realised noise. Where it cannot search that
split (more than 32 samples a step) it takes relaxations (the mean, packing and pairing terms),
so the best split may lie above it. This script brackets the best split of chosen steps of a
run's records between two integer programs over *configurations* (the multiset of sample sizes
one rank trains):

- lower: every sample's seconds rounded *down* to a multiple of `--bin` (any real split is then
  a split of the rounded samples, so no real split is shorter than the rounded optimum);
- upper: rounded *up* (a split of the rounded samples is a real split, no shorter than the real
  one it stands for), searched below the best-fit split (printed `upper` is the lesser).

For a step length T rank r has room T / n_r − c0; a configuration fits the ranks with room for
its load, a prefix of the ranks by room, so "each rank one configuration, each size covered" is
feasible exactly when integer counts y_c cover the sizes and, for every k, at most k of them need
one of the k roomiest ranks (Hall's condition on nested sets). Each bracket end bisects on T to a
part in a thousand; a solve that ends on the time limit counts against the end it could move
(feasible for `lower`, infeasible for `upper`), so both stay what they say. Also printed: a
split found by best-fit decreasing into the rooms (no solver), another upper end.

    datahelix sim --workload scripts/workloads/opensora12_buckets.toml --ranks 512 \\
        --policy helix --records /tmp/rec
    cargo run --release --example step_bounds -- /tmp/rec/sim-helix.json > /tmp/rec/bounds.txt
    python3 docs/experiments/exact_split.py /tmp/rec/sim-helix.json --steps 10,100 \\
        --bounds /tmp/rec/bounds.txt [--bin 0.01] [--time-limit 100] [--no-ilp]

Needs `highspy` and `numpy` for the integer programs (`python3 -m venv /tmp/mip &&
/tmp/mip/bin/pip install highspy numpy`; not in the project's environment); `--no-ilp` prints
only best-fit decreasing. Few distinct sizes (buckets, latents of a few shapes) solve in
seconds a step at 512 ranks; a continuum of sizes (cogvideox-latents: ~100k configurations
at `--bin 0.02`) takes minutes a solve, and the rounding itself loosens both ends.
"""

import argparse
import bisect
import collections
import json
import math
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
from split_quality import best_fit_places  # noqa: E402  (the same best-fit split)


def steps_of(path):
    doc = json.load(open(path))
    steps = collections.defaultdict(list)
    for r in doc["records"]:
        steps[r["step"]].append(r)
    return steps


def rounded(works, bin_s, down):
    """Sizes (heaviest first) and how many of each, each sample rounded to a multiple of bin_s."""
    count = collections.Counter(math.floor(w / bin_s) if down else math.ceil(w / bin_s) for w in works)
    return sorted(((k * bin_s, n) for k, n in count.items()), reverse=True)


def configurations(sizes, cap):
    """Every multiset of the sizes (at most each one's count) whose load is at most cap."""
    out = []

    def extend(i, load, counts):
        if i == len(sizes):
            out.append((load, tuple(counts)))
            return
        w, most = sizes[i]
        m = 0
        while m <= most and load + m * w <= cap + 1e-12:
            counts.append(m)
            extend(i + 1, load + m * w, counts)
            counts.pop()
            m += 1
            if w == 0:
                break

    extend(0, 0.0, [])
    return out


def splits_by_ilp(sizes, rooms, time_limit, unknown_is):
    """Whether the ranks' rooms (any order) hold the sizes, by the configuration program."""
    import highspy
    import numpy as np

    if max(rooms) < 0:
        return False
    configs = configurations(sizes, max(rooms))
    ascending = sorted(rooms)
    ranks = len(rooms)
    # Ranks with room for each configuration: a prefix of the ranks, roomiest first.
    roomy = np.array([ranks - bisect.bisect_left(ascending, load - 1e-12) for load, _ in configs])
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit))
    inf = highspy.kHighsInf
    n = len(configs)
    h.addVars(n, np.zeros(n), np.full(n, inf))
    h.changeColsIntegrality(n, np.arange(n, dtype=np.int32), np.array([highspy.HighsVarType.kInteger] * n))
    counts = np.array([c for _, c in configs], dtype=float)  # configs × sizes
    for t, (_, need) in enumerate(sizes):
        idx = np.nonzero(counts[:, t])[0].astype(np.int32)
        h.addRow(float(need), inf, len(idx), idx, counts[idx, t])
    order = np.argsort(roomy, kind="stable")
    for k in sorted(set(roomy.tolist())):
        idx = order[: np.searchsorted(roomy[order], k, side="right")].astype(np.int32)
        h.addRow(-inf, float(k), len(idx), idx, np.ones(len(idx)))
    h.run()
    status = h.getModelStatus()
    if status == highspy.HighsModelStatus.kOptimal:
        return True
    if status == highspy.HighsModelStatus.kInfeasible:
        return False
    print(f"    (solver: {status} at a room of {max(rooms):.4f}; counted as {unknown_is})", file=sys.stderr)
    return unknown_is == "feasible"


def least(fits, lo, hi):
    """The bisection's ends (lo fails or is a known floor, hi passes), to a part in a thousand."""
    while hi - lo > 1e-3 * hi:
        mid = 0.5 * (lo + hi)
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return lo, hi


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", help="a sim-POLICY.json written by `datahelix sim --records`")
    ap.add_argument("--steps", required=True, help="steps to bracket, comma-separated")
    ap.add_argument("--bounds", help="`cargo run --example step_bounds` output for the same records")
    ap.add_argument("--bin", type=float, default=0.01, help="seconds the sizes are rounded to (default 0.01)")
    ap.add_argument("--time-limit", type=float, default=100.0, help="seconds a solve may take (default 100)")
    ap.add_argument("--no-ilp", action="store_true", help="best-fit decreasing only (no solver)")
    args = ap.parse_args()
    steps = steps_of(args.records)
    bounds = {}
    if args.bounds:
        for line in open(args.bounds):
            step, accel, *_ = line.split()
            bounds[int(step)] = float(accel)
    print("step  bound  lower  upper  best-fit  realised  bound/upper")
    for step in (int(s) for s in args.steps.split(",")):
        if step not in steps:
            raise SystemExit(f"{args.records}: no records of step {step}")
        rs = steps[step]
        if any(r.get("accel") is None or len(r.get("sample_gpu_s", [])) != len(r["ids"]) for r in rs):
            raise SystemExit(f"{args.records}: step {step} has records without emulator terms")
        c0 = rs[0]["accel"]["fixed_s"]
        noise = [r["accel"]["noise"] for r in rs]
        works = [w for r in rs for w in r["sample_gpu_s"]]
        realised = max(r["gpu_s"] for r in rs)
        floor = max(max(noise) * c0, (len(rs) * c0 + sum(works)) / sum(1 / x for x in noise))

        def rooms(t):
            return [t / x - c0 for x in noise]

        t0 = time.time()
        # One rank holding every sample fits: an end the bisection starts from and only lowers.
        everything = max(noise) * (c0 + sum(works))
        _, best_fit = least(lambda t: best_fit_places(works, rooms(t)), floor, everything)
        lower = upper = float("nan")
        if not args.no_ilp:
            down, up = rounded(works, args.bin, True), rounded(works, args.bin, False)
            lower, _ = least(lambda t: splits_by_ilp(down, rooms(t), args.time_limit, "feasible"), floor, best_fit)
            _, upper = least(lambda t: splits_by_ilp(up, rooms(t), args.time_limit, "infeasible"), floor, best_fit)
        bound = bounds.get(step, float("nan"))
        best_upper = best_fit if math.isnan(upper) else min(upper, best_fit)
        print(
            f"{step}  {bound:.4f}  {lower:.4f}  {best_upper:.4f}  {best_fit:.4f}  {realised:.4f}  "
            f"{bound / best_upper:.4f}   ({time.time() - t0:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
