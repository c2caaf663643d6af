#!/usr/bin/env python3
"""How far a simulated run's accelerator steps are from the best split, and why.

    datahelix sim --workload scripts/workloads/opensora12_buckets.toml --ranks 64 \\
        --policy helix --records /tmp/rec
    python3 scripts/split_quality.py /tmp/rec/sim-helix.json [--oracle-steps N]

Reads the per-rank step records (`sim --records`, emulated accelerator) and prints, per measured
step on average, in seconds:

- `wall` and `bound`: the run's wall time and the sound bound (its summary), per step;
- `realised`: the slowest rank's accelerator time of the policy's split, with the emulator's noise;
- noise-free: the policy's split (`c0 + largest rank's work`), LPT's, and a lower bound on any
  split's (the pigeonhole pairing bound: of the 2R+1−k heaviest, a rank holds one of the k
  heaviest beside another, or three — `min(w_k + w_(2R+1−k), three lightest)` — the largest over k,
  with the mean and the largest sample); where the policy's equals the lower bound its split is
  optimal before noise;
- `knows noise`: best-fit decreasing into each rank's noisy room, on the shortest step it fits
  — a split that knows the noise no planner can know (the bound knows it too), on the first N
  steps (default all). The best such split is no longer than this, so bound / this is a floor
  on how close the bound comes to it (`docs/experiments/exact_split.py` brackets the best split
  more tightly where the sizes are few).

Standard library only.
"""

import argparse
import bisect
import collections
import heapq
import json
import statistics


def pairing_bound(works, ranks):
    ws = sorted(works, reverse=True)
    best = max(sum(ws) / ranks, ws[0]) if ws else 0.0
    for k in range(1, ranks + 1):
        j = 2 * ranks + 1 - k
        if j <= len(ws):
            three = ws[j - 1] + ws[j - 2] + ws[j - 3] if j >= 3 else float("inf")
            best = max(best, min(ws[k - 1] + ws[j - 1], three))
    return best


def lpt(works, ranks):
    heap = [(0.0, r) for r in range(ranks)]
    for w in sorted(works, reverse=True):
        load, r = heapq.heappop(heap)
        heapq.heappush(heap, (load + w, r))
    return max(load for load, _ in heap)


def best_fit_places(works, rooms):
    """Whether best-fit decreasing places every sample: each, heaviest first, into the fullest
    room (seconds of work a rank has left) that still holds it."""
    left = sorted(rooms)
    for w in sorted(works, reverse=True):
        i = bisect.bisect_left(left, w - 1e-12)
        if i == len(left):
            return False
        room = left.pop(i) - w
        bisect.insort(left, room)
    return True


def knows_noise(works, noise, c0):
    """The shortest step at which best-fit decreasing places every sample in the ranks' noisy
    rooms (`T / n_r − c0`), bisected to a part in 10⁵."""
    lo, hi = max(noise) * c0, max(noise) * (c0 + sum(works))  # one rank holding all fits
    while hi - lo > 1e-5 * hi:
        mid = 0.5 * (lo + hi)
        if best_fit_places(works, [mid / n - c0 for n in noise]):
            hi = mid
        else:
            lo = mid
    return hi


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", help="a sim-POLICY.json written by `datahelix sim --records`")
    ap.add_argument("--oracle-steps", type=int, default=0, help="steps for the noise-knowing schedule (0: all)")
    args = ap.parse_args()
    doc = json.load(open(args.records))
    summary = doc["summary"]
    steps = collections.defaultdict(list)
    first = max(r["step"] for r in doc["records"]) + 1 - summary["steps"]  # after the warm-up
    for r in doc["records"]:
        if r["step"] >= first:
            if r.get("accel") is None or len(r.get("sample_gpu_s", [])) != len(r["ids"]):
                raise SystemExit(f"{args.records}: step {r['step']} rank {r['rank']} has no emulator terms")
            steps[r["step"]].append(r)
    ranks = len(next(iter(steps.values())))
    realised, own, by_lpt, lower, oracle = [], [], [], [], []
    for k, s in enumerate(sorted(steps)):
        rs = steps[s]
        c0 = rs[0]["accel"]["fixed_s"]
        works = [w for r in rs for w in r["sample_gpu_s"]]
        realised.append(max(r["gpu_s"] for r in rs))
        own.append(c0 + max(sum(r["sample_gpu_s"]) for r in rs))
        by_lpt.append(c0 + lpt(works, ranks))
        lower.append(c0 + pairing_bound(works, ranks))
        if args.oracle_steps <= 0 or k < args.oracle_steps:
            oracle.append(knows_noise(works, [r["accel"]["noise"] for r in rs], c0))
    mean = statistics.mean
    wall = summary["wall_s"] / summary["steps"]
    bound = summary["ideal_s"] / summary["steps"]
    print(f"{args.records}: {ranks} ranks, {len(steps)} measured steps; seconds a step")
    print(f"  wall {wall:.3f}  bound {bound:.3f}  efficiency {summary['efficiency']:.3f}")
    print(f"  realised (with noise): the policy's split {mean(realised):.3f}")
    print(
        f"  noise-free: the policy's split {mean(own):.3f}, LPT {mean(by_lpt):.3f}, "
        f"no split below {mean(lower):.3f} (the policy's within {100 * (mean(own) / mean(lower) - 1):.1f}%)"
    )
    print(
        f"  knows noise ({len(oracle)} steps): {mean(oracle):.3f}, the bound over it {bound / mean(oracle):.3f}; "
        f"the policy's split realised over it {mean(realised[: len(oracle)]) / mean(oracle):.3f}"
    )


if __name__ == "__main__":
    main()
