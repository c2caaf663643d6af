"""Builds the PyTorch C++ extension of csrc/examples/pytorch with torch.utils.cpp_extension and
runs it on batches of the C library (through the ctypes example), one rank of an MPI job.

    python torch_cpp_extension.py --build-only --repo REPO --lib DIR --data - --out - --build BUILD
    mpirun -np 2 python torch_cpp_extension.py --repo REPO --lib DIR --data DATASET --out OUTDIR --build BUILD

Checks that the tensors it wraps view the batch (no copy), stay valid after the batch's Python
object, the next steps and the loader's close, and hold the bytes ``datahelix decode`` gives
(check_runs.py, from ``OUTDIR/rank-R.json``).
"""

import argparse
import hashlib
import json
import os
import sys

import torch
from torch.utils.cpp_extension import load


def sha(t):
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()


def main():
    ap = argparse.ArgumentParser()
    for a in ("--repo", "--lib", "--data", "--out", "--build"):
        ap.add_argument(a, required=True)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--build-only", action="store_true", help="build the extension, then exit")
    args = ap.parse_args()
    if args.build_only:  # once, before the ranks start (ranks building at once would race)
        os.makedirs(args.build, exist_ok=True)
        load("datahelix_torch", [os.path.join(args.repo, "csrc/examples/pytorch/datahelix_torch.cpp")],
             extra_include_paths=[os.path.join(args.repo, "csrc/include")],
             extra_ldflags=[f"-L{args.lib}", "-ldatahelix", f"-Wl,-rpath,{args.lib}"],
             build_directory=args.build, verbose=False)
        print(f"built {args.build}/datahelix_torch.so", flush=True)
        return
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    sys.path.insert(0, args.build)
    import datahelix_torch as ext

    sys.path.insert(0, os.path.join(args.repo, "csrc/examples/python"))
    import datahelix as dhc  # the ctypes example over libdatahelix.so

    lib = dhc.load_library(os.path.join(args.lib, "libdatahelix.so"))
    kept, steps = [], []
    with dhc.Loader(lib=lib, data=args.data, global_batch=4, workers=2, steps=args.steps, seed=3,
                    cpu_budget="false") as loader:
        while (batch := loader.next_batch()) is not None:
            step, skipped = batch.step, batch.skipped
            ids, frames = ext.wrap_batch(batch.detach())
            del batch  # only the torch tensors own the batch now
            for sid, f in zip(ids, frames):
                assert f.dtype == torch.uint8 and f.dim() == 4 and f.shape[3] == 3, (sid, f.shape)
                kept.append((f, sha(f)))
            steps.append({"step": step, "ids": ids, "skipped": skipped, "sha256": [sha(f) for f in frames]})
            loader.report_step(0.01)
    for f, digest in kept:
        assert sha(f) == digest, "a wrapped tensor changed after its step"
    with open(os.path.join(args.out, f"rank-{rank}.json"), "w") as f:
        json.dump({"rank": rank, "steps": steps}, f)
    print(f"ok {rank}", flush=True)


if __name__ == "__main__":
    main()
