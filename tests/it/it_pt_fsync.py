#!/usr/bin/env python3
"""it_pt_fsync.py - an fsync or close of a file passed through sends only
the chunks the kernel changed. Run by mount_run.sh (MNT, REMOTE, FERRYFS
set) with -o passthrough,chunk_size=1Mi, registered with ctest.

The kernel writes such a file's staging file itself, so the journal does
not know which chunks changed; at an fsync or close it compares each chunk
already on the share with its SHA-256 and marks only the others (and the
last chunk, which carries the size and mtime). Before, each fsync marked
the whole file again and sent it all.

One file of 16 MiB written through one descriptor: write, fsync, flush;
rewrite 1 MiB at 4 MiB, fsync, flush; fsync again with nothing changed,
flush; close, flush (and the journal lets the file go: state clean).
After each step the bytes sent to the share
(remote_bytes_written of `ferryfs status --json`) may grow by at most
the chunks changed plus the last one; then the share holds the file
(SHA-256).

Exit 0 if every check passed, 1 otherwise.
"""
import hashlib
import json
import os
import subprocess
import sys
import time

MNT = os.environ["MNT"]
REMOTE = os.environ["REMOTE"]
FERRYFS = os.environ["FERRYFS"]
MIB = 1 << 20
fails = 0
n = 0


def check(ok, what):
    global fails, n
    n += 1
    fails += not ok
    print(f"{'ok' if ok else 'not ok'} {n} - {what}")


def status():
    out = subprocess.run([FERRYFS, "status", MNT, "--json"], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def sent():
    subprocess.run([FERRYFS, "flush", MNT, "--wait"], check=True,
                   stdout=subprocess.DEVNULL)
    st = status()
    return st["remote_bytes_written"], st.get("passthrough_opens", 0)


def requests():
    return status()["passthrough_requests"]


def main():
    data = bytearray(os.urandom(16 * MIB))
    p = f"{MNT}/big"
    w0, _ = sent()
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, data)
    os.fsync(fd)
    w1, opens = sent()
    check(opens >= 1, f"the file passed through ({opens} open(s))")
    check(w1 - w0 >= 16 * MIB,
          f"write + fsync: {w1 - w0} bytes sent, the 16 MiB at least")

    # the kernel writes it alone: without FUSE_HANDLE_KILLPRIV_V2 each
    # write asked the daemon for security.capability (a GETXATTR round
    # trip per write: most of a cp's time)
    r0 = requests()
    for i in range(1024):
        os.pwrite(fd, data[i * 4096:(i + 1) * 4096], i * 4096)
    r1 = requests()
    check(r1 - r0 <= 16, f"1024 writes of 4 KiB (the same bytes): "
          f"{r1 - r0} FUSE requests <= 16")

    new = os.urandom(MIB)
    data[4 * MIB:5 * MIB] = new
    os.pwrite(fd, new, 4 * MIB)
    os.fsync(fd)
    w2, _ = sent()
    check(w2 - w1 <= 2 * MIB,
          f"1 MiB rewritten + fsync: {w2 - w1} bytes sent <= 2 MiB "
          f"(the chunk and the last one; 16 MiB before)")

    os.fsync(fd)
    w3, _ = sent()
    check(w3 - w2 <= MIB,
          f"fsync of nothing new: {w3 - w2} bytes sent <= 1 MiB")

    os.close(fd)
    w4, _ = sent()
    check(w4 - w3 <= MIB, f"close: {w4 - w3} bytes sent <= 1 MiB")

    # all on the share, the pin gone: the journal lets go of the file
    # (jnl_node_clean(), put off while the kernel wrote it)
    state = ""
    for _ in range(100):
        state = os.getxattr(p, "user.ferryfs.state").decode()
        if state == "clean":
            break
        time.sleep(0.05)
    check(state == "clean", f"after the close: user.ferryfs.state {state}")

    with open(f"{REMOTE}/big", "rb") as f:
        got = hashlib.sha256(f.read()).hexdigest()
    check(got == hashlib.sha256(data).hexdigest(),
          "the share holds the file, by SHA-256")
    with open(p, "rb") as f:
        check(f.read() == data, "and the mount reads it back")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
