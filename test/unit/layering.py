#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks that libetcfs's calls point down: a module (and, inside lib/fs, a
file) calls only what is at its level or below, never a higher one; events
go up through callbacks and ops tables. Reads the archive's symbols with nm.
Usage: layering.py NM LIBETCFS.a (TAP output)."""
import subprocess
import sys

# Modules, lowest first; lib/fs's files get levels of their own below.
MODULES = ['util', 'etcd', 'meta', 'space', 'dev', 'lock', 'kchan', 'maint', 'alloc', 'fs',
           'fsck']
# lib/fs, lowest first; files on one line may call each other. file/ (the
# data path of regular files) is one level: its files work as one module.
FS_LEVELS = [['reply'], ['inode'], ['engine', 'batch'], ['handle', 'lockops', 'reclaim', 'readpin'],
             ['plocktab'], ['xattr', 'plock'], ['file'], ['attr', 'dir', 'ns'], ['fs']]


def level(member):
    """(module level, fs level) of an archive member such as
    fs_file_publish.c.o or etcd_kv.c.o."""
    name = member[:-len('.c.o')] if member.endswith('.c.o') else member
    parts = name.split('_')
    mod = parts[0]
    if mod not in MODULES:
        return None
    sub = 0
    if mod == 'fs':
        f = parts[1]
        sub = next((i for i, row in enumerate(FS_LEVELS) if f in row), None)
        if sub is None:
            return None
    return (MODULES.index(mod), sub)


def main():
    nm, lib = sys.argv[1], sys.argv[2]
    out = subprocess.run([nm, '-A', lib], capture_output=True, text=True, check=True).stdout
    defs, uses = {}, []
    unknown = set()
    for line in out.splitlines():
        head, _, rest = line.rpartition(':')
        member = head.rsplit(':', 1)[-1].rsplit('/', 1)[-1]
        p = rest.split()
        if len(p) == 3 and p[1] in 'TDBRC':
            defs[p[2]] = member
        elif len(p) == 2 and p[0] == 'U':
            uses.append((member, p[1]))
    bad = []
    for member, sym in uses:
        to = defs.get(sym)
        if not to or to == member:
            continue
        a, b = level(member), level(to)
        if a is None:
            unknown.add(member)
            continue
        if b is None:
            unknown.add(to)
            continue
        if b > a:
            bad.append(f'{member} calls {sym} of {to}, which is above it')
    print('TAP version 13\n1..2')
    if unknown:
        print('not ok 1 - every object has a level')
        for u in sorted(unknown):
            print(f'# {u}: add it to MODULES or FS_LEVELS in {sys.argv[0]}')
    else:
        print('ok 1 - every object has a level')
    if bad:
        print('not ok 2 - calls point down')
        for b in sorted(set(bad)):
            print('# ' + b)
    else:
        print('ok 2 - calls point down')
    return 1 if bad or unknown else 0


if __name__ == '__main__':
    sys.exit(main())
