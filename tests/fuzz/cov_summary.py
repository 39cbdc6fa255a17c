#!/usr/bin/env python3
"""cov_summary.py - the line coverage of a fuzz target's parser functions,
from the per-function report FUZZ_COVERAGE=1 tests/fuzz/fuzz.sh prints:

    FUZZ_COVERAGE=1 tests/fuzz/fuzz.sh TARGET OUT 0 [CORPUS] > OUT.txt
    tests/fuzz/cov_summary.py TARGET OUT.txt

Only the functions that parse (listed here per target) count: most of
nfs.c and smb.c is their drivers, which no fuzzer runs.
"""
import re
import sys

PARSERS = {
    "journal": {"rec.c": None},  # all of it
    "opts": {
        "opts.c": ["opt_proc", "parse_size", "parse_journal_opts",
                   "parse_into", "fs_opts_parse", "fs_opts_release"],
        "nfs.c": ["parse_url", "parse_path", "parse_arg", "all_digits"],
        "smb.c": ["parse_url", "set_field"],
        "throttle.c": ["rmt_parse_rate", "rmt_throttle_parse",
                       "parse_with_unit", "parse_number", "parse_item",
                       "parse_duration", "take_throttle"],
        "pool.c": ["rmt_pool_parse", "parse_count", "take_connections"],
    },
    "ctl": {
        "ctl.c": ["fs_ctl_parse", "fs_ctl_read_line", "fs_ctl_read_reply"],
        "main.c": ["json_num", "json_str", "json_flag", "json_ok",
                   "human_bytes", "print_streams", "print_conflicts",
                   "print_status", "print_progress"],
    },
    "smb": {
        "smb.c": ["recv_conf", "recv_all", "send_all", "worker_read_req",
                  "make_url", "utf8_valid", "name_char_plain", "exchange",
                  "listing_walk"],
    },
}

target, path = sys.argv[1], sys.argv[2]
want = PARSERS[target]
cur = None
tot = {}
for line in open(path):
    m = re.match(r"File '(.*)':", line)
    if m:
        cur = m.group(1).rsplit("/", 1)[-1]
        continue
    f = line.split()
    if (cur not in want or len(f) < 7 or not f[1].isdigit() or
            f[0] == "TOTAL"):
        continue
    name = f[0].split(":", 1)[-1]
    if want[cur] is not None and name not in want[cur]:
        continue
    lines, miss = int(f[4]), int(f[5])
    t = tot.setdefault(cur, [0, 0, 0])
    t[0] += lines
    t[1] += lines - miss
    t[2] += 1
all_l = sum(t[0] for t in tot.values())
all_c = sum(t[1] for t in tot.values())
for fname, (lines, cov, nfn) in sorted(tot.items()):
    print(f"{fname}: {cov}/{lines} lines of {nfn} parser functions "
          f"({100.0 * cov / lines:.1f}%)")
print(f"{target} total: {all_c}/{all_l} lines ({100.0 * all_c / all_l:.1f}%)")
