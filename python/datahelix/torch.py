"""DataHelix for PyTorch: batches as dicts of torch tensors, the step driven from hooks.

    import torch
    import datahelix.torch as dht

    dht.init_process_group("gloo")                    # rank and size from the MPI launch
    model = torch.nn.parallel.DistributedDataParallel(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = dht.DataHelix(data="data/tiny", global_batch=8, steps=100, model=model, optimizer=opt)
    for batch in data:                                # this rank's part of each global batch
        loss = model(batch["frames"]).mean()          # frames: uint8 tensors [F, H, W, 3]
        opt.zero_grad(); loss.backward(); opt.step()
    data.close()

Launch with ``mpirun -np R python train.py``. ``batch`` is a dict: ``"step"`` (int),
``"ids"`` (a list of the delivered samples' ids: 64-bit unsigned, beyond int64 tensors),
``"tokens"`` (an int64 tensor, one entry per delivered sample), ``"skipped"`` (a list of the
ids of this rank's samples that could not be decoded), ``"input_wait_s"`` (the seconds the
loader kept this step waiting for its batch) and ``"frames"`` (a list of
``uint8`` tensors ``[F, H, W, 3]``, shared with the batch's memory through DLPack: no copy;
kept tensors stay valid after the step, the loop and ``close``).

The step driver runs on the training thread, from hooks around the user's step:

- the model's forward hook (``model=``) calls ``prepare_ahead`` once per step, once the step's
  forward is issued: on an accelerator that runs asynchronously, the loader plans the coming
  steps while the step computes. With ``late_pieces=True`` it runs before the forward instead
  (a forward pre-hook): a late rank then waits inside ``next`` for pieces the other ranks send
  from their ``prepare_ahead``, which must come before any collective of the step's forward —
  DDP broadcasts its module's buffers there (``broadcast_buffers``). Pass the module you call,
  the DDP wrapper, not the module inside it, and run no collective of your own between the
  batch and the forward;
- the optimizer's step hook (``optimizer=``) reports the step's seconds, from the batch's
  delivery to the optimizer's step, as the step's accelerator time (on CUDA, pass
  ``synchronize=torch.cuda.synchronize`` to measure the device's work, not its launch);
- without hooks, a step is reported when the next batch is asked for.

A loader decodes nothing before it is asked: to have the first batch decoded while the job still
loads its checkpoint or compiles its model, pass ``prepare_at_open=True``; the first steps are then
planned and start decoding as ``data`` is made, and again as ``data.load_state_dict`` reopens it,
so make ``data`` right after building the model (its hooks need the module) and before loading
its checkpoint or compiling it. To resume, pass the saved state as the ``resume=`` setting (the
state, or its JSON text; ``resume_file=`` takes a path): the loader opens once, where
``load_state_dict`` stops the decoding begun at open and starts over.

Every rank runs the same hooks in the same order: they are collective, like the loader. Use it
directly (``for batch in data``) or in ``torch.utils.data.DataLoader(data, batch_size=None)``
with ``num_workers=0``: the loader already decodes on its own threads, and it cannot run in a
worker process (it is one rank of an MPI job).
"""

import os
import time

import torch
import torch.utils.data

from . import Loader

__all__ = ["DataHelix", "Loader", "as_torch", "init_process_group", "launch_rank"]


def launch_rank():
    """``(rank, size)`` of this process as its launcher set them (Open MPI, MPICH/PMI or
    Slurm); ``(0, 1)`` without a launcher."""
    for rank, size in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"),
                       ("SLURM_PROCID", "SLURM_NTASKS")):
        if rank in os.environ and size in os.environ:
            return int(os.environ[rank]), int(os.environ[size])
    return 0, 1


