#!/usr/bin/env python3
"""it_shrink_grow.py FERRYFS [ROUNDS] - random truncates (shrink and grow),
writes and rewrites of three files the share has, through a write-back
mount, then `ferryfs flush --wait`: the share must hold, by SHA-256, what
the mount shows (journal.c invariant 19).

Each round: a fresh share holding f0, f1, f2 (0-12 MiB of random bytes),
a mount with chunk_size=1Mi, the flusher paused for the ops (so a shrink
and the grow after it are both pending when the flush replays them), or
paused for half of them and flushing during the rest (odd rounds). On
e53f7f4 (a shrink replayed with the size the file has by then) 2 of the
first 3 rounds left a file whose share copy kept old bytes inside the
grown size. A round costs about 2 s.

Exit 0 if every round matched, 1 if not, 77 without root or /dev/fuse.
"""
import hashlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

FERRYFS = os.path.abspath(sys.argv[1])
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 8
MAX = 12 << 20
NAMES = ("f0", "f1", "f2")
if os.geteuid() != 0 or not os.path.exists("/dev/fuse") or \
        not shutil.which("fusermount3"):
    print("it_shrink_grow: skip: needs root, /dev/fuse and fusermount3")
    sys.exit(77)


def mounted(m):
    want = os.fsencode(m)
    with open("/proc/self/mountinfo", "rb") as f:
        return any(line.split()[4] == want for line in f)


def ctl(*args):
    return subprocess.run([FERRYFS, *args], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, errors="replace")


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def one(rnd, t):
    rng = random.Random(36 * 1000 + rnd)
    r, m = os.path.join(t, "r"), os.path.join(t, "m")
    os.mkdir(r)
    os.mkdir(m)
    for nm in NAMES:
        with open(os.path.join(r, nm), "wb") as f:
            f.write(rng.randbytes(rng.randint(0, MAX)))
    log = open(os.path.join(t, "log"), "w")
    p = subprocess.Popen([FERRYFS, "mount", r, m, "-f", "-o",
                          "journal=%s/j,cache=%s/c,cache_local,"
                          "chunk_size=1Mi" % (t, t)],
                         stdout=log, stderr=log)
    try:
        for _ in range(250):
            if mounted(m) or p.poll() is not None:
                break
            time.sleep(0.02)
        if not mounted(m):
            return "the mount did not come up"
        ctl("pause", m)
        n = 30 if rnd % 2 == 0 else 120
        for i in range(n):
            if rnd % 2 and i == n // 2:
                ctl("resume", m)
            path = os.path.join(m, rng.choice(NAMES))
            x = rng.random()
            if x < (0.1 if rnd % 2 == 0 else 0.5):
                off, ln = rng.randint(0, MAX), rng.randint(1, 1 << 20)
                with open(path, "r+b") as f:
                    f.seek(off)
                    f.write(rng.randbytes(ln))
            elif x < 0.9:
                os.truncate(path, rng.randint(0, MAX))
            else:
                with open(path, "wb") as f:
                    f.write(rng.randbytes(rng.randint(0, 1 << 20)))
        ctl("resume", m)
        fl = ctl("flush", m, "--wait")
        if fl.returncode:
            return "flush --wait exit %d: %s" % (fl.returncode,
                                                 fl.stderr.strip())
        bad = ["%s (%d bytes)" % (nm, os.path.getsize(os.path.join(m, nm)))
               for nm in NAMES
               if sha(os.path.join(m, nm)) != sha(os.path.join(r, nm))]
        if bad:
            return "the share differs from the mount: " + ", ".join(bad)
        return None
    finally:
        subprocess.run(["fusermount3", "-u", m], stderr=subprocess.DEVNULL)
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        log.close()


def main():
    fail = 0
    for rnd in range(ROUNDS):
        t = tempfile.mkdtemp(prefix="ferryfs-shrink.")
        try:
            err = one(rnd, t)
        except Exception as e:  # the harness failed: a failure
            err = "%s: %s" % (type(e).__name__, e)
        if err:
            fail += 1
            print("not ok %d - round %d: %s (kept %s)" % (rnd + 1, rnd,
                                                         err, t))
        else:
            print("ok %d - round %d: the share matches the mount" %
                  (rnd + 1, rnd))
            shutil.rmtree(t)
    print("%d passed, %d failed" % (ROUNDS - fail, fail))
    return 1 if fail else 0


sys.exit(main())
