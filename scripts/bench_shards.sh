#!/usr/bin/env bash
# Indexing throughput: the same N samples (default 10,000) as loose files with a manifest.jsonl
# and as WebDataset tar shards of 1,000 samples (written by the webdataset package's ShardWriter:
# each sample a media member, a .json and a .txt), each indexed from scratch (--force) REPEAT
# times (default 3) by the release binary; prints the median seconds, the range and samples/s
# of each, and the ratio. Media: the clips of scripts/specs/codecs_tiny.json (H.264, HEVC, VP9,
# AV1 in MP4 and WebM), repeated. Both datasets are read from the page cache after the first run.
#
#   scripts/bench_shards.sh [N] [REPEAT] [WORK_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-10000}
REPEAT=${2:-3}
WORK=${3:-/tmp/datahelix-bench-shards}
BIN=target/release/datahelix
PY=${DH_VENV:-.venv}/bin/python
[ -x "$BIN" ] || cargo build --release --bin datahelix
[ -x "$PY" ] || { echo "no Python environment at $PY: run scripts/setup.sh" >&2; exit 1; }

rm -rf "$WORK"
mkdir -p "$WORK"
"$BIN" gen --spec scripts/specs/codecs_tiny.json --out "$WORK/clips" >/dev/null
"$PY" - "$WORK" "$N" <<'EOF'
import json, os, shutil, sys
import webdataset as wds
work, n = sys.argv[1], int(sys.argv[2])
clips = [json.loads(l) for l in open(f"{work}/clips/manifest.jsonl") if l.strip()]
media = [(c["path"].rsplit(".", 1)[1], open(f"{work}/clips/{c['path']}", "rb").read()) for c in clips]
os.makedirs(f"{work}/loose/media")
os.makedirs(f"{work}/shards")
with open(f"{work}/loose/manifest.jsonl", "w") as manifest, \
     wds.ShardWriter(f"{work}/shards/train-%06d.tar", maxcount=1000, verbose=0) as sink:
    for i in range(n):
        ext, data = media[i % len(media)]
        caption = f"sample {i}: a clip of the benchmark"
        path = f"media/{i:06d}.{ext}"
        with open(f"{work}/loose/{path}", "wb") as f:
            f.write(data)
        manifest.write(json.dumps({"id": i, "path": path, "text_tokens": 7, "caption": caption}) + "\n")
        sink.write({"__key__": f"{i:06d}", ext: data, "json": {"id": i, "text_tokens": 7}, "txt": caption})
EOF

run() { # dataset -> seconds of one forced index
  local t0 t1
  t0=$(date +%s.%N)
  "$BIN" index "$1" --force --json >"$WORK/last.json"
  t1=$(date +%s.%N)
  python3 -c "import json,sys; d=json.load(open('$WORK/last.json')); assert d['ok']==$N, d" >&2
  python3 -c "print($t1 - $t0)"
}
declare -A times
for kind in loose shards; do
  "$BIN" index "$WORK/$kind" --force --json >/dev/null # warm the page cache
  for _ in $(seq "$REPEAT"); do times[$kind]+="$(run "$WORK/$kind") "; done
done
python3 - "$N" "${times[loose]}" "${times[shards]}" <<'EOF'
import statistics, sys
n = int(sys.argv[1])
loose, shards = ([float(x) for x in a.split()] for a in sys.argv[2:4])
for name, t in (("loose files", loose), ("tar shards", shards)):
    m = statistics.median(t)
    print(f"{name:12} {n} samples: median {m:.2f} s (range {min(t):.2f}-{max(t):.2f}), {n / m:.0f} samples/s")
print(f"shards / loose samples/s: {statistics.median(loose) / statistics.median(shards):.2f}")
EOF
