#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Counts the TAP results of meson test logs and prints one closing line,
'etcfs: N passed, N failed', over every log given, after naming every
failed check (log, test, TAP line) and then, for each, the assertion block
Criterion wrote under that line and the last lines of the test's stderr, so
that the tail of a CI run says what broke and why (a CI record may keep only
that tail). Exits 1 on any failure or when no test ran at all."""
import json
import re
import sys

BLOCK_LINES = 60   # of one failure's assertion block
STDERR_LINES = 25  # of a failed test's stderr

passed = failed = 0
failures = []   # one line per failed check
details = []    # (what, lines) per failed check


INFO_LOG = re.compile(r'^#? *\d\d:\d\d:\d\d\.\d+ (info|debug):')
WHY = re.compile(r'[\w./-]+\.c:\d+:')


def reason(block):
    """The first assertion line of a failure's block, shortened."""
    for l in block:
        if WHY.search(l):
            l = l.strip().lstrip('#').strip()
            return l if len(l) <= 400 else l[:400] + '...'
    return ''


def block_after(out, line):
    """The YAML block Criterion writes under a 'not ok' line, up to '...'."""
    lines = out.splitlines()
    try:
        i = lines.index(line)
    except ValueError:
        return []
    block = []
    for l in lines[i + 1:]:
        if l.startswith('ok ') or l.startswith('not ok ') or l.strip() == '...':
            break
        # Daemon logs the cluster suite prints after a failure: only
        # their warnings and errors say something.
        if INFO_LOG.match(l):
            continue
        block.append(l)
    if len(block) > BLOCK_LINES:
        block = block[:BLOCK_LINES] + [f'  [{len(block) - BLOCK_LINES} more lines]']
    return block


for path in sys.argv[1:]:
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            out = rec.get('stdout') or ''
            ok = len(re.findall(r'^ok \d*', out, re.M))
            bad_lines = re.findall(r'^not ok .*$', out, re.M)
            bad = len(bad_lines)
            where = f"{path}: {rec.get('name', '?')}"
            if ok + bad == 0:
                # A test that printed no TAP counts as one result.
                if rec['result'] in ('OK', 'EXPECTEDFAIL'):
                    ok = 1
                else:
                    bad = 1
                    failures.append(f"{where}: {rec['result']}")
            elif rec['result'] not in ('OK', 'EXPECTEDFAIL') and bad == 0:
                bad = 1  # crashed or timed out after its last TAP line
                failures.append(f"{where}: {rec['result']} after its last TAP line")
            for b in bad_lines:
                block = block_after(out, b)
                why = reason(block)
                # The closing lines are what a short CI record keeps: each
                # names its check's first assertion too.
                failures.append(f"{where}: {b}" + (f" -- {why}" if why else ''))
                details.append((f"{where}: {b}", block))
            if bad:
                err = (rec.get('stderr') or '').splitlines()[-STDERR_LINES:]
                if err:
                    details.append((f"{where}: last {len(err)} lines of stderr", err))
            passed += ok
            failed += bad
for what, lines in details:
    print(f'--- {what}')
    for l in lines:
        print(f'    {l}')
for f in failures:
    print(f'FAILED {f}')
print(f'etcfs: {passed} passed, {failed} failed')
sys.exit(1 if failed or passed == 0 else 0)
