#!/usr/bin/env python3
"""it_replay_order.py FERRYFS [RUNS] - kill -9 right after a rename and a
create of the old name (issue 36, bug 1), then a remount on the same
journal and `ferryfs flush --wait`.

The share holds a = "precious". Through a write-back mount: rename a -> b
(plain, as os.rename does, and RENAME_NOREPLACE, as coreutils mv does),
then create a again, empty (the logrotate pattern); kill -9 of the daemon
0-400 ms later. After the remount and flush --wait, the share must hold
what some prefix of the two steps gives -- (a=precious), (b=precious) or
(a="", b=precious) -- and flush --wait must exit 0. On 57bd6a8 the create
was handed out on an ack a crash took back: in 2 of 30 runs both a and b
were empty (the precious bytes gone), and with NOREPLACE flush --wait gave
the rename up ("File exists").

Exit 0 if every run passed, 1 if not, 77 without root or /dev/fuse.
"""
import ctypes
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

FERRYFS = os.path.abspath(sys.argv[1])
RUNS = int(sys.argv[2]) if len(sys.argv) > 2 else 30
if os.geteuid() != 0 or not os.path.exists('/dev/fuse') or \
        not shutil.which('fusermount3'):
    print('it_replay_order: skip: needs root, /dev/fuse and fusermount3')
    sys.exit(77)

libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD = -100
RENAME_NOREPLACE = 1


def rename(a, b, flags):
    if libc.renameat2(AT_FDCWD, a.encode(), AT_FDCWD, b.encode(), flags):
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), a)


def mounted(m):
    # bytes: another test's mount point may be no UTF-8 (it_ctl_json's is)
    want = os.fsencode(m)
    with open('/proc/self/mountinfo', 'rb') as f:
        return any(line.split()[4] == want for line in f)


def mount(r, m, j, c, log):
    p = subprocess.Popen([FERRYFS, 'mount', r, m, '-f', '-o',
                          f'journal={j},cache={c}'], stdout=log, stderr=log)
    try:
        for _ in range(250):
            if mounted(m):
                return p
            if p.poll() is not None:
                break
            time.sleep(0.02)
        raise RuntimeError('the mount did not come up')
    except BaseException:
        p.kill()
        p.wait()
        subprocess.run(['fusermount3', '-u', m], stderr=subprocess.DEVNULL)
        raise


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return None


def one(flags, t):
    r, m, j, c = (os.path.join(t, x) for x in ('r', 'm', 'j', 'c'))
    os.mkdir(r)
    os.mkdir(m)
    with open(os.path.join(r, 'a'), 'w') as f:
        f.write('precious')
    with open(os.path.join(t, 'log'), 'a') as log:
        p = mount(r, m, j, c, log)
        try:
            rename(os.path.join(m, 'a'), os.path.join(m, 'b'), flags)
            open(os.path.join(m, 'a'), 'w').close()
            time.sleep(random.uniform(0, 0.4))
        finally:
            p.send_signal(signal.SIGKILL)
            p.wait()
            subprocess.run(['fusermount3', '-u', m],
                           stderr=subprocess.DEVNULL)
        p = mount(r, m, j, c, log)
        fl = subprocess.run([FERRYFS, 'flush', m, '--wait'],
                            capture_output=True, text=True,
                            errors='replace')
        subprocess.run(['fusermount3', '-u', m])
        p.wait()
    got = (read(os.path.join(r, 'a')), read(os.path.join(r, 'b')))
    prefixes = [('precious', None), (None, 'precious'), ('', 'precious')]
    if fl.returncode != 0 or got not in prefixes:
        return (f'flush --wait exit {fl.returncode} '
                f'{fl.stderr.strip()[:200]!r}, the share has a={got[0]!r} '
                f'b={got[1]!r}; expected one of {prefixes}')
    return None


def main():
    random.seed(os.environ.get('IT_SEED', '36'))
    n = fail = 0
    for flags, what in ((0, 'rename'), (RENAME_NOREPLACE, 'mv (NOREPLACE)')):
        bad = 0
        for run in range(RUNS):
            t = tempfile.mkdtemp(prefix='ferryfs-replay.')
            try:
                err = one(flags, t)
            except Exception as e:  # a mount that fails: a failure
                err = f'{type(e).__name__}: {e}'
            if err:
                bad += 1
                print(f'# {what} run {run}: {err} (kept {t})')
            else:
                shutil.rmtree(t)
        n += 1
        fail += bad > 0
        print(f'{"not ok" if bad else "ok"} {n} - {what}, create the old '
              f'name, kill -9: {RUNS - bad} of {RUNS} runs on a prefix')
    print(f'{n - fail} passed, {fail} failed')
    return 1 if fail else 0


sys.exit(main())
