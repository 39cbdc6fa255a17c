"""workload.py - the ops of the crash checker, their execution on a directory,
and the bounded-exhaustive and seeded-random workload generators
(tests/crash/README.md). Python 3, stdlib only.

An op is a tuple (kind, args...) over paths relative to a root. run_op()
applies one to a root and returns 0 or the errno it failed with; the same
function runs a workload through the mount and, for the reference states,
on plain local directories. drop_data=True applies an op without its data
part (the write of a create, a write, an append, an overwrite): the
reference for "a write that was not fsynced was lost".
"""
import ctypes
import errno
import itertools
import os
import random

# --- the initial share -----------------------------------------------------------

DIRS0 = ["A", "B", "A/p"]          # directories on the share beforehand
FILES0 = {                         # files on the share beforehand
    "A/f": b"precious A/f\n",
    "A/g": b"gold A/g " * 8,
    "A/p/q": b"quiet A/p/q\n",
    "B/h": b"held B/h\n",          # never named by an op: must survive
}

# the names ops use: files in two directories, on the share before or not,
# and directories (one on the share before, with a file in it)
FILES = ["A/f", "A/g", "A/n", "B/f", "B/n"]
DIRS = ["A/p", "A/d", "B/d"]
SMALL_FILES = ["A/f", "A/n", "B/f"]   # the bound for sequences of 3
SMALL_DIRS = ["A/p", "A/d", "B/d"]


def make_share(root):
    """Populate @root (an empty directory) with the initial share."""
    for d in DIRS0:
        os.mkdir(os.path.join(root, d), 0o755)
    for p, data in FILES0.items():
        with open(os.path.join(root, p), "wb") as f:
            f.write(data)
        os.chmod(os.path.join(root, p), 0o644)


# --- ops --------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_libc.renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int,
                            ctypes.c_char_p, ctypes.c_uint]
AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2


def renameat2(src, dst, flags):
    if _libc.renameat2(AT_FDCWD, os.fsencode(src), AT_FDCWD,
                       os.fsencode(dst), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), src)


DATA_KINDS = {"create", "write", "overwrite", "append"}
SYNC_KINDS = {"fsync", "fdatasync", "fsyncdir"}


def _data(kind, path):
    return {"create": b"new %s\n" % path.encode(),
            "write": b"written " * 3,
            "overwrite": b"OVER",
            "append": b"+appended %s\n" % path.encode()}[kind]


