#!/usr/bin/env python3
"""How fast this machine decodes the demo's data, against the machine its profile was chosen on.

    python3 scripts/decode_speed.py scale BIN DATA REFERENCE.json  # prints 1, or the time ratio
    python3 scripts/decode_speed.py measure BIN DATA SAMPLES        # prints median CPU-seconds
    python3 scripts/decode_speed.py profile c0,a,b,sigma SCALE      # prints the scaled profile

The demo's profile (the emulated accelerator's step times) was chosen so that decoding and
accelerator steps balance as they do in the pain regimes, on a machine whose decodes of the
dataset's first samples took REFERENCE's `cpu_seconds`. On a machine much faster or slower the
balance shifts — faster: every policy keeps up and misses nothing; slower: every policy is
decode-bound — and the comparison is no longer the one the README reports. `scale` decodes the
same samples here (`datahelix decode --json`, median of three) and prints their time ratio when
it is outside REFERENCE's tolerance, else 1; `profile` multiplies the profile's times (c0, a, b;
sigma is relative) by it, so that every time of the run stretches alike.

>>> decide(10.0, 10.0, 0.25)
1.0
>>> decide(12.4, 10.0, 0.25)
1.0
>>> decide(30.0, 10.0, 0.25)
3.0
>>> decide(5.0, 10.0, 0.25)
0.5
>>> scaled_profile("0.1,1e-4,1.7e-6,0.05", 2.0)
'0.2,0.0002,3.4e-06,0.05'
>>> scaled_profile("0.1,1e-4,1.7e-6,0.05", 1.0)
'0.1,1e-4,1.7e-6,0.05'
"""
import json
import statistics
import subprocess
import sys
from pathlib import Path

RUNS = 3


def first_ids(data, samples):
    """The ids of the manifest's first `samples` lines (the generator writes them in a fixed order)."""
    ids = []
    with open(Path(data) / "manifest.jsonl") as f:
        for line in f:
            if line.strip():
                ids.append(json.loads(line)["id"])
            if len(ids) == samples:
                break
    return ids


def measure(binary, data, samples):
    """Median over RUNS of the CPU-seconds `datahelix decode` spends on the first samples."""
    ids = ",".join(str(i) for i in first_ids(data, samples))
    totals = []
    for _ in range(RUNS):
        out = subprocess.run(
            [binary, "decode", str(data), "--ids", ids, "--json"], check=True, capture_output=True, text=True
        ).stdout
        doc = json.loads(out)
        decoded = [s for s in doc["samples"] if s.get("shape")]
        if len(decoded) != samples:
            raise SystemExit(f"decode_speed: {samples - len(decoded)} of the {samples} samples did not decode")
        totals.append(sum(s["cpu_seconds"] for s in decoded))
    return statistics.median(totals)


def decide(measured, reference, tolerance):
    """1 when `measured` is within `tolerance` of `reference` either way, else their ratio."""
    ratio = measured / reference
    if 1 / (1 + tolerance) <= ratio <= 1 + tolerance:
        return 1.0
    return round(ratio, 2)


def scaled_profile(profile, scale):
    """The profile `c0,a,b,sigma` with its three times multiplied by `scale`."""
    if scale == 1.0:
        return profile
    c0, a, b, sigma = profile.split(",")
    return ",".join([f"{float(c0) * scale:.4g}", f"{float(a) * scale:.4g}", f"{float(b) * scale:.4g}", sigma])


def main(argv):
    if len(argv) == 5 and argv[1] == "scale":
        ref = json.loads(Path(argv[4]).read_text())
        measured = measure(argv[2], argv[3], ref["samples"])
        scale = decide(measured, ref["cpu_seconds"], ref["tolerance"])
        print(
            f"decode speed: the first {ref['samples']} samples took {measured:.2f} CPU-seconds here, "
            f"{ref['cpu_seconds']:.2f} where the profile was chosen"
            + ("" if scale == 1.0 else f": the profile's times are scaled by {scale}"),
            file=sys.stderr,
        )
        print(scale)
    elif len(argv) == 5 and argv[1] == "measure":
        print(f"{measure(argv[2], argv[3], int(argv[4])):.3f}")
    elif len(argv) == 4 and argv[1] == "profile":
        print(scaled_profile(argv[2], float(argv[3])))
    else:
        raise SystemExit(__doc__.split("\n\n")[1])


if __name__ == "__main__":
    main(sys.argv)
