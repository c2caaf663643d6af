"""A short emulated training loop over DataHelix from Python (ctypes + numpy).

    mpirun -np 2 python3 csrc/examples/python/train.py --data DATASET --steps 4

Prints per rank and step ``ids STEP RANK id,... skipped id,...``, the metrics, and ``ok RANK``.
"""

import argparse
import os
import json
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from datahelix import Loader  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--global-batch", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    settings = dict(data=args.data, steps=args.steps, global_batch=args.global_batch, seed=args.seed,
                    workers=2, cpu_budget=False, max_frames=4)
    with Loader(**settings) as loader:
        step = {}

        def launch(batch):
            # The emulated accelerator's step on the batch: it "runs" for accel_s from now.
            pixels = 0.0
            for frames in batch.tensors:
                assert frames.dtype == np.uint8 and frames.ndim == 4 and frames.shape[3] == 3
                assert not frames.flags.owndata  # a view of the batch's memory
                pixels += float(frames.mean())
            step["accel_s"] = 0.002 + 1e-8 * sum(batch.tokens)
            step["end"] = time.perf_counter() + step["accel_s"]

        def seconds_left():
            return max(0.0, step["end"] - time.perf_counter())

        def wait():
            time.sleep(seconds_left())
            return step["accel_s"]

        # The library drives each step (next batch, launch, planning and shipping while the step
        # runs, wait, report); the gradient all-reduce is the training loop's.
        while True:
            batch = loader.train_step(launch, wait, seconds_left)
            if batch is None:
                break
            grad = loader.all_reduce_sum(np.array([step["accel_s"], len(batch.ids) + len(batch.skipped)], dtype=np.float64))
            assert int(round(grad[1])) == args.global_batch, grad
            line = (f"ids {batch.step} {loader.rank} {','.join(map(str, batch.ids))} skipped "
                    f"{','.join(map(str, batch.skipped))}\n")
            sys.stdout.write(line)  # one write per line: ranks' output is interleaved by the launcher
            sys.stdout.flush()
            batch.release()
        m = loader.metrics()
        assert m["steps"] == args.steps, m
        # Where the run stands, as a checkpoint would save it (Loader(resume=text, ...) continues).
        state = json.loads(loader.state())
        assert state["next_step"] == args.steps and state["seed"] == args.seed, state
        print(f"state {loader.rank} next_step {state['next_step']} epoch {state['epoch']}", flush=True)
        print(f"metrics {loader.rank} {m}", flush=True)
        rank = loader.rank
    print(f"ok {rank}", flush=True)


if __name__ == "__main__":
    main()
