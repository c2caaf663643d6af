# A complete PyTorch training loop on DataHelix: DDP over gloo, launched by MPI.
#
#   mpirun -np 2 .venv/bin/python python/examples/train_torch.py DATASET [STEPS] [CHECKPOINTS]
#
# Saves a checkpoint per rank after the last step; run again with more STEPS and the same
# CHECKPOINTS folder and it continues where it stopped (model, optimizer and loader).
import os
import sys

import torch
import datahelix.torch as dht


class Net(torch.nn.Module):
    """Mean colour of each clip -> two classes (a stand-in for a video model)."""

    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(3, 2)

    def forward(self, clips):  # clips: list of uint8 [F, H, W, 3]
        x = torch.stack([c.float().mean(dim=(0, 1, 2)) / 255 for c in clips])
        return self.head(x)


def main(data, steps, checkpoints):
    rank, size = dht.init_process_group("gloo")  # rank and size from mpirun
    model = torch.nn.parallel.DistributedDataParallel(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ckpt = os.path.join(checkpoints, f"ckpt-{rank}.pt")
    state = torch.load(ckpt) if os.path.exists(ckpt) else None  # resume: every rank has its own
    loader = dht.DataHelix(data, model=model, optimizer=opt,  # the hooks drive the loader
                           policy="helix", global_batch=8, workers=2, steps=steps, seed=1,
                           resume=state["loader"] if state else None,  # where it stopped
                           prepare_at_open=True)  # decode the first steps while the model loads
    if state:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
    for batch in loader:  # this rank's part of each global batch
        clips = batch["frames"]
        if clips:
            labels = torch.tensor([i % 2 for i in batch["ids"]])
            loss = torch.nn.functional.cross_entropy(model(clips), labels)
        else:  # every rank joins DDP's all-reduce, even without samples this step
            loss = sum(p.sum() * 0 for p in model.parameters())
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"rank {rank} step {batch['step']} samples {len(clips)} loss {loss.item():.4f}", flush=True)
    m = loader.metrics()
    print(f"rank {rank}: {m['samples']} samples in {m['steps']} steps, "
          f"p95 input wait {m['p95_wait_s'] * 1e3:.1f} ms", flush=True)
    os.makedirs(checkpoints, exist_ok=True)
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "loader": loader.state_dict()}, ckpt)
    loader.close()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 10, sys.argv[3] if len(sys.argv) > 3 else ".")
