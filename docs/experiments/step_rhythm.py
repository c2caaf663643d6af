#!/usr/bin/env python3
"""How a simulated run's steps fall, against `datahelix frontier`'s optimum (docs/measured.md,
"Neither the noise nor the cores").

    datahelix sim --workload W --ranks 64 --policy helix --records DIR
    datahelix frontier DIR/sim-helix.json --json > frontier.json
    python3 docs/experiments/step_rhythm.py rhythm DIR/sim-helix.json frontier.json
    python3 docs/experiments/step_rhythm.py filling DIR/sim-helix.json 6,9,12 [--window S]

`rhythm`: the run's step lengths (short under 3 s, long from 3 s) against those of the
frontier's optimum nearest the run's miss rate, and per step length / waiting ranks / the
optimum's length for the first steps.

`filling`: for each named step, the fewest waiting ranks at step lengths 5–8 s (or 1.84–2.4 s
with `--window`) by two fillings of its samples (their keyframe runs and accelerator seconds
from the records), on the run's own window (the two steps before) or `--window S`: the
frontier's (samples divisible, `metrics::bound::misses`) and the planner's (`plan::late`:
whole samples, the latest released first on the last ranks, at most 5/2 of the mean load a
late rank, the others heaviest first to the rank with the most room). Noise-free records only
(σ = 0): both take every rank's factor as 1. `-` where no packing fits.
"""

import collections
import heapq
import json
import statistics
import sys

LONG = 3.0


def load(path):
    by = collections.defaultdict(list)
    for r in json.load(open(path))["records"]:
        by[r["step"]].append(r)
    ready = {s: min(r["start_s"] for r in rs) for s, rs in by.items()}
    return by, ready


def lengths(by, ready, warmup=5):
    steps = sorted(by)[warmup:]
    out = []
    for s in steps:
        end = ready.get(s + 1, max(r["end_s"] for r in by[s]))
        waiting = sum(1 for r in by[s] if r["input_wait_s"] > 1e-3)
        out.append((s, end - ready[s], waiting))
    return out


def rhythm(records, frontier):
    by, ready = load(records)
    run = lengths(by, ready)
    f = json.load(open(frontier))
    point = min(f["points"], key=lambda p: abs(p["miss_rate"] - f["miss_rate"]))
    print(f"run: {f['wall_s']:.1f} s, misses {f['miss_rate']:.3f}; "
          f"frontier optimum: {point['wall_s']:.1f} s, misses {point['miss_rate']:.3f}")
    for name, ts in (("run", [t for _, t, _ in run]), ("frontier", point["lengths_s"])):
        short = [t for t in ts if t < LONG]
        long = [t for t in ts if t >= LONG]
        print(f"{name:>8}: {len(short)} short (median {statistics.median(short):.2f} s), "
              f"{len(long)} long (median {statistics.median(long):.2f} s)")
    print("step: run length / waiting ranks / frontier length")
    for (s, t, m), ft in list(zip(run, point["lengths_s"]))[:30]:
        print(f"  {s}: {t:.2f} / {m} / {ft:.2f}")


def frontier_filling(samples, window, length, ranks, c0):
    opened = late = 0
    room = 0.0
    for chain, work in sorted(samples, key=lambda x: -x[0]):
        release = max(0.0, chain - window)
        left = work
        if release + c0 + left > length:
            return None
        if opened == 0 or left > room:
            left -= 0.0 if opened == 0 else room
            while True:
                opened += 1
                late += release > 0.001
                room = length - release - c0
                if opened > ranks or room < 0:
                    return None
                if left <= room:
                    break
                left -= room
        room -= left
    return late


def planner_filling(samples, window, length, ranks, most, c0):
    late = sorted((x for x in samples if x[0] - window > 0.001), key=lambda x: -x[0])
    on_time = sorted((x for x in samples if x[0] - window <= 0.001), key=lambda x: -x[1])
    room = []
    for chain, work in late:
        if not room or room[-1] < work:
            r = min(length - (chain - window) - c0, most)
            if r < work or len(room) == ranks:
                return None
            room.append(r)
        room[-1] -= work
    heap = [(-(length - c0), q) for q in range(ranks - len(room))]
    heap += [(-r, ranks - 1 - k) for k, r in enumerate(room)]
    heapq.heapify(heap)
    for _, work in on_time:
        r, q = heapq.heappop(heap)
        if -r < work:
            return None
        heapq.heappush(heap, (r + work, q))
    return len(room)


def filling(records, steps, window=None):
    by, ready = load(records)
    for s in steps:
        rs = by[s]
        ranks = len(rs)
        c0 = rs[0]["accel"]["fixed_s"]  # the accelerator's per-step constant, as the records carry it
        d = window if window is not None else ready[s] - ready[s - 2]
        samples = [(c, w) for r in rs for c, w in zip(r["sample_chain_s"], r["sample_gpu_s"])]
        mean = sum(w for _, w in samples) / ranks
        grid = [1.84, 1.86, 1.88, 1.9, 1.95, 2.0, 2.1, 2.2, 2.4] if window else [5.0, 5.5, 6.0, 6.5, 7.0, 7.5, 8.0]
        cells = []
        for t in grid:
            a = frontier_filling(samples, d, t, ranks, c0)
            b = planner_filling(samples, d, t, ranks, 2.5 * mean, c0)
            cells.append(f"{t:.2f}: {'-' if a is None else a}/{'-' if b is None else b}")
        print(f"step {s} (window {d:.2f} s, {len(samples)} samples, mean rank {c0 + mean:.2f} s): "
              + "  ".join(cells))


def main(argv):
    if len(argv) >= 4 and argv[1] == "rhythm":
        rhythm(argv[2], argv[3])
    elif len(argv) >= 4 and argv[1] == "filling":
        window = float(argv[5]) if len(argv) >= 6 and argv[4] == "--window" else None
        filling(argv[2], [int(x) for x in argv[3].split(",")], window)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
