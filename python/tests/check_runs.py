"""Checks what the ranks of a Python run wrote (``rank-R.json`` per rank, see keep_arrays.py
and torch_ddp.py) against the dataset and, optionally, against a resumed run.

    python check_runs.py --data DIR --bin target/debug/datahelix --run OUTDIR [--resumed OUTDIR2]

- exactly once: within each epoch (``samples / global_batch`` steps) every sample of the
  manifest is delivered or skipped exactly once over all ranks;
- every delivered tensor's sha256 equals that of ``datahelix decode DIR --json`` (FFmpeg's
  decode of the same sample, outside the loader);
- the ranks' model parameters are equal where they wrote their digests (``params_sha256``,
  torch_ddp.py: DDP kept the replicas equal);
- a resumed run's steps deliver the uninterrupted run's global batches: the same ids with the
  same bytes (over all ranks: which rank gets which sample may differ).
"""

import argparse
import collections
import glob
import json
import os
import subprocess
import sys


def load_run(out):
    ranks, params = {}, {}
    for path in sorted(glob.glob(os.path.join(out, "rank-*.json"))):
        with open(path) as f:
            r = json.load(f)
        ranks[r["rank"]] = {s["step"]: s for s in r["steps"]}
        if "params_sha256" in r:
            params[r["rank"]] = r["params_sha256"]
    assert ranks, f"no rank-*.json in {out}"
    assert not params or (len(params) == len(ranks) and len(set(params.values())) == 1), \
        f"the ranks' model parameters differ after training (sha256 by rank: {params})"
    return ranks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--global-batch", type=int, default=4)
    ap.add_argument("--resumed", default=None)
    args = ap.parse_args()

    with open(os.path.join(args.data, "manifest.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    manifest = [r["id"] for r in rows]
    # A batch's metadata: the sample's path and its manifest row's other fields.
    want_meta = {r["id"]: {k: v for k, v in r.items() if k not in ("id", "text_tokens")} for r in rows}
    decoded = json.loads(subprocess.run([args.bin, "decode", args.data, "--json"], check=True,
                                        capture_output=True, text=True).stdout)
    want = {s["id"]: s["sha256"] for s in decoded["samples"] if s["error"] is None}
    want_times = {s["id"]: s["timestamps_s"] for s in decoded["samples"] if s["error"] is None}

    run = load_run(args.run)
    steps = sorted({s for r in run.values() for s in r})
    per_epoch = len(manifest) // args.global_batch
    epochs = collections.defaultdict(list)
    checked = metas = 0
    for rank, by_step in run.items():
        for step, s in by_step.items():
            epochs[step // per_epoch] += s["ids"] + s["skipped"]
            for sid, digest in zip(s["ids"], s["sha256"]):
                assert want.get(sid) == digest, f"rank {rank} step {step}: sample {sid}'s bytes differ from datahelix decode"
                checked += 1
            for sid, times in zip(s["ids"], s.get("timestamps", [])):
                assert len(times) == len(want_times[sid]) and all(abs(a - b) < 1e-9 for a, b in zip(times, want_times[sid])), \
                    f"rank {rank} step {step}: sample {sid}'s frame times {times} are not {want_times[sid]}"
            for sid, meta in zip(s["ids"], s.get("meta", [])):
                assert meta == want_meta[sid], f"rank {rank} step {step}: sample {sid}'s metadata {meta} is not {want_meta[sid]}"
                metas += 1
    for e, ids in epochs.items():
        full = (e + 1) * per_epoch <= len(steps)
        dup = [i for i, n in collections.Counter(ids).items() if n > 1]
        assert not dup, f"epoch {e}: delivered more than once: {dup}"
        if full:
            assert sorted(ids) == sorted(manifest), f"epoch {e}: not every sample exactly once"
    print(f"check: {len(run)} ranks, {len(steps)} steps, {checked} tensors equal datahelix decode's, "
          f"{metas} samples' metadata equal the manifest's, every epoch exactly once")

    if args.resumed:
        resumed = load_run(args.resumed)
        first = min(s for r in resumed.values() for s in r)
        assert first > 0, "the resumed run started at step 0"
        # The global batch of each step is the uninterrupted run's; which rank gets which sample
        # may differ (helix places samples by measured costs, which a new process learns anew).
        def global_batch(r, step):
            return sorted((sid, d) for by_step in r.values() if step in by_step
                          for sid, d in zip(by_step[step]["ids"] + by_step[step]["skipped"],
                                            by_step[step]["sha256"] + [None] * len(by_step[step]["skipped"])))
        later = sorted({s for r in resumed.values() for s in r})
        assert later == [s for s in steps if s >= first], f"resumed steps {later}, uninterrupted {steps}"
        for step in later:
            assert global_batch(resumed, step) == global_batch(run, step), f"step {step}: resumed global batch differs"
        print(f"check: resumed at step {first}: every later step's global batch (ids and bytes) equals the "
              f"uninterrupted run's")


if __name__ == "__main__":
    sys.exit(main())
