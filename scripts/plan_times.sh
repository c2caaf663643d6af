#!/usr/bin/env bash
# Planning time at scale, per in-tree workload: `datahelix sim --ranks R --steps S --policy helix
# --json` REPEAT times per workload (default 3), and the median (min–max) of helix's mean plan
# time per step (`plan_s_per_step`) and of its slowest plan (`plan_max_s`), in milliseconds,
# beside the run's throughput (samples/s) and efficiency against the sound bound (what the
# plans made of the run: a faster planner must not buy its speed with worse plans).
# The plans are deterministic; their times are not (the machine's speed varies by the hour:
# compare binaries in one run, BASE naming the other one, interleaved workload by workload).
#
#   scripts/plan_times.sh [RANKS=4096] [STEPS=12] [REPEAT=3]
#   BIN=target/release/datahelix BASE=/path/to/older/datahelix scripts/plan_times.sh
#   WORKLOADS="kinetics700_10s hdvila_long" scripts/plan_times.sh
#
# Prints one line per workload and binary, then the mean over workloads of the medians.
set -euo pipefail
cd "$(dirname "$0")/.."
RANKS=${1:-4096}
STEPS=${2:-12}
REPEAT=${3:-3}
BIN=${BIN:-target/release/datahelix}
BASE=${BASE:-}
WORKLOADS=${WORKLOADS:-$(cd scripts/workloads && ls ./*.toml | sed 's|^\./||; s|\.toml$||')}
[ -x "$BIN" ] || { echo "plan_times: $BIN is not built; run cargo build --release" >&2; exit 2; }
[ -z "$BASE" ] || [ -x "$BASE" ] || { echo "plan_times: BASE=$BASE is not an executable" >&2; exit 2; }

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
bins=("$BIN")
[ -n "$BASE" ] && bins+=("$BASE")
for w in $WORKLOADS; do
  for k in $(seq 1 "$REPEAT"); do
    for b in "${!bins[@]}"; do
      "${bins[$b]}" sim --workload "scripts/workloads/$w.toml" --ranks "$RANKS" --steps "$STEPS" \
        --policy helix --json > "$out/$w.$b.$k.json"
    done
  done
done

python3 - "$out" "$RANKS" "$STEPS" "$REPEAT" "${#bins[@]}" "${bins[@]}" <<'EOF'
import glob, json, statistics, sys
out, ranks, steps, repeat, nbins = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
bins = sys.argv[6:]
print(f"helix planning at {ranks} ranks, {steps} steps, {repeat} runs: median (min-max) ms")
print(f"{'workload':26} {'binary':32} {'mean per step':>24} {'slowest plan':>24} {'samples/s':>10} {'efficiency':>10}")
medians = {b: ([], []) for b in range(nbins)}
names = sorted({p.split('/')[-1].split('.')[0] for p in glob.glob(f"{out}/*.json")})
fmt = lambda v: f"{statistics.median(v):7.1f} ({min(v):.1f}-{max(v):.1f})"
for w in names:
    for b in range(nbins):
        runs = [json.load(open(f"{out}/{w}.{b}.{k}.json"))["policies"]["helix"] for k in range(1, repeat + 1)]
        mean = [r["plan_s_per_step"] * 1e3 for r in runs]
        worst = [r["plan_max_s"] * 1e3 for r in runs]
        medians[b][0].append(statistics.median(mean))
        medians[b][1].append(statistics.median(worst))
        tput = statistics.median(r["throughput"] for r in runs)
        eff = statistics.median(r["efficiency"] for r in runs)
        print(f"{w:26} {bins[b][-32:]:32} {fmt(mean):>24} {fmt(worst):>24} {tput:10.1f} {eff:10.3f}")
for b in range(nbins):
    m, x = medians[b]
    print(f"{'all (mean of medians)':26} {bins[b][-32:]:32} {statistics.mean(m):24.1f} {statistics.mean(x):24.1f}"
          f"   worst {max(x):.1f}")
EOF
