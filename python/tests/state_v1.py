"""Writes a loader state as the version-1 document of the same state — no learned models, no
skip count — re-signed with the loader's checksum (``words_hash`` of the compact JSON without
it): what a build before learned models wrote. For the tests of mixed and old states.

    python state_v1.py IN.json OUT.json
"""
import json
import sys

M = (1 << 64) - 1


def splitmix64(x):
    z = (x + 0x9E3779B97F4A7C15) & M
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
    return z ^ (z >> 31)


def words_hash(b):
    """src/sampler.rs's words_hash."""
    h = splitmix64(len(b))
    n = len(b) // 8
    for i in range(n):
        h = splitmix64(h ^ int.from_bytes(b[8 * i:8 * i + 8], "little"))
    tail = b[8 * n:]
    return splitmix64(h ^ int.from_bytes(tail + bytes(8 - len(tail)), "little"))


def checksum(doc):
    unsigned = dict(doc, checksum="")
    return "%016x" % words_hash(json.dumps(unsigned, separators=(",", ":"), ensure_ascii=False).encode())


def main(src, dst):
    doc = json.load(open(src))
    doc.pop("learned", None)
    doc.pop("skips", None)
    doc["version"] = 1
    doc["checksum"] = checksum(doc)
    with open(dst, "w") as f:
        json.dump(doc, f, indent=2)


if __name__ == "__main__":
    main(*sys.argv[1:3])
