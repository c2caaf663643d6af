"""DataHelix from Python through the C ABI: ctypes + numpy, no build step.

The Python package (``pip install ./python``, ``import datahelix``) is what Python users want;
this module shows the C ABI from Python and feeds the PyTorch C++ extension of
``csrc/examples/pytorch`` (which takes a ``dh_batch*``).

    from datahelix import Loader
    with Loader(data="data/tiny", global_batch=16, steps=100) as loader:
        for batch in loader:                 # blocks for each step's batch (collective)
            for sid, frames in zip(batch.ids, batch.tensors):
                ...                          # frames: uint8 numpy array [F, H, W, 3], zero-copy
            # the time spent here is reported as the step's accelerator seconds, unless the
            # loop calls batch.report(seconds) with a measured value

Launch with ``mpirun -np R python3 script.py``. The library is found through ``DATAHELIX_LIB``
(the path of libdatahelix.so) or in ``target/debug``/``target/release`` of this repository.
Arrays view memory owned by the batch and keep it alive: the batch is released when the
:class:`Batch` and every array of it are gone (or at :meth:`Batch.release`, after which its arrays
must not be used).
"""

import ctypes
import os
import sys
import time

import numpy as np

DH_OK, DH_END = 0, 12
DH_DTYPE_U8, DH_DEVICE_HOST = 0, 0


class Tensor(ctypes.Structure):
    """``dh_tensor``."""

    _fields_ = [
        ("data", ctypes.POINTER(ctypes.c_uint8)),
        ("shape", ctypes.c_uint64 * 4),
        ("ndim", ctypes.c_uint32),
        ("dtype", ctypes.c_uint8),
        ("device", ctypes.c_uint8),
        ("reserved", ctypes.c_uint16),
        ("nbytes", ctypes.c_uint64),
    ]


