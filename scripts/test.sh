#!/usr/bin/env bash
# All of DataHelix's tests: Rust unit and integration tests (multi-rank ones launch mpirun),
# formatting, the benches compiled and run once in test mode, and the Python package's tests
# (scripts/test_python.sh: wheel, fresh virtual environment, PyTorch DDP under mpirun).
#
#   scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh

export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
# Property tests draw their cases from a fixed seed here, so that a run is repeatable and a red
# run names cases anyone can replay. To explore other cases, set PROPTEST_RNG_SEED (and
# PROPTEST_CASES); commit what proptest then writes under proptest-regressions/, which every
# run replays first.
export PROPTEST_RNG_SEED=${PROPTEST_RNG_SEED:-20261130}
# tests/multi_host.rs makes hosts of network namespaces (root, iproute2); here a machine that
# cannot is a failure, not a skipped test.
export DATAHELIX_REQUIRE_NETNS=${DATAHELIX_REQUIRE_NETNS:-1}
echo "== cargo fmt --check" >&2
cargo fmt --all -- --check
echo "== the demo's decode-speed scaling (doctests)" >&2
python3 -m doctest scripts/decode_speed.py
echo "== cargo build" >&2
cargo build --workspace --all-targets
echo "== cargo test" >&2
cargo test --workspace --all-targets
cargo test --workspace --doc
echo "== rustdoc: every intra-doc link resolves" >&2
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps -p datahelix
echo "== HCCL backend against the host-memory emulator" >&2
cargo build --features hccl --lib --example dh-collective-check
cargo test --features hccl --test collective_hccl --test collective_hccl_errors --test train_backends
cargo test --features hccl --test watchdog_decoding --test own_comm over_hccl
echo "== Python package, PyTorch" >&2
scripts/test_python.sh
