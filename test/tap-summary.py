#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Counts the TAP results of meson test logs and prints one closing line,
'etcfs: N passed, N failed', over every log given, after naming every
failed check (log, test, TAP line) so that the tail of a CI run says what
broke. Exits 1 on any failure or when no test ran at all."""
import json
import re
import sys

passed = failed = 0
failures = []
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
                failures.append(f"{where}: {b}")
            passed += ok
            failed += bad
for f in failures:
    print(f'FAILED {f}')
print(f'etcfs: {passed} passed, {failed} failed')
sys.exit(1 if failed or passed == 0 else 0)