class Metrics(ctypes.Structure):
    """``dh_metrics``."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("steps", ctypes.c_uint64),
        ("samples", ctypes.c_uint64),
        ("skipped", ctypes.c_uint64),
        ("throughput", ctypes.c_double),
        ("miss_rate", ctypes.c_double),
        ("miss_rate_10ms", ctypes.c_double),
        ("p50_wait_s", ctypes.c_double),
        ("p95_wait_s", ctypes.c_double),
        ("max_wait_s", ctypes.c_double),
        ("total_wait_s", ctypes.c_double),
        ("accel_s", ctypes.c_double),
        ("wall_s", ctypes.c_double),
        ("bytes_in", ctypes.c_uint64),
        ("rebalances_run", ctypes.c_uint64),
        ("rebalances_skipped", ctypes.c_uint64),
        ("late_steps", ctypes.c_uint64),
    ]

    def as_dict(self):
        return {name: getattr(self, name) for name, _ in self._fields_}


LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
SECONDS = ctypes.CFUNCTYPE(ctypes.c_double, ctypes.c_void_p)


class Accelerator(ctypes.Structure):
    """``dh_accelerator``: the callbacks of ``dh_loader_step``."""

    _fields_ = [("launch", LAUNCH), ("seconds_left", SECONDS), ("wait", SECONDS), ("user", ctypes.c_void_p)]


class DataHelixError(RuntimeError):
    """A failed ``dh_*`` call: ``code`` is its ``dh_result``."""

    def __init__(self, lib, call, code):
        buf = ctypes.create_string_buffer(1024)
        lib.dh_error_message(buf, len(buf))
        name = lib.dh_result_name(code).decode()
        super().__init__(f"{call}: {name}: {buf.value.decode(errors='replace')}")
        self.code = code


def _find_library():
    path = os.environ.get("DATAHELIX_LIB")
    if path:
        return path
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
    for profile in ("debug", "release"):
        candidate = os.path.join(root, "target", profile, "libdatahelix.so")
        if os.path.exists(candidate):
            return candidate
    return "libdatahelix.so"


def load_library(path=None):
    """Loads libdatahelix and declares the signatures of datahelix.h."""
    lib = ctypes.CDLL(path or _find_library())
    P, u64, sz, res = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_uint32
    pp = ctypes.POINTER(ctypes.c_void_p)
    sigs = {
        "dh_version": ([], ctypes.c_char_p),
        "dh_result_name": ([ctypes.c_uint32], ctypes.c_char_p),
        "dh_error_message": ([ctypes.c_char_p, sz], sz),
        "dh_config_new": ([pp], res),
        "dh_config_from_file": ([ctypes.c_char_p, pp], res),
        "dh_config_set": ([P, ctypes.c_char_p, ctypes.c_char_p], res),
        "dh_config_free": ([P], None),
        "dh_loader_new": ([P, pp], res),
        "dh_loader_world": ([P, ctypes.POINTER(sz), ctypes.POINTER(sz)], res),
        "dh_loader_next": ([P, ctypes.c_uint32, pp], res),
        "dh_loader_report_step": ([P, ctypes.c_double], res),
        "dh_loader_prepare_ahead": ([P], res),
        "dh_loader_ship_ahead": ([P, ctypes.c_double], res),
        "dh_loader_step": ([P, ctypes.POINTER(Accelerator), pp], res),
        "dh_loader_all_reduce_sum": ([P, ctypes.POINTER(ctypes.c_double), sz], res),
        "dh_loader_metrics": ([P, ctypes.POINTER(Metrics)], res),
        "dh_loader_state": ([P, ctypes.c_char_p, sz, ctypes.POINTER(sz)], res),
        "dh_loader_close": ([P], res),
        "dh_loader_free": ([P], None),
        "dh_batch_step": ([P, ctypes.POINTER(u64)], res),
        "dh_batch_len": ([P, ctypes.POINTER(sz)], res),
        "dh_batch_ids": ([P, ctypes.POINTER(ctypes.POINTER(u64)), ctypes.POINTER(sz)], res),
        "dh_batch_skipped": ([P, ctypes.POINTER(ctypes.POINTER(u64)), ctypes.POINTER(sz)], res),
        "dh_batch_tensor": ([P, sz, ctypes.POINTER(Tensor)], res),
        "dh_batch_tokens": ([P, sz, ctypes.POINTER(u64)], res),
        "dh_batch_input_wait": ([P, ctypes.POINTER(ctypes.c_double)], res),
        "dh_batch_release": ([pp], None),
    }
    for name, (args, ret) in sigs.items():
        f = getattr(lib, name)
        f.argtypes, f.restype = args, ret
    return lib


def _check(lib, call, code):
    if code != DH_OK:
        raise DataHelixError(lib, call, code)


def _ids(lib, fn, handle):
    ptr, n = ctypes.POINTER(ctypes.c_uint64)(), ctypes.c_size_t()
    _check(lib, fn.__name__, fn(handle, ctypes.byref(ptr), ctypes.byref(n)))
    return [ptr[i] for i in range(n.value)]


class _Owner:
    """Owns one ``dh_batch*``: released when the last reference (the batch, or an array
    viewing it) goes."""

    def __init__(self, lib, handle):
        self.lib, self.handle = lib, ctypes.c_void_p(handle)

    def release(self):
        if self.handle.value:
            self.lib.dh_batch_release(ctypes.byref(self.handle))
            self.handle = ctypes.c_void_p()

    def __del__(self):
        self.release()


class Batch:
    """One step's samples on this rank: ``ids``, ``tensors`` (zero-copy numpy views),
    ``tokens``, ``skipped``, ``input_wait_s``. Every array keeps the batch's memory alive."""

    def __init__(self, loader, handle):
        lib = loader._lib
        self._loader, self._lib, self._handle = loader, lib, ctypes.c_void_p(handle)
        self._owner = _Owner(lib, handle)
        step, wait = ctypes.c_uint64(), ctypes.c_double()
        _check(lib, "dh_batch_step", lib.dh_batch_step(self._handle, ctypes.byref(step)))
        _check(lib, "dh_batch_input_wait", lib.dh_batch_input_wait(self._handle, ctypes.byref(wait)))
        self.step, self.input_wait_s = step.value, wait.value
        self.ids = _ids(lib, lib.dh_batch_ids, self._handle)
        self.skipped = _ids(lib, lib.dh_batch_skipped, self._handle)
        self.tensors, self.tokens = [], []
        for i in range(len(self.ids)):
            t, tok = Tensor(), ctypes.c_uint64()
            _check(lib, "dh_batch_tensor", lib.dh_batch_tensor(self._handle, i, ctypes.byref(t)))
            _check(lib, "dh_batch_tokens", lib.dh_batch_tokens(self._handle, i, ctypes.byref(tok)))
            assert t.dtype == DH_DTYPE_U8 and t.device == DH_DEVICE_HOST
            shape = tuple(int(d) for d in t.shape[: t.ndim])
            # A view of the batch's memory, no copy, that keeps the batch alive.
            buf = (ctypes.c_uint8 * int(t.nbytes)).from_address(ctypes.addressof(t.data.contents)) \
                if t.nbytes else (ctypes.c_uint8 * 0)()
            buf._owner = self._owner
            self.tensors.append(np.frombuffer(buf, dtype=np.uint8).reshape(shape))
            self.tokens.append(tok.value)
        self.reported = False

    def report(self, accel_seconds):
        """Reports the step's measured accelerator seconds (once per step)."""
        self._loader.report_step(accel_seconds)
        self.reported = True

    def detach(self):
        """Hands the batch's ``dh_batch*`` (an int) to the caller, e.g. the PyTorch extension of
        ``csrc/examples/pytorch``, which then releases it; this object forgets it. Refused while
        an array of the batch is alive elsewhere (it would outlive the memory)."""
        self.tensors = []
        if sys.getrefcount(self._owner) > 2:  # self._owner and getrefcount's argument
            raise RuntimeError("detach: arrays of this batch are still alive; drop them first")
        handle, self._handle = self._handle.value, ctypes.c_void_p()
        self._owner.handle = ctypes.c_void_p()
        return handle

    def release(self):
        """Gives the tensors' memory back now (the arrays must not be used afterwards)."""
        self.tensors = []
        self._owner.release()


