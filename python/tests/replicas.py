"""One rank of the Python package's replica-group test (run under mpirun).

    mpirun -np 2 python replicas.py --data DIR --out OUTDIR

``replica_ranks=2``: the two ranks form one replica group (a tensor-parallel pair). Only rank 0
decodes; rank 1 receives every batch from it (over HCCL with ``--backend hccl``). Each rank writes ``OUTDIR/rank-R.json``: per step
the sha256 of everything its batch holds (ids, skipped ids, tensors, frame times, metadata), and
its ``state_dict()`` at the end; ``--check`` (one process, after the run) compares the ranks.
"""

import argparse
import hashlib
import json
import os

import datahelix


def batch_digest(batch):
    h = hashlib.sha256()
    h.update(json.dumps([batch.step, list(batch.ids), list(batch.skipped)]).encode())
    for frames, times, meta in zip(batch.tensors, batch.timestamps, batch.meta):
        h.update(json.dumps([list(frames.shape), list(times), meta], sort_keys=True).encode())
        h.update(memoryview(frames).cast("B"))
    return h.hexdigest()


def run(args):
    steps = []
    with datahelix.Loader(
        data=args.data, global_batch=args.global_batch, steps=args.steps, seed=5, workers=2,
        cpu_budget=False, replica_ranks=2, backend=args.backend,
    ) as loader:
        rank = loader.rank
        for batch in loader:
            steps.append({
                "step": batch.step,
                "samples": len(batch.ids) + len(batch.skipped),
                "digest": batch_digest(batch),
            })
            loader.report_step(0.01)
        state = loader.state_dict()
    with open(os.path.join(args.out, f"rank-{rank}.json"), "w") as f:
        json.dump({"steps": steps, "state": state}, f)


def check(args):
    ranks = [json.load(open(os.path.join(args.out, f"rank-{r}.json"))) for r in (0, 1)]
    assert len(ranks[0]["steps"]) == args.steps, ranks[0]["steps"]
    for mine, theirs in zip(ranks[0]["steps"], ranks[1]["steps"]):
        # One data-parallel rank: the leader holds the whole global batch, and so its follower.
        assert mine["samples"] == args.global_batch, mine
        assert mine == theirs, f"step {mine['step']}: the replicas' batches differ"
    assert ranks[0]["state"] == ranks[1]["state"], "the replicas' states differ"
    state = ranks[0]["state"]
    assert state["next_step"] == args.steps, state
    # The leader's state, with what it learned and counted, on both ranks.
    assert state["skips"]["planned"] == args.steps * args.global_batch, state.get("skips")
    assert state.get("learned", {}).get("decode"), f"no decode model in the group's state: {state}"
    print(f"replicas: {args.steps} steps, byte-identical batches and states (with the leader's models) on both ranks")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--global-batch", type=int, default=4)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--backend", default="mpi", help="mpi, or hccl (a package built with the hccl feature)")
    args = ap.parse_args()
    check(args) if args.check else run(args)


if __name__ == "__main__":
    main()
