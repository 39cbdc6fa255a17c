#!/usr/bin/env python3
"""make_corpus_agent.py - write the seed corpus of fuzz_agent.c into
tests/fuzz/corpus_agent/ (run it again after a change of the protocol or
of the harness's input format; see fuzz_agent.c's comment)."""
import hashlib
import os
import struct

(REPLY, STAT, STATFS, MKDIR, RMDIR, UNLINK, MKNOD, SYMLINK, READLINK, LINK,
 RENAME, SETATTR, OPEN, CLOSE, PREAD, FSTAT, FSYNC, PUT, DATA,
 BATCH) = range(1, 21)
O_RDWR, O_CREAT, O_TRUNC = 0o2, 0o100, 0o1000
S_IFIFO = 0o010000


def u16(v): return struct.pack('<H', v)
def u32(v): return struct.pack('<I', v & 0xffffffff)
def u64(v): return struct.pack('<Q', v)
def s(p): return u16(len(p)) + p.encode()


def frame(t, payload=b''):
    return b'\0' + bytes([t]) + u16(len(payload)) + payload


def raw(b):
    return b'\1' + u16(len(b)) + b


def put(hid, off, data, how):
    return (b'\2' + bytes([hid]) + u16(off) + u16(len(data)) +
            bytes([how]) + data)


def setattr(hid, path, set_, mode=0o644, size=0):
    return (u32(hid) + s(path) + u32(set_) + u32(mode) + u32(0) + u32(0) +
            u64(size) + u64(1) + u32(0) + u64(2) + u32(0x3ffffffe))


def opn(hid, path, flags, mode=0o644):
    return u32(hid) + s(path) + u32(flags) + u32(mode)


def batch(entries):
    b = u32(len(entries))
    for t, g, req in entries:
        b += u16(t) + u16(g) + u32(len(req)) + req
    return b


def session(enc, *ops):
    return bytes([1 if enc else 0]) + b''.join(ops)


seeds = {
    'stat': session(False, frame(STAT, s('')), frame(STATFS),
                    frame(STAT, s('l')), frame(READLINK, s('v'))),
    'files': session(False,
                     frame(OPEN, opn(1, 'f', O_RDWR | O_CREAT)),
                     put(1, 0, b'hello world', 1),
                     put(1, 100, b'pulled bytes' * 20, 0),
                     put(1, 100, b'pulled bytes' * 20, 0),
                     frame(PREAD, u32(1) + u64(0) + u32(64)),
                     frame(FSTAT, u32(1)),
                     frame(FSYNC, u32(1) + u32(1)),
                     frame(SETATTR, setattr(1, '', 8, size=5)),
                     frame(CLOSE, u32(1))),
    'names': session(True,
                     frame(MKDIR, s('d') + u32(0o755)),
                     frame(MKNOD, s('d/p') + u32(S_IFIFO | 0o644) + u64(0)),
                     frame(SYMLINK, s('../x') + s('d/s')),
                     frame(READLINK, s('d/s')),
                     frame(OPEN, opn(2, 'd/f', O_RDWR | O_CREAT | O_TRUNC)),
                     frame(LINK, s('d/f') + s('d/g')),
                     frame(RENAME, s('d/g') + s('h') + u32(1)),
                     frame(SETATTR, setattr(0, 'h', 1 | 16 | 32, 0o600)),
                     frame(UNLINK, s('h')),
                     frame(UNLINK, s('d/p')),
                     frame(RMDIR, s('d'))),
    'escape': session(False,
                      frame(STAT, s('l/victim')),
                      frame(OPEN, opn(3, 'v', O_RDWR | O_TRUNC)),
                      frame(SETATTR, setattr(0, 'v', 1 | 8, 0o777)),
                      frame(LINK, s('v') + s('hl')),
                      frame(RENAME, s('l') + s('m') + u32(0))),
    'batch': session(False, frame(BATCH, batch([
        (MKDIR, 0, s('b') + u32(0o755)),
        (MKDIR, 0, s('b/c') + u32(0o755)),
        (MKDIR, 1, s('x/y') + u32(0o755)),
        (MKDIR, 1, s('x/y/z') + u32(0o755)),
        (OPEN, 2, opn(4, 'b/c/f', O_RDWR | O_CREAT)),
        (PUT, 2, u32(4) + u64(0) + u32(3) +
         hashlib.sha256(b'abc').digest() + u32(1) + b'abc'),
        (CLOSE, 2, u32(4)),
        (STATFS, 3, b''),
    ]))),
    'put_bad': session(True,
                       frame(OPEN, opn(5, 'p', O_RDWR | O_CREAT)),
                       put(5, 0, b'wrong sha, pulled' * 4, 2),
                       put(5, 0, b'wrong sha, inline', 3),
                       put(5, 9, b'no DATA after want' * 4, 4),
                       frame(FSTAT, u32(5))),
    'malformed': session(False, frame(STAT, u16(100) + b'abc'),
                         frame(STAT, s(''))),
    'data_unasked': session(True, frame(DATA, b'xyz')),
    'raw_after_hs': session(False, raw(b'\x10\0\0\0\2\0\0\0' + bytes(40))),
    'hello': b'\2' + b'FERRYAG1' + u32(1) + u32(1) + bytes(32) + bytes(32),
    'answer': b'\3' + b'FERRYAG1' + u32(1) + u32(0) + bytes(64),
}

out = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                   'corpus_agent')
os.makedirs(out, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(out, name), 'wb') as f:
        f.write(data)