def run_op(root, op, drop_data=False, exchange=True):
    """Apply @op under @root; 0 or the errno. The syscalls are those an
    application would make; @drop_data leaves out the op's data write.
    exchange=False: what a mount over a share without an atomic exchange
    (nfs://) answers a rename_exchange: the kernel's own refusal (ENOENT
    for a missing name, ...), 0 for two links of one inode (the VFS does
    nothing), else EINVAL (fs/wb.c) and nothing changed."""
    kind = op[0]
    if kind == "rename_exchange" and not exchange:
        rc = run_op(root, op, drop_data)
        if rc:
            return rc
        a, b = (os.lstat(os.path.join(root, p)) for p in op[1:3])
        if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino):
            return 0
        run_op(root, op, drop_data)  # an exchange undoes itself
        return errno.EINVAL
    P = [os.path.join(root, a) if isinstance(a, str) else a for a in op[1:]]
    try:
        if kind == "create":           # O_EXCL create with content
            fd = os.open(P[0], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                if not drop_data:
                    os.write(fd, _data(kind, op[1]))
            finally:
                os.close(fd)
        elif kind == "creat":          # open(name, "w"): create or truncate
            os.close(os.open(P[0], os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                             0o644))
        elif kind in ("write", "overwrite", "append"):
            flags = os.O_WRONLY | (os.O_APPEND if kind == "append" else 0)
            fd = os.open(P[0], flags)
            try:
                if not drop_data:
                    if kind == "append":
                        os.write(fd, _data(kind, op[1]))
                    else:
                        os.pwrite(fd, _data(kind, op[1]),
                                  0 if kind == "overwrite" else 8)
            finally:
                os.close(fd)
        elif kind == "truncate":
            os.truncate(P[0], op[2])
        elif kind == "rename":
            os.rename(P[0], P[1])
        elif kind == "rename_noreplace":
            renameat2(P[0], P[1], RENAME_NOREPLACE)
        elif kind == "rename_exchange":
            renameat2(P[0], P[1], RENAME_EXCHANGE)
        elif kind == "link":
            os.link(P[0], P[1])
        elif kind == "unlink":
            os.unlink(P[0])
        elif kind == "mkdir":
            os.mkdir(P[0], 0o755)
        elif kind == "rmdir":
            os.rmdir(P[0])
        elif kind == "symlink":
            os.symlink(op[2], P[0])
        elif kind == "chmod":
            os.chmod(P[0], op[2])
        elif kind == "chown":
            os.chown(P[0], op[2], op[3])
        elif kind == "utimes":
            os.utime(P[0], ns=(1_000_000_000_000_000_000,
                               1_234_567_890_123_456_789))
        elif kind in SYNC_KINDS:
            fd = os.open(P[0], os.O_RDONLY)
            try:
                (os.fdatasync if kind == "fdatasync" else os.fsync)(fd)
            finally:
                os.close(fd)
        elif kind == "sync":
            os.sync()
        else:
            raise ValueError("unknown op %r" % (op,))
    except OSError as e:
        return e.errno
    return 0


def op_paths(op):
    """The paths @op names (for 'untouched' in the oracle)."""
    kind = op[0]
    if kind == "sync":
        return []
    if kind in ("rename", "rename_noreplace", "rename_exchange", "link"):
        return [op[1], op[2]]
    return [op[1]]


def op_str(op):
    return "%s(%s)" % (op[0], ", ".join(
        oct(a) if op[0] == "chmod" and isinstance(a, int) else repr(a)
        for a in op[1:]))


# --- the bounded space ------------------------------------------------------------

def op_space(files, dirs):
    """Every op over @files and @dirs (one instance of each shape)."""
    ops = []
    for p in files:
        ops += [("create", p), ("creat", p), ("write", p), ("overwrite", p),
                ("append", p), ("truncate", p, 100), ("truncate", p, 3),
                ("unlink", p), ("symlink", p, "../A/f"),
                ("chmod", p, 0o2755), ("chmod", p, 0o600),
                ("chown", p, 1000, 1000), ("utimes", p),
                ("fsync", p), ("fdatasync", p)]
    for p, q in itertools.permutations(files, 2):
        ops += [("rename", p, q), ("rename_noreplace", p, q), ("link", p, q)]
    for p, q in itertools.combinations(files, 2):
        ops.append(("rename_exchange", p, q))
    for d in dirs:
        ops += [("mkdir", d), ("rmdir", d), ("chmod", d, 0o2775),
                ("fsyncdir", d)]
    for d, e in itertools.permutations(dirs, 2):
        ops.append(("rename", d, e))
    ops += [("fsyncdir", "A"), ("sync",)]
    return ops


def exhaustive(length):
    """Every workload of @length ops in the bound of that length: the full
    name pool for 1 and 2 ops, the small one for 3."""
    if length <= 2:
        space = op_space(FILES, DIRS)
    else:
        space = op_space(SMALL_FILES, SMALL_DIRS)
    return itertools.product(space, repeat=length)


def space_size(length):
    n = len(op_space(FILES, DIRS) if length <= 2 else
            op_space(SMALL_FILES, SMALL_DIRS))
    return n ** length


def nth_workload(length, i):
    """The @i-th workload of exhaustive(@length), without the others."""
    space = (op_space(FILES, DIRS) if length <= 2 else
             op_space(SMALL_FILES, SMALL_DIRS))
    out = []
    for _ in range(length):
        i, r = divmod(i, len(space))
        out.append(space[r])
    return tuple(reversed(out))


def random_workload(rng, n):
    """A seeded random sequence of @n ops over the full name pool."""
    space = op_space(FILES, DIRS)
    return tuple(rng.choice(space) for _ in range(n))


# The five sequences of issue 36 that lost data or gave an op up on 57bd6a8
KNOWN = {
    "bug1_rename_recreate": (("rename", "A/f", "A/n"), ("creat", "A/f")),
    "bug1_mv_noreplace": (("rename_noreplace", "A/f", "A/n"),
                          ("creat", "A/f")),
    "dir_rename_remake": (("rename", "A/p", "A/d"), ("mkdir", "A/p")),
    "link_unlink_remake": (("link", "A/f", "B/f"), ("unlink", "A/f"),
                           ("creat", "A/f")),
    "swap_three_renames": (("rename", "A/f", "A/n"), ("rename", "A/g", "A/f"),
                           ("rename", "A/n", "A/g")),
    "rename_chain_append": (("rename", "A/f", "A/n"), ("rename", "A/n", "B/f"),
                            ("rename", "B/f", "B/n"), ("append", "B/n")),
    # done on the share, killed before its ack: the replay swapped back
    "exchange_sent_not_acked": (("rename_exchange", "A/f", "A/g"),),
    # a shrink replayed with the grown size: the share kept its old bytes
    # where the mount has zeros (journal.c invariant 19)
    "shrink_then_grow": (("creat", "A/f"), ("truncate", "A/f", 3)),
    "shrink_other_grow": (("creat", "A/f"), ("chown", "A/n", 1000, 1000),
                          ("truncate", "A/f", 100)),
}
