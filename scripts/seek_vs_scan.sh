#!/usr/bin/env bash
# Seeking against scanning on the same clips: `datahelix decode --strategy scan|seek` on every
# video of a generated dataset, one worker, rounds interleaved. Prints each decode's total over
# the clips (median of the rounds, range), its ratio to the scan of the same round, the range of
# a clip's median time against its scan, and whether the bytes equal the scan's. OTHER names a
# second binary (an older build, say) whose seeking decode runs in the same rounds.
#
#   scripts/seek_vs_scan.sh                          # 3 rounds, scripts/specs/skewed.json
#   ROUNDS=5 OTHER=/tmp/datahelix-before scripts/seek_vs_scan.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh

SPEC=${SPEC:-scripts/specs/skewed.json}
DATA=${DATA:-data/$(basename "$SPEC" .json)}
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-target/seek-vs-scan}
OTHER=${OTHER:-}

cargo build --release --quiet --bin datahelix
bin=$PWD/target/release/datahelix
"$bin" gen --spec "$SPEC" --out "$DATA" >&2
"$bin" index "$DATA" >&2
mkdir -p "$OUT"
rm -f "$OUT"/*.json
for round in $(seq "$ROUNDS"); do
    "$bin" decode "$DATA" --strategy scan --workers 1 --json --out "$OUT/scan.$round.json"
    "$bin" decode "$DATA" --strategy seek --workers 1 --json --out "$OUT/seek.$round.json"
    if [ -n "$OTHER" ]; then
        "$OTHER" decode "$DATA" --strategy seek --workers 1 --json --out "$OUT/other-seek.$round.json"
    fi
done
python3 - "$OUT" "$ROUNDS" "${OTHER:+other-seek}" <<'PY'
import json, statistics as st, sys
out, rounds, other = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def runs(name):
    # Per round: video clip id -> (seconds, sha256); images (one frame) left out.
    docs = [json.load(open(f"{out}/{name}.{r}.json")) for r in range(1, rounds + 1)]
    return [{s["id"]: (s["seconds"], s["sha256"]) for s in d["samples"]
             if s["error"] is None and s["shape"][0] > 1} for d in docs]
scan = runs("scan")
ids = sorted(scan[0])
scan_totals = [sum(run[i][0] for i in ids) for run in scan]
names = ["scan", "seek"] + ([other] if other else [])
print(f"{len(ids)} clips, {rounds} rounds: median (range)")
for name in names:
    rs = scan if name == "scan" else runs(name)
    totals = [sum(run[i][0] for i in ids) for run in rs]
    ratio = [t / s for t, s in zip(totals, scan_totals)]
    clip = [st.median(run[i][0] for run in rs) / st.median(run[i][0] for run in scan) for i in ids]
    same = all(run[i][1] == scan[0][i][1] for run in rs for i in ids)
    print(f"{name:10s} total {st.median(totals):6.2f} s ({min(totals):.2f}-{max(totals):.2f})"
          f"  of the scan {st.median(ratio):.3f} ({min(ratio):.3f}-{max(ratio):.3f})"
          f"  a clip {min(clip):.2f}-{max(clip):.2f}  bytes as the scan's: {same}")
PY
