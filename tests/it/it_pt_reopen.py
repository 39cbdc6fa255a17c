#!/usr/bin/env python3
"""it_pt_reopen.py - a file rewritten through passthrough, then opened
again at once: its size must be what was written. Run by mount_run.sh
(MNT, REMOTE set) with -o passthrough, registered with ctest.

Each round: open(O_WRONLY|O_CREAT|O_TRUNC), write 100 bytes, close (the
handle passes through: the kernel writes the staging file); open(O_WRONLY|
O_CREAT), close; read the file: 100 bytes, its own. 50 files in turn.

The bug it guards (fixed with it): the release of the second open marked
while the first one's was still marking, unpinned first, and a GETATTR
then gave the node's size from before the marks: 0. The kernel kept that
for attr_timeout, and the read returned 0 bytes: about 3 rounds in 20,000
before the fix. A race: at IT_PT_ROUNDS=40000 (the default, about 25 s
in a Release or Debug build) a build with the bug is expected to fail
nearly every run, not every one. IT_PT_SECONDS (60) bounds the time: under
ASan fewer rounds are done (40,000 took more than 270 s there).

Exit 0 if every read had its bytes and after the flush the share holds the
last content of each file (SHA-256), 1 otherwise.
"""
import hashlib
import os
import subprocess
import sys
import time

MNT = os.environ["MNT"]
REMOTE = os.environ["REMOTE"]
ROUNDS = int(os.environ.get("IT_PT_ROUNDS", "40000"))
SECS = float(os.environ.get("IT_PT_SECONDS", "60"))
NFILES = 50


def main():
    bad = []
    last = {}
    stop = time.monotonic() + SECS
    rounds = 0
    for i in range(ROUNDS):
        if time.monotonic() > stop:
            break
        rounds += 1
        k = i % NFILES
        p = f"{MNT}/f{k:02d}"
        data = (b"%08d" % i) * 12 + b"ABCD"  # 100 bytes of round i
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, data)
        os.close(fd)
        os.close(os.open(p, os.O_WRONLY | os.O_CREAT, 0o644))
        fd = os.open(p, os.O_RDONLY)
        got = os.read(fd, 200)
        os.close(fd)
        last[k] = data
        if got != data:
            bad.append(f"round {i}: f{k:02d} read {len(got)} bytes, "
                       f"want its 100")
    for b in bad[:10]:
        print(f"not ok - {b}")
    print(f"{'not ok' if bad else 'ok'} 1 - {rounds} rewrites read back "
          f"at once ({len(bad)} wrong)")
    subprocess.run(["sync"], check=True)
    sync = os.environ.get("IT_REMOTE_SYNC")
    if sync:
        subprocess.run(sync, shell=True, check=True)
    wrong = []
    for k, data in last.items():
        with open(f"{REMOTE}/f{k:02d}", "rb") as f:
            if hashlib.sha256(f.read()).digest() != \
                    hashlib.sha256(data).digest():
                wrong.append(f"f{k:02d}")
    print(f"{'not ok' if wrong else 'ok'} 2 - the share holds each file's "
          f"last content by SHA-256 {' '.join(wrong)}")
    return 1 if bad or wrong else 0


if __name__ == "__main__":
    sys.exit(main())
