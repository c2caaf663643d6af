"""One rank of the Python package's ownership and resume test (run under mpirun).

    mpirun -np 2 python keep_arrays.py --data DIR --out OUTDIR [--save-state-at K] [--resume 'DIR/state-{rank}.json']

Keeps every array of every batch until the end of the run and after the loader is closed, then
checks that each still holds the bytes it held when delivered; checks that an array alone keeps
its batch alive and that a batch's memory is freed with its last array; writes
``OUTDIR/rank-R.json`` (every delivered id with the sha256 of its bytes, per step) for
``check_runs.py`` to compare with ``datahelix decode`` and across runs.
"""

import argparse
import gc
import hashlib
import json
import os
import threading

import numpy as np

import datahelix
from datahelix import _native


def sha(a):
    return hashlib.sha256(memoryview(a).cast("B")).hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--global-batch", type=int, default=4)
    ap.add_argument("--policy", default="helix")
    ap.add_argument("--save-state-at", type=int, default=None)
    ap.add_argument("--resume", default=None)
    ap.add_argument("--prepare-at-open", action="store_true",
                    help="call prepare_ahead once, before the first batch (after resuming)")
    args = ap.parse_args()

    # A bad setting is refused before anything is opened, with the library's code and message.
    try:
        datahelix.Loader(data=args.data, bogus_key=1)
        raise AssertionError("an unknown key was accepted")
    except datahelix.Error as e:
        assert e.name == "DH_UNKNOWN_KEY" and e.code == 4 and "bogus_key" in e.message, e

    settings = dict(data=args.data, policy=args.policy, global_batch=args.global_batch, workers=2,
                    steps=args.steps, seed=3, cpu_budget=False, budget_mib=64)
    kept = []        # (step, id, array, sha at delivery) of every delivered sample
    steps = []
    with datahelix.Loader(**settings) as loader:
        rank = loader.rank
        # A loader is used from the thread that made it (MPI runs at MPI_THREAD_FUNNELED): another
        # thread gets an exception, and the loader goes on.
        refused = []

        def from_another_thread():
            try:
                loader.next()
            except datahelix.Error as e:
                refused.append(e)

        t = threading.Thread(target=from_another_thread)
        t.start()
        t.join()
        assert refused and refused[0].name == "DH_WRONG_THREAD", refused
        if args.resume:
            with open(args.resume.format(rank=rank)) as f:
                loader.load_state_dict(json.load(f))
        if args.prepare_at_open:
            loader.prepare_ahead()
        for batch in loader:
            arrays = batch.tensors
            assert len(arrays) == len(batch.ids) == len(batch.tokens), batch
            for sid, a in zip(batch.ids, arrays):
                assert a.dtype == np.uint8 and a.ndim == 4 and a.shape[3] == 3, (sid, a.dtype, a.shape)
                assert not a.flags.owndata and a.flags.c_contiguous and a.flags.writeable, a.flags
                assert memoryview(batch.tensor(batch.ids.index(sid))).shape == a.shape
                kept.append((batch.step, sid, a, sha(a)))
            assert len(batch.meta) == len(batch.ids) and all("path" in m for m in batch.meta), batch.meta
            assert [len(t) for t in batch.timestamps] == [a.shape[0] for a in arrays], batch.timestamps
            steps.append({"step": batch.step, "ids": batch.ids, "skipped": batch.skipped,
                          "sha256": [sha(a) for a in arrays], "meta": batch.meta,
                          "timestamps": batch.timestamps})
            if args.save_state_at is not None and batch.step == args.save_state_at:
                state = loader.state_dict()
                # The skip budget's count covers the steps delivered, not those planned ahead.
                assert state["skips"] == {"planned": (batch.step + 1) * args.global_batch, "failed": 0,
                                          "ids": []}, state["skips"]
                with open(os.path.join(args.out, f"state-{rank}.json"), "w") as f:
                    json.dump(state, f)
            del batch, arrays  # only the arrays keep the batches now
        metrics = loader.metrics()
        assert metrics["steps"] == len(steps), metrics
    # The loader is closed: every array is still valid and unchanged.
    batches = {s for s, *_ in kept}
    assert _native.live_batches() == len(batches), (_native.live_batches(), len(batches))
    for step, sid, a, digest in kept:
        assert sha(a) == digest, f"sample {sid} of step {step} changed after its step"
    del a  # the loop variable holds the last array
    # A batch's memory goes with its last array.
    first = kept[0][0]
    kept = [k for k in kept if k[0] != first]
    gc.collect()
    assert _native.live_batches() == len(batches) - 1, _native.live_batches()
    kept.clear()
    gc.collect()
    assert _native.live_batches() == 0, _native.live_batches()

    with open(os.path.join(args.out, f"rank-{rank}.json"), "w") as f:
        json.dump({"rank": rank, "steps": steps, "metrics": metrics}, f)
    print(f"ok {rank}", flush=True)


if __name__ == "__main__":
    main()
