#!/usr/bin/env python3
"""it_notify.py FERRYFS FERRY_AGENT - Type=notify readiness, as systemd
sees it (util/notify.c, fs/ready.c, agent/main.c).

Registered with ctest (labels "mount;pkg", ~12 s). Plays systemd's part: a
datagram socket with SO_PASSCRED (a file in a temp dir; an abstract
"@name" for the daemonized case), its address in NOTIFY_SOCKET, and the
daemon started under it. Checks:
  - ferryfs mount -f (as in a Type=notify unit), write-through with
    remote_latency=800ms, so the root's GETATTR answers 0.8 s after the
    kernel mount: no READY=1 while the mount point does not answer; the
    READY=1 comes with a STATUS= line, from the daemon's pid, at least
    0.5 s after the mount appeared in mountinfo, and at once a stat() of
    the mount point answers;
  - write-back, the flush paused, 1 MiB written and fsynced: a later
    STATUS= line says 1048576 bytes in 1 files pending (within 12 s);
    fusermount3 -u: STOPPING=1, the daemon exits 0 (-f too);
  - ferryfs mount without -f (daemonized): READY=1 carries MAINPID= of the
    daemon left running (the pid ctl reports), to an abstract socket;
  - ferry-agent: READY=1 once it listens: a connect() succeeds at once.
Prints "ok N - name" / "not ok N - name: detail", then "N passed, M
failed". Exit 1 on failure, 77 without root, /dev/fuse or fusermount3.
"""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

n = 0
nfail = 0


def ok(name):
    global n
    n += 1
    print(f"ok {n} - {name}", flush=True)


def notok(name, detail):
    global n, nfail
    n += 1
    nfail += 1
    print(f"not ok {n} - {name}: {detail}", flush=True)


def check(name, cond, detail=""):
    (ok if cond else lambda x: notok(x, detail))(name)
    return cond


def listener(addr):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    s.bind("\0" + addr[1:] if addr.startswith("@") else addr)
    return s


def recv(s, timeout):
    """One message and its sender's pid, or (None, None) after timeout."""
    s.settimeout(timeout)
    try:
        data, anc, _, _ = s.recvmsg(4096, socket.CMSG_SPACE(12))
    except socket.timeout:
        return None, None
    pid = None
    for level, typ, d in anc:
        if level == socket.SOL_SOCKET and typ == socket.SCM_CREDENTIALS:
            pid = int.from_bytes(d[0:4], "little")
    return data.decode(errors="replace"), pid


def fields(msg):
    return dict(l.split("=", 1) for l in msg.split("\n") if "=" in l)


def mounted(mnt):
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            p = line.split(b" ")
            if p[4] == os.fsencode(mnt) and b"fuse.ferryfs" in line:
                return True
    return False


def answers(mnt, timeout=2.0):
    """Does stat(mnt) return within timeout (in a thread: it may hang)?"""
    res = []
    t = threading.Thread(target=lambda: res.append(os.stat(mnt)), daemon=True)
    t.start()
    t.join(timeout)
    return bool(res)


