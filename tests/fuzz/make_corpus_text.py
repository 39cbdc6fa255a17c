#!/usr/bin/env python3
"""make_corpus_text.py - write the seeds of tests/fuzz/corpus_opts/,
tests/fuzz/corpus_ctl/ and tests/fuzz/corpus_smb/: good and near-good
inputs of each parser, the first byte picking the parser as fuzz_opts.c,
fuzz_ctl.c and fuzz_smb.c read it (smb's are binary: the layouts of
remote/smb.c struct req, struct rep, struct conf_lens and pack_dirent()
on x86-64).

    tests/fuzz/make_corpus_text.py   (from anywhere; rewrites its seeds,
                                      leaves the regress_* ones)
"""
import os
import struct

top = os.path.dirname(os.path.abspath(__file__))

OPTS = {
    # 0: nfs parse_url
    "nfs_v3": (0, "nfs://server/export/dir"),
    "nfs_v4_args": (0, "nfs://10.0.0.1/exp//a/b/?version=4&uid=0&gid=0"),
    "nfs_ipv6": (0, "nfs://[fe80::1]/export"),
    "nfs_dotdot": (0, "nfs://h/export/../etc"),
    "nfs_port": (0, "nfs://h:2049/export"),
    # 1: smb parse_url
    "smb_share": (1, "smb://host/share"),
    "smb_user": (1, "smb://DOM;user@host:445/share//sub/dir/"),
    "smb_pass": (1, "smb://user:pw@host/share"),
    "smb_noshare": (1, "smb://host/"),
    # 2: rmt_throttle_parse
    "throttle": (2, "remote_rate=10M,remote_stream_rate=1.5MiB,"
                    "remote_latency=20ms,uid=0"),
    "throttle_fault": (2, "remote_fault=/tmp/x,,remote_latency=1s"),
    "throttle_bad": (2, "remote_rate=-1,remote_latency=5parsecs"),
    # 3: rmt_parse_rate
    "rate_k": (3, "512k"),
    "rate_frac": (3, "1.25GiB"),
    "rate_huge": (3, "99999999999999999999T"),
    # 4: rmt_pool_parse
    "pool": (4, "connections=8,version=4"),
    "pool_bad": (4, "connections=0,connections=65"),
    # 5: fs_opts_parse, argv one a line
    "cmd_wt": (5, "mount\nnfs://h/e\n/mnt\n-f\n-o\nattr_timeout=0.5,"
                  "max_threads=4"),
    "cmd_wb": (5, "/srv/r\n/mnt\n-o\nwriteback=on,journal=/var/j,"
                  "sync=remote,verify=readback,bwlimit=10M,"
                  "journal_max=1G,chunk_size=1M,streams=8"),
    "cmd_wb_off": (5, "/srv/r\n/mnt\n-owriteback=off,sync=journal,"
                      "verify=none,cache=off,streams=65,max_read=1"),
    "cmd_cache": (5, "/srv/r\n/mnt\n-ocache=/var/c,cache_max=2G,"
                     "cache_ttl=30s,readahead=2,cache_local"),
    "cmd_agent": (5, "/srv/r\n/mnt\n-o\nwriteback=/j,agent=h:7070/p,"
                     "agent_key=/k,agent_encrypt"),
    "cmd_remote": (5, "smb://u@h/s\n/mnt\n-o\ncredentials=/c,"
                      "connections=4,remote_rate=1M"),
    "cmd_help": (5, "-h\n--version\n-d"),
    "cmd_extra": (5, "a\nb\nc"),
}

