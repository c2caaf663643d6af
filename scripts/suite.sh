#!/usr/bin/env bash
# The simulator's suite over issue 20's grid — 8, 64 and 512 ranks at `--cpu-per-accel` 0.5,
# 0.75, 1.0 and 1.25 — then its tables and the check of the issue's suite targets
# (`scripts/suite_tables.py`). The simulator is deterministic: one run of each point is its
# figure. On 2 cores the 512-rank runs take most of it (~8–12 min each, all six policies).
#
#   scripts/suite.sh [OUT=target/suite]
#   RANKS="8 64" BUDGETS="1.0" JOBS=2 BIN=target/release/datahelix scripts/suite.sh /tmp/s
#
# Writes OUT/s<ranks>_<budget>.json (`sim --suite scripts/workloads --json`), then prints the
# per-regime table at 8 ranks and X = 1.0 (where run), the budget table, the new regimes'
# workloads, and the check; exits 1 when a target fails.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-target/suite}
RANKS=${RANKS:-8 64 512}
BUDGETS=${BUDGETS:-0.5 0.75 1.0 1.25}
JOBS=${JOBS:-$(nproc)}
BIN=${BIN:-target/release/datahelix}
[ -x "$BIN" ] || { echo "suite: $BIN is not built; run cargo build --release" >&2; exit 2; }
mkdir -p "$OUT"

# Largest first, so that the long runs do not end last on one core.
points=()
for r in $RANKS; do
  for x in $BUDGETS; do
    points+=("$r $x")
  done
done
# Each line, "ranks budget", is appended to the command: $0 the binary, $1 OUT, $2 $3 the point.
printf '%s\n' "${points[@]}" | sort -k1,1nr | xargs -P "$JOBS" -L 1 sh -c '
  out="$1/s$2_$3"
  "$0" sim --suite scripts/workloads --ranks "$2" --cpu-per-accel "$3" --json > "$out.json.part" 2> "$out.log" \
    && mv "$out.json.part" "$out.json" && echo "suite: $2 ranks, X = $3 done" >&2' "$BIN" "$OUT"

runs=()
for r in $RANKS; do
  for x in $BUDGETS; do
    [ -s "$OUT/s${r}_$x.json" ] || { echo "suite: $OUT/s${r}_$x.json missing (see $OUT/s${r}_$x.log)" >&2; exit 2; }
    runs+=("$OUT/s${r}_$x.json")
  done
done
if [ -s "$OUT/s8_1.0.json" ]; then
  python3 scripts/suite_tables.py regimes "$OUT/s8_1.0.json"
fi
python3 scripts/suite_tables.py budgets "${runs[@]}"
echo
python3 scripts/suite_tables.py workloads --only egoexo4d-4k,epic-kitchens-100,miradata-long,opensora-1.2-buckets "${runs[@]}"
echo
python3 scripts/suite_tables.py check "${runs[@]}"