def init_process_group(backend="gloo", **kwargs):
    """``torch.distributed.init_process_group`` with the rank and size of the MPI launch
    (:func:`launch_rank`), rendezvous at ``MASTER_ADDR``:``MASTER_PORT`` (default
    127.0.0.1:29500; on a cluster, set ``MASTER_ADDR`` to the first host)."""
    rank, size = launch_rank()
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = os.environ.get("MASTER_PORT", "29500")
    kwargs.setdefault("init_method", f"tcp://{addr}:{port}")
    torch.distributed.init_process_group(backend, rank=rank, world_size=size, **kwargs)
    return rank, size


def _on(value):
    """Whether a boolean setting is on, read as the library reads it (``dh_config_set``)."""
    if isinstance(value, bool):
        return value
    return str(value).strip() in ("true", "1", "yes", "on")


class DataHelix(torch.utils.data.IterableDataset):
    """This rank's loader as an iterable of dicts of torch tensors (see the module's docs).
    Takes :class:`datahelix.Loader`'s settings; ``model`` and ``optimizer`` install the step
    hooks; ``prepare_at_open`` starts decoding the first steps at once (and again after
    :meth:`load_state_dict`). Opening is collective."""

    def __init__(self, data, *, model=None, optimizer=None, synchronize=None, prepare_at_open=False,
                 **settings):
        super().__init__()
        self.loader = Loader(data, **settings)
        self._prepare_at_open = _on(prepare_at_open)
        self._prepare_first_steps()  # before the hooks: a failure here leaves none on the model
        self._synchronize = synchronize
        self._delivered_at = None   # when the unreported step's batch was handed over
        self._prepared = True       # whether that step's prepare_ahead ran
        self._hooks = []
        if model is not None:
            if _on(settings.get("late_pieces", False)):
                self._hooks.append(model.register_forward_pre_hook(self._prepare))
            else:
                self._hooks.append(model.register_forward_hook(self._prepare))
        if optimizer is not None:
            self._hooks.append(optimizer.register_step_post_hook(self._after_optimizer_step))

    def _prepare_first_steps(self):
        """With ``prepare_at_open``: plan the first steps and start decoding them now, before
        the first batch is asked for (collective, as every rank makes ``data`` alike)."""
        if self._prepare_at_open:
            self.loader.prepare_ahead()

    # -- hooks -------------------------------------------------------------------------------
    def _prepare(self, *_):
        if not self._prepared:
            self._prepared = True
            self.loader.prepare_ahead()

    def _after_optimizer_step(self, *_):
        self._report()

    def _report(self):
        if self._delivered_at is None:
            return
        if self._synchronize is not None:
            self._synchronize()
        seconds = time.perf_counter() - self._delivered_at
        self._delivered_at = None
        self.loader.report_step(seconds)

    # -- iteration ---------------------------------------------------------------------------
    def __iter__(self):
        if torch.utils.data.get_worker_info() is not None:
            raise RuntimeError(
                "datahelix.torch.DataHelix cannot run in a DataLoader worker process: it is one rank "
                "of the MPI job and decodes on its own threads; use num_workers=0")
        while True:
            self._report()
            batch = self.loader.next()
            if batch is None:
                return
            self._delivered_at = time.perf_counter()
            self._prepared = False
            yield as_torch(batch)

    # -- the loader's own --------------------------------------------------------------------
    def state_dict(self):
        return self.loader.state_dict()

    def load_state_dict(self, state):
        """Resumes from :meth:`state_dict` (it reopens the loader: with ``prepare_at_open`` the
        resumed run's first steps start decoding here). **Collective.**"""
        self.loader.load_state_dict(state)
        self._prepare_first_steps()

    def metrics(self):
        return self.loader.metrics()

    def close(self):
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self.loader.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def as_torch(batch):
    """A :class:`datahelix.Batch` as the dict :class:`DataHelix` yields (no copy of frames)."""
    return {
        "step": batch.step,
        "ids": batch.ids,
        "tokens": torch.tensor(batch.tokens, dtype=torch.int64),
        "skipped": batch.skipped,
        "input_wait_s": batch.input_wait_s,
        "frames": [torch.from_dlpack(batch.tensor(i)) for i in range(len(batch))],
    }
