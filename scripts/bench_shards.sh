#!/usr/bin/env bash
# Indexing throughput: the same N samples (default 10,000) as loose files with a manifest.jsonl,
# as WebDataset tar shards of 1,000 samples (written by the webdataset package's ShardWriter:
# each sample a media member, a .json and a .txt), and as the same members in zip archives of
# 1,000 samples, stored (`zip -0`'s way) and deflated (Python's zipfile), each indexed from
# scratch (--force) REPEAT times (default 3) by the release binary; prints the median seconds,
# the range and samples/s of each, and the ratio to loose files. Media: the clips of
# scripts/specs/codecs_tiny.json (H.264, HEVC, VP9, AV1 in MP4 and WebM), repeated. Every
# dataset is read from the page cache after the first run. Then decoding: the first D samples
# (default 2,000; ids 0..D-1) of each, `datahelix decode --ids` REPEAT times (a deflated member
# is inflated at every decode).
#
#   scripts/bench_shards.sh [N] [REPEAT] [WORK_DIR] [D]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-10000}
REPEAT=${2:-3}
WORK=${3:-/tmp/datahelix-bench-shards}
D=${4:-2000}
BIN=target/release/datahelix
PY=${DH_VENV:-.venv}/bin/python
[ -x "$BIN" ] || cargo build --release --bin datahelix
[ -x "$PY" ] || { echo "no Python environment at $PY: run scripts/setup.sh" >&2; exit 1; }

rm -rf "$WORK"
mkdir -p "$WORK"
"$BIN" gen --spec scripts/specs/codecs_tiny.json --out "$WORK/clips" >/dev/null
"$PY" - "$WORK" "$N" <<'EOF'
import json, os, shutil, sys, zipfile
import webdataset as wds
work, n = sys.argv[1], int(sys.argv[2])
clips = [json.loads(l) for l in open(f"{work}/clips/manifest.jsonl") if l.strip()]
media = [(c["path"].rsplit(".", 1)[1], open(f"{work}/clips/{c['path']}", "rb").read()) for c in clips]
os.makedirs(f"{work}/loose/media")
os.makedirs(f"{work}/shards")
os.makedirs(f"{work}/zip-stored")
os.makedirs(f"{work}/zip-deflated")
zips = []
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
        if i % 1000 == 0:
            for z in zips:
                z.close()
            zips = [zipfile.ZipFile(f"{work}/zip-{kind}/train-{i // 1000:06d}.zip", "w", method)
                    for kind, method in (("stored", zipfile.ZIP_STORED), ("deflated", zipfile.ZIP_DEFLATED))]
        for z in zips:
            z.writestr(f"{i:06d}.{ext}", data)
            z.writestr(f"{i:06d}.json", json.dumps({"id": i, "text_tokens": 7}))
            z.writestr(f"{i:06d}.txt", caption)
for z in zips:
    z.close()
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
KINDS=(loose shards zip-stored zip-deflated)
for kind in "${KINDS[@]}"; do
  "$BIN" index "$WORK/$kind" --force --json >/dev/null # warm the page cache
  for _ in $(seq "$REPEAT"); do times[$kind]+="$(run "$WORK/$kind") "; done
done
report() { # what count times... -> one line per dataset kind
  python3 - "$@" <<'EOF'
import statistics, sys
what, n = sys.argv[1], int(sys.argv[2])
names = ("loose files", "tar shards", "zip, stored", "zip, deflated")
runs = [[float(x) for x in a.split()] for a in sys.argv[3:7]]
loose = statistics.median(runs[0])
for name, t in zip(names, runs):
    m = statistics.median(t)
    print(f"{what} {name:14} {n} samples: median {m:.2f} s (range {min(t):.2f}-{max(t):.2f}), "
          f"{n / m:.0f} samples/s ({loose / m:.2f}x loose)")
EOF
}
report index "$N" "${times[loose]}" "${times[shards]}" "${times[zip-stored]}" "${times[zip-deflated]}"

IDS=$(seq -s, 0 $((D - 1)))
decode() { # dataset -> seconds of one decode of ids 0..D-1
  local t0 t1
  t0=$(date +%s.%N)
  "$BIN" decode "$1" --ids "$IDS" --json --out "$WORK/decoded.json"
  t1=$(date +%s.%N)
  python3 -c "import json,sys; d=json.load(open('$WORK/decoded.json')); assert d['ok']==$D, {k: d[k] for k in ('ok', 'failed')}" >&2
  python3 -c "print($t1 - $t0)"
}
declare -A decoded
for kind in "${KINDS[@]}"; do
  for _ in $(seq "$REPEAT"); do decoded[$kind]+="$(decode "$WORK/$kind") "; done
done
report decode "$D" "${decoded[loose]}" "${decoded[shards]}" "${decoded[zip-stored]}" "${decoded[zip-deflated]}"
