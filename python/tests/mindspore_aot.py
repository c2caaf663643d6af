"""MindSpore on DataHelix batches, one rank of an MPI job (CPU):

- ``--aot``: builds the AOT custom op of csrc/examples/mindspore with g++ and runs it in
  ``ops.Custom(func_type="aot")`` on batches of the C library (through the ctypes example): each
  sample copied into a MindSpore tensor by the op must equal the batch's bytes;
- otherwise: the Python package's arrays into ``mindspore.Tensor.from_numpy`` (no copy: a write
  through the array shows in the tensor), kept past the step and the loader's close.

    mpirun -np 2 python mindspore_aot.py --aot --repo REPO --lib DIR --data DATASET --out OUTDIR --build BUILD
    mpirun -np 2 python mindspore_aot.py --repo REPO --lib - --data DATASET --out OUTDIR --build -

Writes ``OUTDIR/rank-R.json`` for check_runs.py (exactly once, bytes equal datahelix decode's).
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import mindspore as ms
from mindspore import ops


def sha(a):
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def build_op(repo, lib, build):
    os.makedirs(build, exist_ok=True)
    so = os.path.join(build, "datahelix_aot.so")
    subprocess.run(["g++", "-shared", "-fPIC", "-O2", "-I", os.path.join(repo, "csrc/include"),
                    os.path.join(repo, "csrc/examples/mindspore/datahelix_aot.cc"), f"-L{lib}", "-ldatahelix",
                    f"-Wl,-rpath,{lib}", "-o", so], check=True)
    return so


def run_aot(args, rank):
    so = build_op(args.repo, args.lib, os.path.join(args.build, f"rank-{rank}"))
    sys.path.insert(0, os.path.join(args.repo, "csrc/examples/python"))
    import datahelix as dhc  # the ctypes example over libdatahelix.so

    lib = dhc.load_library(os.path.join(args.lib, "libdatahelix.so"))
    steps = []
    with dhc.Loader(lib=lib, data=args.data, global_batch=4, workers=2, steps=args.steps, seed=3,
                    cpu_budget="false") as loader:
        while (batch := loader.next_batch()) is not None:
            handle = ms.Tensor(np.array(batch._handle.value, dtype=np.int64))
            digests = []
            for i, view in enumerate(batch.tensors):
                shape = tuple(view.shape)
                op = ops.Custom(f"{so}:DataHelixSample", out_shape=lambda h, j, like: like[:3] + [3],
                                out_dtype=ms.uint8, func_type="aot")
                like = ms.Tensor(np.zeros(shape[:3] + (0,), dtype=np.uint8))
                out = op(handle, ms.Tensor(np.array(i, dtype=np.int64)), like).asnumpy()
                assert out.shape == shape and np.array_equal(out, view), f"sample {batch.ids[i]}: the op's copy differs"
                digests.append(sha(out))
            steps.append({"step": batch.step, "ids": batch.ids, "skipped": batch.skipped, "sha256": digests})
            loader.report_step(0.01)
            batch.release()
    return steps


def run_package(args):
    import datahelix

    steps, kept = [], []
    with datahelix.Loader(data=args.data, global_batch=4, workers=2, steps=args.steps, seed=3,
                          cpu_budget=False) as loader:
        for batch in loader:
            digests = []
            for a in batch.tensors:
                t = ms.Tensor.from_numpy(a)
                before = int(a[0, 0, 0, 0])
                a[0, 0, 0, 0] ^= 0xFF
                assert int(t.asnumpy()[0, 0, 0, 0]) == int(a[0, 0, 0, 0]), "from_numpy copied the array"
                a[0, 0, 0, 0] = before
                digests.append(sha(a))
                kept.append((t, digests[-1]))
            steps.append({"step": batch.step, "ids": batch.ids, "skipped": batch.skipped, "sha256": digests})
            loader.report_step(0.01)
    for t, digest in kept:
        assert sha(t.asnumpy()) == digest, "a MindSpore tensor kept past its step changed"
    return steps


def main():
    ap = argparse.ArgumentParser()
    for a in ("--repo", "--lib", "--data", "--out", "--build"):
        ap.add_argument(a, required=True)
    ap.add_argument("--aot", action="store_true")
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    ms.set_device("CPU")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    steps = run_aot(args, rank) if args.aot else run_package(args)
    with open(os.path.join(args.out, f"rank-{rank}.json"), "w") as f:
        json.dump({"rank": rank, "steps": steps}, f)
    print(f"ok {rank}", flush=True)


if __name__ == "__main__":
    main()
