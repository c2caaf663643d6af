#!/usr/bin/env bash
# DataHelix's main job, on an embedded default workload.
#
#   scripts/demo.sh
#
# Today: generates the heavy-tailed `skewed` dataset (cached under data/skewed), indexes it
# (headers only, in parallel) and prints what the planner will see. The end-to-end emulated
# training comparison replaces this once the executor lands (see README, "What does not work yet").
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh

SPEC=${SPEC:-scripts/specs/skewed.json}
DATA=${DATA:-data/$(basename "$SPEC" .json)}

echo "== building (release)" >&2
cargo build --release --quiet --bin datahelix
bin=target/release/datahelix

echo "== generating $SPEC into $DATA (cached; first run takes a minute or two)" >&2
"$bin" gen --spec "$SPEC" --out "$DATA"

echo "== indexing $DATA" >&2
"$bin" index "$DATA"
