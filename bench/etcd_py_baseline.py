#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Peer baseline for bench/etcd_bench: the same workloads through python3-etcd3.

Run it with /usr/bin/python3 (Debian's interpreter, which sees the
python3-etcd3 package); the python3 on PATH here is a separate install.

Closed loop: N threads on one etcd3 client (one gRPC channel, so one HTTP/2
connection), each doing blocking calls back to back. Per configuration and
repetition one JSON line on stdout, the same fields as etcd_bench:
throughput, latency p50/p99 (nearest rank), process CPU per request
(resource.getrusage(RUSAGE_SELF): every thread, grpc's own included) and
peak RSS.

Workloads (identical requests to etcd_bench):
  put: Put of <prefix>/<cfg>/<slot>, value of --value-size bytes.
  txn: Txn comparing the mod_revision of the thread's key with the revision of
       its last write (0 at first), a Put of the key on success and a Get of
       it on failure (to re-synchronise), built with etcd3's transaction
       helpers.

Memory mode (--mem-inflight N): N Puts in flight at once. Threads cannot do
that, so it uses the grpc futures of the client's own KV stub
(client.kvstub.Put.future), which is how a python3-etcd3 user would get
there.
"""

import argparse
import json
import os
import resource
import statistics
import sys
import threading
import time

import etcd3
from etcd3 import etcdrpc


def status_kb(field):
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(field + ':'):
                return int(line.split()[1])
    return -1


def reset_hwm():
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
    except OSError:
        pass


def cpu_s():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime, ru.ru_stime


def pct_us(sorted_ns, p):
    n = len(sorted_ns)
    if n == 0:
        return 0.0
    rank = max(1, min(n, int(p / 100.0 * n + 0.999999)))
    return sorted_ns[rank - 1] / 1e3


class Config:
    def __init__(self, client, workload, conc, prefix, cfg_id, value):
        self.client = client
        self.workload = workload
        self.conc = conc
        self.value = value
        self.keys = ['%s/%d/%06d' % (prefix, cfg_id, i) for i in range(conc)]
        self.measuring = False
        self.stop = False
        self.lat = [[] for _ in range(conc)]
        self.errors = [0] * conc
        self.txn_failed = [0] * conc
        self.first_error = None
        self.max_rev = 0

    def worker(self, i):
        client = self.client
        key = self.keys[i]
        value = self.value
        lat = self.lat[i]
        mono = time.monotonic_ns
        tx = client.transactions
        mod_rev = 0
        while not self.stop:
            t0 = mono()
            try:
                if self.workload == 'put':
                    resp = client.put(key, value)
                    rev = resp.header.revision
                else:
                    ok, resps = client.transaction(
                        compare=[tx.mod(key) == mod_rev],
                        success=[tx.put(key, value)],
                        failure=[tx.get(key)])
                    if ok:
                        rev = resps[0].response_put.header.revision
                        mod_rev = rev
                    else:
                        if self.measuring:
                            self.txn_failed[i] += 1
                        mod_rev = resps[0][0][1].mod_revision if resps and resps[0] else 0
                        rev = mod_rev
            except Exception as e:  # counted like the C client's errors
                if self.measuring:
                    self.errors[i] += 1
                    if self.first_error is None:
                        self.first_error = repr(e)
                mod_rev = -1
                continue
            t1 = mono()
            if rev > self.max_rev:
                self.max_rev = rev
            if self.measuring:
                lat.append(t1 - t0)


def run_closed(client, args, workload, conc, rep, cfg_id, value):
    cfg = Config(client, workload, conc, args.prefix, cfg_id, value)
    rss_start = status_kb('VmRSS')
    reset_hwm()
    threads = [threading.Thread(target=cfg.worker, args=(i,), daemon=True)
               for i in range(conc)]
    for t in threads:
        t.start()
    time.sleep(args.warmup_ms / 1e3)
    u0, s0 = cpu_s()
    t0 = time.monotonic_ns()
    cfg.measuring = True
    time.sleep(args.duration_ms / 1e3)
    cfg.measuring = False
    t1 = time.monotonic_ns()
    u1, s1 = cpu_s()
    cfg.stop = True
    for t in threads:
        t.join()
    lat = sorted(x for per in cfg.lat for x in per)
    secs = (t1 - t0) / 1e9
    ops = len(lat)
    res = {
        'client': 'py', 'test': 'closed', 'workload': workload, 'concurrency': conc,
        'rep': rep, 'ops': ops, 'secs': round(secs, 4),
        'ops_per_s': round(ops / secs, 1) if secs > 0 else 0.0,
        'p50_us': round(pct_us(lat, 50), 1), 'p99_us': round(pct_us(lat, 99), 1),
        'cpu_us_per_op': round((u1 - u0 + s1 - s0) * 1e6 / ops, 3) if ops else 0.0,
        'utime_s': round(u1 - u0, 4), 'stime_s': round(s1 - s0, 4),
        'errors': sum(cfg.errors), 'txn_failed': sum(cfg.txn_failed),
        'rss_start_kb': rss_start, 'rss_end_kb': status_kb('VmRSS'),
        'hwm_kb': status_kb('VmHWM'), 'value_size': len(value),
    }
    if cfg.first_error:
        print('etcd_py_baseline: %s c=%d: %d errors, first %s'
              % (workload, conc, res['errors'], cfg.first_error), file=sys.stderr)
    return res, cfg.max_rev


def burst(client, prefix, n, value):
    reqs = [etcdrpc.PutRequest(key=('%s/%06d' % (prefix, i)).encode(), value=value)
            for i in range(n)]
    futs = [client.kvstub.Put.future(r, 60) for r in reqs]
    errors = 0
    max_rev = 0
    first_error = None
    for f in futs:
        try:
            resp = f.result()
            max_rev = max(max_rev, resp.header.revision)
        except Exception as e:
            errors += 1
            if first_error is None:
                first_error = repr(e)
    if first_error:
        print('etcd_py_baseline: burst: %d errors, first %s' % (errors, first_error),
              file=sys.stderr)
    return max_rev, errors


def run_mem(client, args, value, cfg_base):
    """Same protocol as etcd_bench's memory mode: a warm-up burst of 256, the
    idle RSS, then bursts of --mem-inflight Puts issued at once (grpc futures
    of the etcd3 client's KV stub; threads cannot hold 10,000 calls)."""
    max_rev, _ = burst(client, '%s/%d' % (args.prefix, cfg_base), 256, value)
    rss_idle = status_kb('VmRSS')
    n = args.mem_inflight
    for rnd in range(1, args.mem_rounds + 1):
        reset_hwm()
        u0, s0 = cpu_s()
        t0 = time.monotonic_ns()
        rev, errors = burst(client, '%s/%d' % (args.prefix, cfg_base + rnd), n, value)
        t1 = time.monotonic_ns()
        u1, s1 = cpu_s()
        max_rev = max(max_rev, rev)
        hwm = status_kb('VmHWM')
        row = {
            'client': 'py', 'test': 'mem', 'inflight': n, 'round': rnd,
            'rss_idle_kb': rss_idle, 'hwm_kb': hwm, 'peak_delta_kb': hwm - rss_idle,
            'bytes_per_inflight': round((hwm - rss_idle) * 1024.0 / n),
            'rss_after_kb': status_kb('VmRSS'), 'secs': round((t1 - t0) / 1e9, 4),
            'cpu_us_per_op': round((u1 - u0 + s1 - s0) * 1e6 / n, 3),
            'errors': errors, 'retries': 0,
        }
        print(json.dumps(row, separators=(',', ':')), flush=True)
    return max_rev


def parse_list(s, conv):
    return [conv(x) for x in s.split(',') if x]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--endpoint', required=True, help='http://host:port or host:port')
    ap.add_argument('--workload', default='put,txn')
    ap.add_argument('--concurrency', default='1,16,64,256')
    ap.add_argument('--reps', type=int, default=3)
    ap.add_argument('--duration-ms', type=int, default=3000)
    ap.add_argument('--warmup-ms', type=int, default=500)
    ap.add_argument('--value-size', type=int, default=64)
    ap.add_argument('--mem-inflight', type=int, default=0)
    ap.add_argument('--mem-rounds', type=int, default=3)
    ap.add_argument('--prefix', default='bench/py%d' % os.getpid())
    ap.add_argument('--mem-only', action='store_true', help='skip the closed-loop runs')
    ap.add_argument('--no-cleanup', action='store_true')
    args = ap.parse_args()

    hostport = args.endpoint.split('://', 1)[-1].rstrip('/')
    host, port = hostport.rsplit(':', 1)
    client = etcd3.client(host=host, port=int(port), timeout=60)
    value = b'v' * args.value_size

    results = []
    max_rev = 0
    cfg_id = 0
    for wl in [] if args.mem_only else parse_list(args.workload, str):
        if wl not in ('put', 'txn'):
            ap.error('unknown workload %r' % wl)
        for conc in parse_list(args.concurrency, int):
            for rep in range(args.reps):
                cfg_id += 1
                res, rev = run_closed(client, args, wl, conc, rep, cfg_id, value)
                max_rev = max(max_rev, rev)
                print(json.dumps(res, separators=(',', ':')), flush=True)
                results.append(res)
    if args.mem_inflight > 0:
        max_rev = max(max_rev, run_mem(client, args, value, cfg_id + 1))

    if results:
        print('%-8s %6s %12s %10s %10s %12s %10s %8s' % (
            'workload', 'conc', 'ops/s', 'p50 us', 'p99 us', 'cpu us/op', 'hwm KiB',
            'errors'), file=sys.stderr)
        groups = {}
        for r in results:
            groups.setdefault((r['workload'], r['concurrency']), []).append(r)
        for (wl, conc), rs in groups.items():
            print('%-8s %6d %12.0f %10.1f %10.1f %12.2f %10d %8d' % (
                wl, conc, statistics.median(r['ops_per_s'] for r in rs),
                statistics.median(r['p50_us'] for r in rs),
                statistics.median(r['p99_us'] for r in rs),
                statistics.median(r['cpu_us_per_op'] for r in rs),
                max(r['hwm_kb'] for r in rs),
                sum(r['errors'] + r['txn_failed'] for r in rs)), file=sys.stderr)

    if not args.no_cleanup:
        try:
            client.delete_prefix(args.prefix + '/')
            if max_rev > 0:
                client.compact(max_rev)
        except Exception as e:
            print('etcd_py_baseline: cleanup: %r' % e, file=sys.stderr)
    client.close()
    return 0


if __name__ == '__main__':
    sys.exit(main())
