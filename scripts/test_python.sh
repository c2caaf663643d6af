#!/usr/bin/env bash
# The Python package's tests (scripts/test.sh runs them after the Rust ones):
#   1. `pip install ./python` into a fresh virtual environment (the wheel is built by maturin, in
#      the dev profile to reuse the workspace's build: MATURIN_PEP517_ARGS);
#   2. there, under `mpirun -np 2`: every array of every batch kept past the run and the loader's
#      close (also under PYTHONMALLOC=debug), bytes equal to `datahelix decode`'s, exactly once
#      per epoch, and resume from `state_dict()` in a new process (its first steps prepared at
#      open; also from two ranks' states that disagree on the learned models: a version-1 state,
#      python/tests/state_v1.py, beside a version-3 one); a weighted mix of the dataset's folders
#      (`mix`); replica groups (`replica_ranks`), also
#      over HCCL from a second package built with the hccl feature (on the project's emulator);
#   3. in the project's environment (.venv, with torch): DDP over gloo through datahelix.torch
#      (also with late ranks, and with the first steps decoded during an emulated model load:
#      prepare_at_open), the README's training loop (with its resume), the PyTorch C++ extension of
#      csrc/examples/pytorch built by torch.utils.cpp_extension, and MindSpore (CPU): the AOT op
#      of csrc/examples/mindspore and Tensor.from_numpy on the package's arrays.
#
#   scripts/test_python.sh            # after `cargo build` (target/debug/datahelix, libdatahelix.so)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
repo=$(pwd)
bin=$repo/target/debug/datahelix
lib=$repo/target/debug
[ -x "$bin" ] && [ -f "$lib/libdatahelix.so" ] || { echo "test_python: run cargo build first" >&2; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
step() { echo "== python: $*" >&2; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
checks() { python3 python/tests/check_runs.py --data "$work/tiny" --bin "$bin" "$@"; }

"$bin" gen --spec scripts/specs/tiny.json --out "$work/tiny" >/dev/null
# Captions and labels in the manifest: batches deliver them (Batch.meta, checked by check_runs.py).
python3 - "$work/tiny/manifest.jsonl" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
with open(sys.argv[1], "w") as f:
    for r in rows:
        f.write(json.dumps({**r, "caption": f"clip {r['id']}, \"quoted\"", "label": r["id"] % 7}) + "\n")
PYEOF
"$bin" index "$work/tiny" >/dev/null

step "pip install ./python into a fresh virtual environment"
python3 -m venv "$work/venv"
MATURIN_PEP517_ARGS="--profile dev" "$work/venv/bin/pip" install -q ./python
py=$work/venv/bin/python
(cd "$work" && "$py" -c 'import datahelix, sys; assert datahelix.__file__.startswith(sys.prefix), datahelix.__file__; print("import datahelix:", datahelix.__file__, datahelix.version())')

step "arrays kept past the run and the close, exactly once, resume (mpirun -np 2)"
mkdir -p "$work/full" "$work/resumed" "$work/debug"
mpirun -np 2 "$py" python/tests/keep_arrays.py --data "$work/tiny" --out "$work/full" --save-state-at 2
mpirun -np 2 "$py" python/tests/keep_arrays.py --data "$work/tiny" --out "$work/resumed" \
  --resume "$work/full/state-{rank}.json" --prepare-at-open
checks --run "$work/full" --resumed "$work/resumed"

step "resume from states that disagree on what was learned and counted: priors and a new count on every rank, the same batches"
mkdir -p "$work/mixed" "$work/resumed-mixed"
cp "$work/full/state-0.json" "$work/mixed/state-0.json"
"$py" python/tests/state_v1.py "$work/full/state-1.json" "$work/mixed/state-1.json"
mpirun -np 2 "$py" python/tests/keep_arrays.py --data "$work/tiny" --out "$work/resumed-mixed" \
  --resume "$work/mixed/state-{rank}.json" 2> "$work/mixed/stderr" || { cat "$work/mixed/stderr" >&2; exit 1; }
grep -q "every rank starts its cost models from the priors" "$work/mixed/stderr" ||
  { echo "test_python: no word of the states' disagreement:" >&2; cat "$work/mixed/stderr" >&2; exit 1; }
grep -q "the skip budget counts from zero" "$work/mixed/stderr" ||
  { echo "test_python: no word of the states' different skip counts:" >&2; cat "$work/mixed/stderr" >&2; exit 1; }
checks --run "$work/full" --resumed "$work/resumed-mixed"

step "the same under PYTHONMALLOC=debug, policy rank-local"
PYTHONMALLOC=debug mpirun -np 2 "$py" python/tests/keep_arrays.py --data "$work/tiny" --out "$work/debug" \
  --policy rank-local
checks --run "$work/debug"

step "a weighted mix of the dataset's folders: mix=\"videos=1,images=1\" (mpirun -np 2)"
mkdir -p "$work/mix"
mpirun -np 2 "$py" python/tests/mix.py --data "$work/tiny" --out "$work/mix"
"$py" python/tests/mix.py --data "$work/tiny" --out "$work/mix" --check

step "replica groups: replica_ranks=2, byte-identical batches and states (mpirun -np 2)"
mkdir -p "$work/replicas"
mpirun -np 2 "$py" python/tests/replicas.py --data "$work/tiny" --out "$work/replicas"
"$py" python/tests/replicas.py --data "$work/tiny" --out "$work/replicas" --check

step "backend=\"hccl\": refused by this package (built without it), saying how to build it"
(cd "$work" && "$py" - "$work/tiny" <<'PYEOF'
import sys, datahelix
try:
    datahelix.Loader(data=sys.argv[1], backend="hccl")
except datahelix.Error as e:
    assert "no hccl backend" in str(e) and "--features hccl" in str(e), e
else:
    raise AssertionError("backend='hccl' was accepted by a package built without it")
PYEOF
)

step "replica groups over HCCL: a package built with the hccl feature, on the project's emulator (mpirun -np 2)"
python3 -m venv "$work/venv-hccl"
MATURIN_PEP517_ARGS="--profile dev --features hccl" "$work/venv-hccl/bin/pip" install -q ./python
mkdir -p "$work/replicas-hccl"
mpirun -np 2 "$work/venv-hccl/bin/python" python/tests/replicas.py --data "$work/tiny" --out "$work/replicas-hccl" \
  --backend hccl
"$py" python/tests/replicas.py --data "$work/tiny" --out "$work/replicas-hccl" --check

step "PyTorch: DDP (gloo) through datahelix.torch (mpirun -np 2)"
MATURIN_PEP517_ARGS="--profile dev" "$DH_VENV/bin/pip" install -q --no-deps --force-reinstall ./python
tpy=$DH_VENV/bin/python
mkdir -p "$work/ddp"
MASTER_PORT=$(free_port) mpirun -np 2 "$tpy" python/tests/torch_ddp.py --data "$work/tiny" --out "$work/ddp"
checks --run "$work/ddp"

step "PyTorch: the same with late ranks, prepared before DDP's buffer broadcast (mpirun -np 2)"
mkdir -p "$work/ddp-late"
MASTER_PORT=$(free_port) mpirun -np 2 "$tpy" python/tests/torch_ddp.py --data "$work/tiny" --out "$work/ddp-late" \
  --late --steps 12
checks --run "$work/ddp-late"

step "PyTorch: prepare_at_open, the first steps decoded during a 2 s model load (mpirun -np 2)"
mkdir -p "$work/ddp-early"
MASTER_PORT=$(free_port) mpirun -np 2 "$tpy" python/tests/torch_ddp.py --data "$work/tiny" --out "$work/ddp-early" \
  --prepare-at-open
checks --run "$work/ddp-early"

step "the README's PyTorch loop, and its resume from the checkpoints it saved"
python3 - README.md python/examples/train_torch.py <<'PYEOF'
import sys
readme, example = (open(p).read() for p in sys.argv[1:])
assert "```python\n" + example + "```" in readme, "README.md must show python/examples/train_torch.py verbatim"
PYEOF
first=$(MASTER_PORT=$(free_port) mpirun -np 2 "$tpy" python/examples/train_torch.py "$work/tiny" 4 "$work/ckpt")
echo "$first" | grep -q "rank 0 step 3 " || { echo "$first"; echo "the loop did not reach step 3" >&2; exit 1; }
again=$(MASTER_PORT=$(free_port) mpirun -np 2 "$tpy" python/examples/train_torch.py "$work/tiny" 6 "$work/ckpt")
echo "$again" | grep -q "rank 0 step 4 " && ! echo "$again" | grep -q " step [0-3] " \
  || { echo "$again"; echo "the loop did not resume at step 4" >&2; exit 1; }

step "the PyTorch C++ extension (torch.utils.cpp_extension) on the C library's batches"
mkdir -p "$work/cpp"
PATH=$DH_VENV/bin:$PATH "$tpy" python/tests/torch_cpp_extension.py --build-only --repo "$repo" --lib "$lib" \
  --data - --out - --build "$work/ext"
mpirun -np 2 "$tpy" python/tests/torch_cpp_extension.py --repo "$repo" --lib "$lib" --data "$work/tiny" \
  --out "$work/cpp" --build "$work/ext"
checks --run "$work/cpp"

step "MindSpore: the AOT custom op of csrc/examples/mindspore, and Tensor.from_numpy on the package's arrays"
mkdir -p "$work/ms-aot" "$work/ms-numpy"
mpirun -np 2 "$tpy" python/tests/mindspore_aot.py --aot --repo "$repo" --lib "$lib" --data "$work/tiny" \
  --out "$work/ms-aot" --build "$work/ms-build"
checks --run "$work/ms-aot"
mpirun -np 2 "$tpy" python/tests/mindspore_aot.py --repo "$repo" --lib - --data "$work/tiny" \
  --out "$work/ms-numpy" --build -
checks --run "$work/ms-numpy"
echo "== python: ok" >&2