CTL = {
    # 0: a request line as the daemon reads it (fs_ctl_read_line, then
    # fs_ctl_parse)
    "req_status": (0, "status\n"),
    "req_flush": (0, "flush\r\n"),
    "req_pause": (0, "pause"),
    "req_resume": (0, "resume\nstatus\n"),
    "req_unknown": (0, "frobnicate\n"),
    # 1: a reply as the client reads it (fs_ctl_read_reply, then the
    # JSON readers of `ferryfs status`)
    "rep_ok": (1, '{"ok": true}\n'),
    "rep_err": (1, '{"ok": false, "error": "unknown command"}\n'),
    "rep_flush": (1, '{"ok": true, "pending_bytes": 4096, '
                     '"pending_ops": 2}\n'),
    "rep_status": (1, '{"ok": true, "mode": "write-back", "remote": '
                      '"nfs://h/e", "mountpoint": "/mnt", "paused": false, '
                      '"pending_bytes": 1, "pending_files": 1, '
                      '"pending_ops": 3, "rate_bps": 1.5e6, "eta_s": 4, '
                      '"resent_bytes": 0, "failed_ops": 0, "streams": '
                      '[{"state": "busy", "rate_bps": 7, "via": "x"}], '
                      '"conflicts": 1, "conflict_paths": ["x"], '
                      '"cache": {"bytes": 9, "max_bytes": 10, '
                      '"hits": 1, "misses": 2}}\n'),
    "rep_status_wt": (1, '{"ok": true, "mode": "write-through", '
                         '"drained": true, "cache": null, '
                         '"cache_off": "cache=off"}\n'),
    "rep_trunc": (1, '{"ok": true, "streams": [{"id"'),
    # 128 streams: ~10 KB, more than the first read of fs_ctl_read_reply()
    # takes (8 KiB): its buffer grows (64 streams are ~20 KB in full)
    "rep_status_128": (1, '{"ok": true, "mode": "write-back", "streams": ['
                         + ", ".join('{"id": %d, "state": "sending", '
                                     '"rate_bps": 125000000, "via": '
                                     '"10.0.0.%d:7070"}' % (i, i)
                                     for i in range(128))
                         + '], "conflict_paths": ["a", "b/c"]}\n'),
}

CRED_MAX = 256
STAT_SIZE = 144  # struct stat, x86-64
OP_STAT, OP_READDIR, OP_RENAME, OP_PREAD = 2, 4, 8, 15


def req(op, p1=b"", p2=b"", a=0, b=0):
    return struct.pack("<IIIIQQqqqq", op, len(p1), len(p2), 0, 0, 0, a, b,
                       0, 0) + p1 + p2


def rep(rc, data=b""):
    return struct.pack("<qQ", rc, len(data)) + data


def dirent(name, st=False):
    return (struct.pack("<HB", len(name), 1 if st else 0) +
            (bytes(STAT_SIZE) if st else b"") + name)


def conf(user, server, base):
    cred = lambda s: s + bytes(CRED_MAX - len(s))
    return (struct.pack("<II", len(server), len(base)) + cred(user) +
            cred(b"") + cred(b"") + server + base)


SMB = {
    "conf": (0, conf(b"alice", b"host", b"smb://host/share")),
    "conf_nonul": (0, struct.pack("<II", 4, 4) + b"u" * CRED_MAX),
    "req_stat": (1, req(OP_STAT, b"dir/file.txt")),
    "req_rename": (1, req(OP_RENAME, b"a b", "ü/c".encode()) +
                   req(OP_STAT)),
    "req_pread": (1, req(OP_PREAD, b"", b"", 0, 1 << 20)),
    "req_bad_utf8": (1, req(OP_STAT, b"\xff\\x")),
    "rep_stat": (2, rep(0, bytes(STAT_SIZE))),
    "rep_err": (2, rep(-2)),
    "rep_big": (2, rep(0, bytes(STAT_SIZE + 1))),
    "rep_list": (3, rep(0, dirent(b"a") + dirent(b"file.txt", True) +
                        dirent(b".ferryfs-unlinked-1"))),
    "rep_list_cut": (3, rep(0, dirent(b"abc")[:-1])),
}


def write(name, table):
    d = os.path.join(top, "corpus_" + name)
    os.makedirs(d, exist_ok=True)  # regress_* seeds (a bug's input) stay
    for fname, (kind, text) in table.items():
        with open(os.path.join(d, fname), "wb") as f:
            if isinstance(text, str):
                text = text.encode()
            f.write(bytes([kind]) + text)


write("opts", OPTS)
write("ctl", CTL)
write("smb", SMB)
