"""What verifying an artifact's files costs: SHA-256 and BLAKE2b per GiB, in memory and from a file.

    python bench/bench_digest.py [--mib 512] [--repeat 3]

Hashes one buffer of `--mib` MiB of random bytes in memory with SHA-256 and BLAKE2b (hashlib,
the digests a manifest could record), and the same bytes written to a file and read back by
`replay.runtime.digests.digest_file` (page cache warm: the second of two reads; cold reads
add the disk's own throughput). Reports the best of `--repeat` runs as seconds per GiB, wall
and CPU time of the process.
Prints one Markdown section on stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time


def _best(run, repeat: int) -> tuple[float, float]:
    """The best wall time and the best CPU time of the process (the CPU time is what one
    quiet core would take: on a shared machine the wall time waits for the others)."""
    walls, cpus = [], []
    for _ in range(repeat):
        start, cpu = time.perf_counter(), time.process_time()
        run()
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return min(walls), min(cpus)


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
        wall, cpu = _best(lambda make=make: make(data).digest(), args.repeat)
        rows.append((f"{name}, in memory", wall / gib, cpu / gib))
    with tempfile.NamedTemporaryFile(delete=False) as f:
        f.write(data)
    try:
        digest_file(f.name)  # the page cache holds the file from here on
        wall, cpu = _best(lambda: digest_file(f.name), args.repeat)
        rows.append(("sha256, `digest_file` (page cache warm)", wall / gib, cpu / gib))
    finally:
        os.unlink(f.name)
    load = os.getloadavg()[0]  # at the end: the load the runs shared the machine with
    print(f"### Verifying files: hashing cost ({args.mib} MiB, best of {args.repeat})\n")
    print(f"Load average: {load:.2f}.\n")
    print("| hash | wall s per GiB | CPU s per GiB |")
    print("|---|---|---|")
    for what, wall, cpu in rows:
        print(f"| {what} | {wall:.2f} | {cpu:.2f} |")
    ratio = rows[0][2] / rows[1][2]
    print(f"\nsha256 / blake2b (CPU): {ratio:.2f}× (below 1: sha256 is the faster here).")


if __name__ == "__main__":
    main()
