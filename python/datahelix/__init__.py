"""DataHelix from Python: one rank's loader of a synchronous data-parallel job.

    import datahelix

    with datahelix.Loader(data="data/tiny", global_batch=8, steps=100, seed=1) as loader:
        for batch in loader:                     # this rank's batch of each step (collective)
            for sid, frames in zip(batch.ids, batch.tensors):
                ...                              # frames: uint8 numpy array [F, H, W, 3], no copy
            loader.report_step(seconds)          # the step's accelerator seconds (optional)
        checkpoint = {"loader": loader.state_dict()}

Launch with ``mpirun -np R python script.py`` (one process per rank; without a launcher the
loader is a one-rank job). Every rank makes the same calls in the same order: opening, each
step, ``prepare_ahead``/``ship_ahead`` when used, ``load_state_dict`` and closing are collective.

Arrays own their memory: each holds a reference to its batch, so arrays kept after the loop or
after the loader is closed stay valid, and a batch's memory is freed when its last array (or
memoryview, or DLPack tensor such as ``torch.from_dlpack(batch.tensor(i))``) goes. A delivered
batch no longer counts in the loader's byte budget, so keeping batches never stalls decoding.
The arrays are writable (the batch is the caller's once delivered).

Settings are the keys of the C ABI's ``dh_config_set`` (docs/c-abi.md): ``data``, ``policy``,
``global_batch``, ``workers``, ``steps``, ``seed``, ``lookahead``, ``budget_mib``,
``cpu_budget``, ``cores``, ``max_frames``, ``max_pixels``, ``collective_timeout_s``,
``mix`` (``mix="video=3,image=1"``: the global batches drawn from the dataset's first folders at
those weights) and the rest
(``backend="hccl"``: the loader's collectives on Ascend devices, in a package built with
``MATURIN_PEP517_ARGS="--features hccl" pip install ./python``).
Every failure raises :class:`datahelix.Error` with the library's code and message.
"""

import json

import numpy as np

from . import _native
from ._errors import Error

__all__ = ["Loader", "Batch", "Error", "version"]


def version():
    """The library's version, ``(major, minor, patch)``."""
    return tuple(_native.version())