class Loader:
    """This rank's DataHelix loader. Settings are the keys of ``dh_config_set``
    (``data``, ``global_batch``, ``workers``, ``steps``, ``policy``...). Collective: create,
    iterate and close it on every rank."""

    def __init__(self, lib=None, **settings):
        self._lib = lib or load_library()
        cfg = ctypes.c_void_p()
        _check(self._lib, "dh_config_new", self._lib.dh_config_new(ctypes.byref(cfg)))
        try:
            for key, value in settings.items():
                text = ("true" if value else "false") if isinstance(value, bool) else str(value)
                _check(self._lib, f"dh_config_set({key})", self._lib.dh_config_set(cfg, key.encode(), text.encode()))
            self._handle = ctypes.c_void_p()
            _check(self._lib, "dh_loader_new", self._lib.dh_loader_new(cfg, ctypes.byref(self._handle)))
        finally:
            self._lib.dh_config_free(cfg)
        rank, size = ctypes.c_size_t(), ctypes.c_size_t()
        _check(self._lib, "dh_loader_world", self._lib.dh_loader_world(self._handle, ctypes.byref(rank), ctypes.byref(size)))
        self.rank, self.size = rank.value, size.value

    def next_batch(self):
        """The next step's :class:`Batch`, or None after the configured steps."""
        out = ctypes.c_void_p()
        code = self._lib.dh_loader_next(self._handle, 0, ctypes.byref(out))
        if code == DH_END:
            return None
        _check(self._lib, "dh_loader_next", code)
        return Batch(self, out.value)

    def __iter__(self):
        """Yields batches and reports each step's time (the time the loop body took, unless it
        called ``batch.report``) when the next one is asked for. A batch is freed with its last
        reference (its arrays included)."""
        while True:
            batch = self.next_batch()
            if batch is None:
                return
            started = time.perf_counter()
            try:
                yield batch
            finally:
                if not batch.reported:
                    batch.report(time.perf_counter() - started)
                del batch

    def train_step(self, launch, wait, seconds_left=None):
        """One training step, driven by the library (``dh_loader_step``): the next batch,
        ``launch(batch)`` to start the accelerator's step on it, the coming steps planned and the
        next step's tensors shipped while it runs (timed by ``seconds_left()``, if given: seconds
        until the step ends), ``wait()`` for its end (returning its accelerator seconds), which
        the library then reports. Returns the :class:`Batch` (release it when done), or None after
        the configured steps. Collective: every rank, every step."""
        state = {"batch": None, "error": None}

        def on_launch(_user, handle):
            try:
                state["batch"] = Batch(self, handle)
                launch(state["batch"])
                return 0
            except BaseException as e:  # noqa: BLE001 - re-raised after the C call returns
                state["error"] = e
                return 1

        def on_seconds(_user):
            try:
                return float(seconds_left()) if seconds_left else -1.0
            except BaseException as e:  # noqa: BLE001
                state["error"] = e
                return -1.0

        def on_wait(_user):
            try:
                return float(wait())
            except BaseException as e:  # noqa: BLE001
                state["error"] = e
                return -1.0

        accel = Accelerator(LAUNCH(on_launch), SECONDS(on_seconds), SECONDS(on_wait), None)
        out = ctypes.c_void_p()
        code = self._lib.dh_loader_step(self._handle, ctypes.byref(accel), ctypes.byref(out))
        if state["error"] is not None:
            raise state["error"]
        if code == DH_END:
            return None
        _check(self._lib, "dh_loader_step", code)
        batch = state["batch"]
        batch.reported = True
        return batch

    def prepare_ahead(self):
        """Plans ahead and sends what other ranks still need, while the accelerator runs: call it
        right after ``next_batch`` once the step is launched (collective: every rank, every step,
        or never)."""
        _check(self._lib, "dh_loader_prepare_ahead", self._lib.dh_loader_prepare_ahead(self._handle))

    def ship_ahead(self, seconds_to_step_end):
        """About 0.1 s before the accelerator step ends: exchanges the next step's tensors
        decoded for other ranks (collective: every rank, every step, or never)."""
        _check(
            self._lib,
            "dh_loader_ship_ahead",
            self._lib.dh_loader_ship_ahead(self._handle, float(seconds_to_step_end)),
        )

    def report_step(self, accel_seconds):
        _check(self._lib, "dh_loader_report_step", self._lib.dh_loader_report_step(self._handle, float(accel_seconds)))

    def all_reduce_sum(self, values):
        """Sums a float64 numpy array over the ranks, in place (collective)."""
        assert values.dtype == np.float64 and values.flags.c_contiguous
        ptr = values.ctypes.data_as(ctypes.POINTER(ctypes.c_double))
        _check(self._lib, "dh_loader_all_reduce_sum", self._lib.dh_loader_all_reduce_sum(self._handle, ptr, values.size))
        return values

    def state(self):
        """Where the run stands (a JSON text): save it with the model's checkpoint; a new
        ``Loader(resume=text, ...)`` continues with the next step's global batch."""
        needed = ctypes.c_size_t()
        _check(self._lib, "dh_loader_state", self._lib.dh_loader_state(self._handle, None, 0, ctypes.byref(needed)))
        buf = ctypes.create_string_buffer(needed.value)
        _check(self._lib, "dh_loader_state", self._lib.dh_loader_state(self._handle, buf, needed.value, ctypes.byref(needed)))
        return buf.value.decode()

    def metrics(self):
        m = Metrics(struct_size=ctypes.sizeof(Metrics))
        _check(self._lib, "dh_loader_metrics", self._lib.dh_loader_metrics(self._handle, ctypes.byref(m)))
        return m.as_dict()

    def close(self):
        """Closes and frees the loader (collective)."""
        if self._handle:
            self._lib.dh_loader_free(self._handle)
            self._handle = ctypes.c_void_p()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
