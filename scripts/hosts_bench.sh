#!/usr/bin/env bash
# The input policies across two hosts joined by a slow link: `scripts/hosts.sh`'s network
# namespaces, two ranks a host, TCP between hosts held to MBIT Mbit/s, shared memory on a host,
# each rank's CPU budget enforced as in the demo. Helix runs twice: pricing transfers with the
# constant model (20 µs + 5 GB/s, a node's link) and with `--transfer-model measured` (each
# class of link measured at start-up). Rounds alternate the variants; the table gives each
# one's median over the rounds with the range.
#
#   scripts/hosts_bench.sh                  # 3 rounds, 20 Mbit/s, data/skewed_small
#   ROUNDS=5 MBIT=100 scripts/hosts_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh

SPEC=${SPEC:-scripts/specs/skewed_small.json}
DATA=${DATA:-data/$(basename "$SPEC" .json)}
MBIT=${MBIT:-20}
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-target/hosts-bench}
ARGS=(--global-batch 16 --workers 4 --cores 1.6 --steps 20 --warmup 3 --profile 0.1,1e-4,1.7e-6,0.05)

cargo build --release --quiet --bin datahelix
bin=$PWD/target/release/datahelix
"$bin" gen --spec "$SPEC" --out "$DATA" >&2
"$bin" index "$DATA" >&2
mkdir -p "$OUT"

name="dhbench$$"
trap 'scripts/hosts.sh down "$name"' EXIT
scripts/hosts.sh up "$name" 2 "$MBIT"

run() { # variant round policy extra...
  local variant=$1 round=$2 policy=$3
  shift 3
  echo "== round $round: $variant" >&2
  scripts/hosts.sh mpirun "$name" 2 "$bin" train --data "$PWD/$DATA" --policy "$policy" "${ARGS[@]}" \
    --out "$PWD/$OUT/$variant.$round.json" "$@" 2>&1 | grep '^train: ' >&2
}

for ((round = 1; round <= ROUNDS; round++)); do
  run rank-local "$round" rank-local
  run actor-pool "$round" actor-pool
  run helix "$round" helix
  run helix-measured "$round" helix --transfer-model measured
done

python3 - "$OUT" "$ROUNDS" "$MBIT" <<'EOF'
import json, statistics, sys
out, rounds, mbit = sys.argv[1], int(sys.argv[2]), sys.argv[3]
variants = ["rank-local", "actor-pool", "helix", "helix-measured"]
runs = {v: [json.load(open(f"{out}/{v}.{r}.json"))["summary"] for r in range(1, rounds + 1)] for v in variants}
def cell(values, fmt):
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"
print(f"2 hosts x 2 ranks, {mbit} Mbit/s between hosts, median (range) of {rounds} rounds")
print("| policy | samples/s | × rank-local | misses > 1 ms | misses > 10 ms | MB moved |")
print("|---|---|---|---|---|---|")
base = [s["throughput"] for s in runs["rank-local"]]
for v in variants:
    s = runs[v]
    ratio = [x["throughput"] / b for x, b in zip(s, base)]
    print(f"| {v} | {cell([x['throughput'] for x in s], '{:.2f}')} | {cell(ratio, '{:.2f}')} | "
          f"{cell([x['miss_rate'] for x in s], '{:.3f}')} | {cell([x['miss_rate_10ms'] for x in s], '{:.3f}')} | "
          f"{cell([x['bytes_moved'] / 1e6 for x in s], '{:.0f}')} |")
EOF
