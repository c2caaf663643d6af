"""One rank of the Python package's weighted-mix test (run under mpirun), and its check.

    mpirun -np 2 python mix.py --data DIR --out OUTDIR
    python mix.py --data DIR --out OUTDIR --check

``mix="videos=1,images=1"``: every global batch draws half its samples from the dataset's
``images/`` folder, however few images it holds. Each rank writes ``OUTDIR/rank-R.json`` (per
step the ids it delivered and skipped, and its ``state_dict()`` at the end); ``--check`` (one
process, after the run) sums the ranks' batches and checks the shares, and that the state
records the mix.
"""

import argparse
import json
import os

import datahelix

MIX = "videos=1,images=1"


def run(args):
    steps = {}
    with datahelix.Loader(
        data=args.data, global_batch=args.global_batch, steps=args.steps, seed=5, workers=2,
        cpu_budget=False, budget_mib=64, mix=MIX,
    ) as loader:
        rank = loader.rank
        for batch in loader:
            steps[batch.step] = list(batch.ids) + list(batch.skipped)
        state = loader.state_dict()
    with open(os.path.join(args.out, f"rank-{rank}.json"), "w") as f:
        json.dump({"steps": steps, "state": state}, f)


def check(args):
    rows = [json.loads(line) for line in open(os.path.join(args.data, "manifest.jsonl")) if line.strip()]
    images = {r["id"] for r in rows if r["path"].startswith("images/")}
    assert 0 < len(images) < len(rows) / 2, f"{len(images)} images of {len(rows)}: the test wants few"
    ranks = [json.load(open(os.path.join(args.out, name)))
             for name in sorted(os.listdir(args.out)) if name.startswith("rank-")]
    assert len(ranks) == 2, ranks
    for step in range(args.steps):
        ids = [i for r in ranks for i in r["steps"][str(step)]]
        assert len(ids) == args.global_batch, (step, ids)
        drawn = sum(i in images for i in ids)
        assert drawn == args.global_batch // 2, f"step {step}: {drawn} images of {len(ids)}"
    for r in ranks:
        state = json.loads(r["state"]) if isinstance(r["state"], str) else r["state"]
        assert state["mix"] == "images=1,videos=1", state
    print(f"mix: {args.steps} steps, half of every batch from {len(images)} images, the state records the mix")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--global-batch", type=int, default=4)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    check(args) if args.check else run(args)


if __name__ == "__main__":
    main()