def _setting(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return json.dumps(value)
    if isinstance(value, (str, int, float)):
        return str(value)
    if hasattr(value, "__fspath__"):
        return value.__fspath__()
    raise TypeError(f"a setting must be a str, number, bool, path or dict, not {type(value).__name__}")


class Batch:
    """One step's batch on this rank.

    ``step``: the step (0, 1, ...); ``ids``: delivered sample ids, in batch order; ``skipped``:
    ids of this rank's samples that could not be decoded this step (``tensors`` has none for
    them); ``tokens``: each sample's tokens; ``meta``: each sample's metadata, a dict with its
    ``path`` and its manifest row's other fields (caption, label, ...); ``timestamps``: each
    sample's frame times in seconds (one per frame of its tensor); ``input_wait_s``: seconds
    the loader waited for it;
    ``tensors``: one ``uint8`` numpy array ``[F, H, W, 3]`` per delivered sample, views of the
    batch's memory. ``tensor(i)`` is the ``i``-th sample as a DLPack/buffer-protocol exporter
    (``torch.from_dlpack(batch.tensor(i))``, ``memoryview(batch.tensor(i))``).
    """

    __slots__ = ("_native", "_tensors", "_meta")

    def __init__(self, native):
        self._native = native
        self._tensors = None
        self._meta = None

    @property
    def step(self):
        return self._native.step

    @property
    def ids(self):
        return self._native.ids

    @property
    def skipped(self):
        return self._native.skipped

    @property
    def tokens(self):
        return self._native.tokens

    @property
    def meta(self):
        if self._meta is None:
            self._meta = [json.loads(m) for m in self._native.meta_json]
        return self._meta

    @property
    def timestamps(self):
        return self._native.timestamps

    @property
    def input_wait_s(self):
        return self._native.input_wait_s

    def tensor(self, index):
        return self._native.tensor(index)

    @property
    def tensors(self):
        if self._tensors is None:
            self._tensors = [np.asarray(self._native.tensor(i)) for i in range(len(self._native))]
        return self._tensors

    def __len__(self):
        return len(self._native)

    def __repr__(self):
        return f"Batch(step={self.step}, ids={self.ids}, skipped={self.skipped})"


class Loader:
    """This rank's loader; see the module's documentation. Opening is **collective**."""

    def __init__(self, data, policy="helix", global_batch=16, workers=4, steps=None, seed=0, **settings):
        settings = dict(settings, data=data, policy=policy, global_batch=global_batch, workers=workers, seed=seed)
        if steps is not None:
            settings["steps"] = steps
        self._settings = [(k, _setting(v)) for k, v in settings.items() if v is not None]
        self._native = _native.Loader(self._settings)

    # -- the step ---------------------------------------------------------------------------
    def __iter__(self):
        return self

    def __next__(self):
        native = self._native.next()
        if native is None:
            raise StopIteration
        return Batch(native)

    def next(self):
        """The next step's batch, or None after the configured ``steps``. **Collective.**"""
        native = self._native.next()
        return None if native is None else Batch(native)

    def prepare_ahead(self):
        """Plans the coming steps and sends what other ranks still need of this one: call it
        right after launching the step on the accelerator (without it, the next ``next`` does
        this work on the input-wait path). With ``replica_ranks``, a group's first rank then
        sends the rest of its group what it holds of the next batch, off their next ``next``.
        Called before the first batch, it starts decoding the first steps: call it right after
        making the loader, then load the model. **Collective**: on every rank at every step, or
        never."""
        self._native.prepare_ahead()

    def ship_ahead(self, seconds_to_step_end):
        """Near the step's end, sends the next step's tensors and waits (at most until shortly
        before the slowest rank's predicted end) for those still decoding. Call it after
        ``prepare_ahead``, only where the accelerator runs asynchronously (it blocks).
        **Collective**: on every rank at every step, or never."""
        self._native.ship_ahead(float(seconds_to_step_end))

    def report_step(self, seconds):
        """Reports the measured accelerator seconds of the step delivered last (once per step,
        before the next one; without it the step ends when the next batch is asked for)."""
        self._native.report_step(float(seconds))

    def all_reduce_sum(self, values):
        """Sums float64 values over all ranks (an emulated gradient all-reduce). **Collective.**"""
        return np.asarray(self._native.all_reduce_sum([float(v) for v in np.ravel(values)]), dtype=np.float64)

    # -- where the run stands ----------------------------------------------------------------
    def state_dict(self):
        """Where the run stands, with the cost models the loader learned and the skip budget's
        count (a dict of a few KiB, JSON-serialisable): save it with the model's checkpoint after
        a step's update."""
        return json.loads(self._native.state())

    def load_state_dict(self, state):
        """Continues from ``state`` (``state_dict()`` of an earlier run, at any world size): the
        next batch is the step after the one delivered last there, and every global batch is the
        one an uninterrupted run delivers, planned with the cost models learned there. Closes and
        reopens this loader: **collective**."""
        text = state if isinstance(state, str) else json.dumps(state)
        settings = [(k, v) for k, v in self._settings if k not in ("resume", "resume_file")]
        self._native.close()
        self._native = _native.Loader(settings + [("resume", text)])

    def metrics(self):
        """What the loader measured on this rank (the fields of ``dh_metrics``)."""
        return self._native.metrics()

    @property
    def rank(self):
        return self._native.rank

    @property
    def size(self):
        return self._native.size

    # -- lifetime ----------------------------------------------------------------------------
    def close(self):
        """Stops the loader (joins its decode workers). **Collective.** Batches stay valid."""
        self._native.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
