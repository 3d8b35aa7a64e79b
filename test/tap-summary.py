#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Counts the TAP results of meson test logs and prints one closing line,
'etcfs: N passed, N failed', over every log given. Exits 1 on any failure
or when no test ran at all."""
import json
import re
import sys

passed = failed = 0
for path in sys.argv[1:]:
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            out = rec.get('stdout') or ''
            ok = len(re.findall(r'^ok \d*', out, re.M))
            bad = len(re.findall(r'^not ok \d*', out, re.M))
            if ok + bad == 0:
                # A test that printed no TAP counts as one result.
                if rec['result'] in ('OK', 'EXPECTEDFAIL'):
                    ok = 1
                else:
                    bad = 1
            elif rec['result'] not in ('OK', 'EXPECTEDFAIL') and bad == 0:
                bad = 1  # crashed or timed out after its last TAP line
            passed += ok
            failed += bad
print(f'etcfs: {passed} passed, {failed} failed')
sys.exit(1 if failed or passed == 0 else 0)
