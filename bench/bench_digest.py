"""What verifying an artifact's files costs: hashing per GiB, and ``verify_weights`` on a load.

    python bench/bench_digest.py [--mib 512] [--repeat 3]

Hashes one buffer of `--mib` MiB of random bytes in memory with SHA-256 and BLAKE2b (hashlib,
the digests a manifest could record), and the same bytes written to a file and read back by
`replay.runtime.digests.digest_file` (page cache warm: the second of two reads; cold reads
add the disk's own throughput). Reports the best of `--repeat` runs as seconds per GiB.
Prints one Markdown section on stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time


def _best(run, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from replay.runtime.digests import digest_file

    data = os.urandom(args.mib * 2**20)
    gib = len(data) / 2**30
    rows = []
    for name, make in (("sha256", hashlib.sha256), ("blake2b", hashlib.blake2b)):
        print(f"hashing {args.mib} MiB with {name}", file=sys.stderr)
        seconds = _best(lambda make=make: make(data).digest(), args.repeat)
        rows.append((f"{name}, in memory", seconds / gib))
    with tempfile.NamedTemporaryFile(delete=False) as f:
        f.write(data)
    try:
        digest_file(f.name)  # the page cache holds the file from here on
        seconds = _best(lambda: digest_file(f.name), args.repeat)
        rows.append(("sha256, `digest_file` (page cache warm)", seconds / gib))
    finally:
        os.unlink(f.name)
    load = os.getloadavg()[0]
    print(f"### Verifying files: hashing cost ({args.mib} MiB, best of {args.repeat})\n")
    print(f"Load average at the start: {load:.2f}.\n")
    print("| hash | s per GiB |")
    print("|---|---|")
    for what, per_gib in rows:
        print(f"| {what} | {per_gib:.2f} |")
    print(
        f"\nsha256 / blake2b: {rows[0][1] / rows[1][1]:.2f}× (below 1: sha256 is the faster here)."
    )


if __name__ == "__main__":
    main()
