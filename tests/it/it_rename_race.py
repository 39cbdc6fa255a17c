#!/usr/bin/env python3
"""it_rename_race.py - names looked up and files created inside a directory
while another thread renames that directory back and forth (the LOOKUP and
CREATE of a child racing a RENAME of its parent). Run by mount_run.sh (MNT,
REMOTE set; IT_REMOTE_SYNC in write-back mode), registered with ctest.

  1. readers open a/sub/fN and b/sub/fN while a <-> b is renamed: every open
     that succeeds reads fN's own bytes, every failure is ENOENT (the name
     is under the other one just then); the tree is whole afterwards;
  2. writers create, write and fsync new files in whichever of a/sub, b/sub
     exists while the renames go on; after the flush the share holds
     exactly those files, in a/sub, each with its SHA-256.

Exit 0 if all holds, 1 otherwise. IT_RACE_SECONDS (5) is each phase's length.

In write-back mode the renamer pauses 20 ms after each rename: the renames
of one directory are a chain of ops that wait for each other, and such a
chain drains at about 60 ops/s (each op waits for the commit of the one
before: 4,000 renames took 66 s), which unbounded renames would turn into
minutes of flushing. Write-through has no op log: no pause there.
"""
import errno
import hashlib
import os
import subprocess
import sys
import threading
import time

MNT = os.environ["MNT"]
REMOTE = os.environ["REMOTE"]
SECS = float(os.environ.get("IT_RACE_SECONDS", "5"))
PAUSE = 0.02 if os.environ.get("IT_REMOTE_SYNC") else 0.0
failures = []
lock = threading.Lock()


def fail(what):
    with lock:
        failures.append(what)


def renamer(stop, counts):
    while time.time() < stop:
        os.rename(f"{MNT}/a", f"{MNT}/b")
        time.sleep(PAUSE)
        os.rename(f"{MNT}/b", f"{MNT}/a")
        time.sleep(PAUSE)
        counts["renames"] += 2


def reader(stop, counts):
    n = 0
    while time.time() < stop and not failures:
        for d in ("a", "b"):
            i = n % 20
            try:
                with open(f"{MNT}/{d}/sub/f{i}") as f:
                    got = f.read()
                if got != f"file {i}":
                    fail(f"{d}/sub/f{i} read {got!r}")
                with lock:
                    counts["opened"] += 1
            except OSError as e:
                if e.errno != errno.ENOENT:
                    fail(f"open {d}/sub/f{i}: {e}")
            n += 1


def writer(k, stop, made):
    n = 0
    while time.time() < stop and not failures:
        name = f"w{k}_{n}"
        data = os.urandom(65536 + 4096 * (n % 16) + n)
        for d in ("a", "b"):
            try:
                fd = os.open(f"{MNT}/{d}/sub/{name}",
                             os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except OSError as e:
                if e.errno == errno.ENOENT:
                    continue
                fail(f"create {d}/sub/{name}: {e}")
                return
            try:
                os.write(fd, data)
                os.fsync(fd)
            except OSError as e:
                fail(f"write {name}: {e}")
            finally:
                os.close(fd)
            with lock:
                made[name] = hashlib.sha256(data).hexdigest()
            break
        n += 1


def run(threads):
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def main():
    os.makedirs(f"{MNT}/a/sub")
    for i in range(20):
        with open(f"{MNT}/a/sub/f{i}", "w") as f:
            f.write(f"file {i}")
    ok = 0

    counts = {"renames": 0, "opened": 0}
    stop = time.time() + SECS
    run([threading.Thread(target=renamer, args=(stop, counts))] +
        [threading.Thread(target=reader, args=(stop, counts))
         for _ in range(3)])
    names = sorted(os.listdir(f"{MNT}/a/sub"))
    if names != sorted(f"f{i}" for i in range(20)):
        fail(f"a/sub after the renames: {names}")
    if counts["renames"] < 100 or counts["opened"] < 100:
        fail(f"too little happened: {counts}")
    if not failures:
        ok += 1
        print(f"ok {ok} - lookups racing {counts['renames']} renames of "
              f"the parent: {counts['opened']} opens read the right bytes, "
              f"the others ENOENT")

    made = {}
    counts["renames"] = 0
    stop = time.time() + SECS
    run([threading.Thread(target=renamer, args=(stop, counts))] +
        [threading.Thread(target=writer, args=(k, stop, made))
         for k in range(2)])
    sync = os.environ.get("IT_REMOTE_SYNC")
    if sync and subprocess.call(sync, shell=True) != 0:
        fail(f"'{sync}' failed")
    on_share = {}
    for name in os.listdir(f"{REMOTE}/a/sub"):
        if name.startswith("w"):
            with open(f"{REMOTE}/a/sub/{name}", "rb") as f:
                on_share[name] = hashlib.sha256(f.read()).hexdigest()
    if os.path.exists(f"{REMOTE}/b"):
        fail("the share still has b after the last rename back to a")
    missing = [n for n in made if on_share.get(n) != made[n]]
    extra = [n for n in on_share if n not in made]
    if missing or extra or len(made) < 20:
        fail(f"{len(made)} files made: {len(missing)} missing or different "
             f"on the share ({missing[:5]}), {len(extra)} extra "
             f"({extra[:5]})")
    else:
        ok += 1
        print(f"ok {ok} - {len(made)} files created and fsynced racing "
              f"{counts['renames']} renames of the parent: all on the "
              f"share, SHA-256 equal")

    for f in failures:
        print(f"not ok - {f}")
    print(f"{ok} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