def wait_until(pred, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def umount(mnt):
    subprocess.run(["fusermount3", "-u", mnt], stderr=subprocess.DEVNULL)


def main():
    if len(sys.argv) != 3:
        print("usage: it_notify.py FERRYFS FERRY_AGENT", file=sys.stderr)
        return 2
    ferryfs, agent = sys.argv[1], sys.argv[2]
    if os.geteuid() != 0:
        print("# skip: needs root")
        return 77
    if not os.path.exists("/dev/fuse") or not shutil.which("fusermount3"):
        print("# skip: no /dev/fuse or fusermount3")
        return 77
    T = tempfile.mkdtemp(prefix="ferryfs-notify.")
    R, M, J = (os.path.join(T, x) for x in ("share", "mnt", "journal"))
    os.makedirs(R)
    os.makedirs(M)
    procs = []
    try:
        run(ferryfs, agent, T, R, M, J, procs)
    finally:
        umount(M)
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(T, ignore_errors=True)
    print(f"{n - nfail} passed, {nfail} failed")
    return 1 if nfail else 0


def run(ferryfs, agent, T, R, M, J, procs):
    sock_path = os.path.join(T, "notify")
    s = listener(sock_path)
    env = dict(os.environ, NOTIFY_SOCKET=sock_path)

    # 1. -f, the root answering 0.8 s after the mount
    p = subprocess.Popen([ferryfs, "mount", R, M, "-f", "-o",
                          "writeback=off,remote_latency=800ms"], env=env,
                         stderr=subprocess.PIPE)
    procs.append(p)
    t_mount = None
    msg = pid = None
    early = None
    end = time.monotonic() + 20
    while time.monotonic() < end and p.poll() is None:
        m, sender = recv(s, 0.005)
        if m is not None:
            msg, pid = m, sender
            break
        if t_mount is None and mounted(M):
            t_mount = time.monotonic()
    t_ready = time.monotonic()
    if not check("-f: READY=1 arrives", msg is not None and
                 "READY=1" in msg.split("\n"),
                 f"got {msg!r}, daemon exit {p.poll()}"):
        return
    check("-f: READY=1 after the kernel mount", t_mount is not None,
          "READY=1 came before the mount was in mountinfo")
    if t_mount is not None:
        check(f"-f: READY=1 once the root answered ({t_ready - t_mount:.2f}"
              " s >= 0.5 s after the mount, remote_latency=800ms)",
              t_ready - t_mount >= 0.5,
              f"{t_ready - t_mount:.3f} s after the mount")
    check("-f: the mount point answers at READY=1", answers(M),
          "stat() hangs")
    check("-f: sent by the daemon's pid (NotifyAccess=main)", pid == p.pid,
          f"sender {pid}, daemon {p.pid}")
    f = fields(msg)
    check("-f: READY=1 with STATUS= and no MAINPID=",
          "STATUS" in f and "MAINPID" not in f, repr(msg))
    umount(M)
    try:
        rc = p.wait(10)
    except subprocess.TimeoutExpired:
        rc = None
    check("-f: the daemon exits 0 after fusermount3 -u", rc == 0, f"{rc}")
    msg, _ = recv(s, 5)
    check("-f: STOPPING=1 with a STATUS= line",
          msg and "STOPPING=1" in msg.split("\n") and "STATUS" in fields(msg),
          repr(msg))

    # 2. STATUS= with pending bytes, STOPPING=1
    p = subprocess.Popen([ferryfs, "mount", R, M, "-f", "-o",
                          f"journal={J}"], env=env, stderr=subprocess.PIPE)
    procs.append(p)
    msg, _ = recv(s, 20)
    if not check("write-back: READY=1", msg and "READY=1" in msg, repr(msg)):
        return
    check("write-back: STATUS= says nothing pending",
          "write-back: 0 bytes in 0 files pending" in msg, repr(msg))
    subprocess.run([ferryfs, "pause", M], stdout=subprocess.DEVNULL)
    with open(os.path.join(M, "f"), "wb") as fh:
        fh.write(os.urandom(1 << 20))
        fh.flush()
        os.fsync(fh.fileno())
    want = "1048576 bytes in 1 files pending"
    t0 = time.monotonic()
    got = []
    while time.monotonic() - t0 < 12:
        m, _ = recv(s, 12 - (time.monotonic() - t0))
        if m is None:
            break
        got.append(m)
        if want in m:
            break
    check(f"write-back: a STATUS= line says '{want}' (paused)",
          got and want in got[-1], repr(got))
    if got and want in got[-1]:
        check("write-back: ... and that the flush is paused",
              "flush paused" in got[-1], repr(got[-1]))
    subprocess.run([ferryfs, "resume", M], stdout=subprocess.DEVNULL)
    subprocess.run(["timeout", "30", ferryfs, "flush", M, "--wait"],
                   stdout=subprocess.DEVNULL)
    umount(M)
    got = []
    while True:
        m, _ = recv(s, 10)
        if m is None:
            break
        got.append(m)
        if "STOPPING=1" in m.split("\n"):
            break
    check("write-back: STOPPING=1 at fusermount3 -u",
          got and "STOPPING=1" in got[-1].split("\n"), repr(got))
    try:
        rc = p.wait(10)
    except subprocess.TimeoutExpired:
        rc = None
    check("write-back: the daemon exits 0", rc == 0, f"{rc}")

    # 3. daemonized: MAINPID=, an abstract socket
    abstract = f"@ferryfs-it-notify-{os.getpid()}"
    s2 = listener(abstract)
    r = subprocess.run([ferryfs, "mount", R, M, "-o", f"journal={J}"],
                       env=dict(os.environ, NOTIFY_SOCKET=abstract),
                       capture_output=True, text=True, timeout=30)
    check("daemonized: ferryfs mount exits 0", r.returncode == 0,
          f"exit {r.returncode}: {r.stderr.strip()}")
    msg, pid = recv(s2, 20)
    f = fields(msg or "")
    check("daemonized: READY=1 with MAINPID= of the sender (the daemon)",
          f.get("READY") == "1" and f.get("MAINPID") == str(pid),
          f"{msg!r} from {pid}")
    alive = pid is not None and os.path.exists(f"/proc/{pid}")
    check("daemonized: that pid runs and the mount answers",
          alive and mounted(M) and answers(M), f"pid {pid}")
    umount(M)
    if pid:
        wait_until(lambda: not os.path.exists(f"/proc/{pid}"), 10)
    s2.close()

    # 4. ferry-agent
    key = os.path.join(T, "agent.key")
    with open(key, "w") as fh:
        fh.write("bm90IGEgc2VjcmV0IGtleSBqdXN0IGEgdGVzdCBrZXkh\n")
    os.chmod(key, 0o600)
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    port = ls.getsockname()[1]
    ls.close()
    p = subprocess.Popen([agent, "--root", R, "--listen",
                          f"127.0.0.1:{port}", "--key-file", key], env=env,
                         stderr=subprocess.PIPE)
    procs.append(p)
    msg, pid = recv(s, 10)
    check("ferry-agent: READY=1 from its pid",
          msg is not None and "READY=1" in msg.split("\n") and pid == p.pid,
          f"{msg!r} from {pid}, agent {p.pid}, exit {p.poll()}")
    c = socket.socket()
    try:
        c.connect(("127.0.0.1", port))
        connected = True
    except OSError as e:
        connected = e
    c.close()
    check("ferry-agent: at READY=1 a connect() succeeds", connected is True,
          f"{connected}")
    p.terminate()
    p.wait(10)


if __name__ == "__main__":
    sys.exit(main())
