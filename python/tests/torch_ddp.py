"""One rank of the PyTorch test: DDP (gloo) trains a small model through datahelix.torch.

    mpirun -np 2 python torch_ddp.py --data DIR --out OUTDIR [--late --steps 12] [--prepare-at-open]

With ``--late`` the loader has late ranks (``late_pieces``): in a step the CPUs cannot keep up
with, the last rank waits inside ``next`` for pieces the other rank sends from its
``prepare_ahead``; the model's buffer makes DDP broadcast at the start of every forward, so that
call must come first (a forward pre-hook; from the post-hook the ranks deadlocked until the
collective watchdog aborted the job). The steps are reported as 2 ms of accelerator time, so
that every step is CPU-bound on any machine; checks that some step had a late rank. With
``--prepare-at-open`` the loader starts decoding as it is made and the loop begins after a 2 s
emulated model load: the first batch must come at once.

Checks on every rank: each frame tensor shares memory with the batch's numpy view (DLPack, no
copy); tensors kept past their step still hold the bytes delivered, also after the loader is
closed; the hooks reported every step. Writes ``OUTDIR/rank-R.json`` for check_runs.py (exactly
once, bytes equal ``datahelix decode``'s, DDP kept the replicas equal: the parameters' digests).
"""

import argparse
import hashlib
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist

import datahelix.torch as dht


def sha(t):
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()


class Net(torch.nn.Module):
    """Per clip: mean colour over frames and pixels -> a linear layer -> two classes."""

    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(3, 2)
        # A buffer: DDP broadcasts it from rank 0 at the start of each forward.
        self.register_buffer("seen", torch.zeros(1))

    def forward(self, frames):
        self.seen += len(frames)
        x = torch.stack([f.float().mean(dim=(0, 1, 2)) / 255.0 for f in frames])
        return self.head(x)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--late", action="store_true", help="late ranks (late_pieces)")
    ap.add_argument("--prepare-at-open", action="store_true",
                    help="prepare_at_open=True, then a 2 s emulated model load before the loop")
    args = ap.parse_args()

    rank, size = dht.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    data = dht.DataHelix(args.data, model=model, optimizer=opt, global_batch=4, workers=2,
                         steps=args.steps, seed=3, cpu_budget=False, late_pieces=args.late,
                         prepare_at_open=args.prepare_at_open)
    assert data.loader.rank == rank and data.loader.size == size
    if args.prepare_at_open:
        time.sleep(2.0)  # the model loads while the first steps decode
    if args.late:
        # An accelerator far faster than the decoders, whatever the machine's load: every step
        # is CPU-bound, and such steps get a late rank.
        report = data.loader.report_step
        data.loader.report_step = lambda seconds: report(0.002)
    kept, steps, losses, waits = [], [], [], []
    for batch in data:
        frames = batch["frames"]
        waits.append(batch["input_wait_s"])
        assert all(f.dtype == torch.uint8 and f.dim() == 4 and f.shape[3] == 3 for f in frames)
        if not frames:  # every rank must join DDP's all-reduce; a rank with no sample adds 0
            loss = sum(p.sum() * 0 for p in model.parameters())
        else:
            labels = torch.tensor([i % 2 for i in batch["ids"]])
            loss = torch.nn.functional.cross_entropy(model(frames), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        digests = [sha(f) for f in frames]
        kept += list(zip(frames, digests))
        steps.append({"step": batch["step"], "ids": batch["ids"],
                      "skipped": batch["skipped"], "sha256": digests})
    metrics = data.metrics()
    data.close()
    # The hooks reported each step: the optimizer's hook gave every step its accelerator seconds.
    assert metrics["steps"] == args.steps and metrics["accel_s"] > 0, metrics
    if args.late:
        assert metrics["late_steps"] > 0, f"no step had a late rank: the run shows nothing ({metrics})"
    else:
        assert metrics["late_steps"] == 0, metrics
    for t, digest in kept:
        assert sha(t) == digest, "a frame tensor kept past its step changed"
    assert all(isinstance(w, float) and 0.0 <= w < 60.0 for w in waits), waits
    if args.prepare_at_open:
        # Planned and decoded during the set-up: the first batch only had to be collected
        # (1.2-1.4 ms on the slower rank here, debug build; 75.7-88.9 ms without prepare_at_open).
        assert waits[0] < 0.05, f"the first batch waited {waits[0] * 1e3:.1f} ms after a 2 s set-up"
    # DLPack shares the batch's memory: a torch tensor and the numpy view are the same bytes.
    with dht.Loader(args.data, global_batch=4, workers=2, steps=1, seed=3, cpu_budget=False) as loader:
        b = loader.next()
        for i, a in enumerate(b.tensors):
            t = torch.from_dlpack(b.tensor(i))
            assert t.data_ptr() == a.ctypes.data and np.shares_memory(t.numpy(), a)
            a[0, 0, 0, 0] ^= 0xFF
            assert int(t[0, 0, 0, 0]) == int(a[0, 0, 0, 0]), "the tensor does not see the array's write"
    # DDP kept the replicas equal: check_runs.py compares the ranks' parameter digests. Not
    # with a gloo collective here: gloo's worker thread drops its last reference to a
    # collective's tensors a moment after the caller's wait returns; once Python's own
    # references are gone too (at the end of main) that drop needs the interpreter, and during
    # its shutdown the thread is ended inside gloo, which aborts the process ("terminate called
    # without an active exception", CI of 647931a; one run in three before DDP was dropped
    # ahead of the process group's destruction).
    params_sha256 = sha(torch.cat([p.detach().flatten() for p in model.parameters()]))
    # DDP's reducer holds the process group: drop it first, so that gloo's threads end while
    # Python still runs.
    del data, opt, model
    dist.destroy_process_group()
    with open(os.path.join(args.out, f"rank-{rank}.json"), "w") as f:
        json.dump({"rank": rank, "steps": steps, "metrics": metrics, "losses": losses,
                   "params_sha256": params_sha256}, f)
    print(f"ok {rank} first wait {waits[0] * 1e3:.1f} ms late steps {metrics['late_steps']} losses {' '.join(f'{x:.4f}' for x in losses)}", flush=True)


if __name__ == "__main__":
    main()
