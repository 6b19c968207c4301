#!/usr/bin/env python3
"""kazoo's Lock measured the way `dlock bench` measures a backend, for a side-by-side run.

Needs `pip install kazoo` (not part of the test suite). Usage:

    scripts/bench-kazoo.py --hosts 127.0.0.1:7181 --mode uncontended --duration 5
    scripts/bench-kazoo.py --hosts 127.0.0.1:7181 --mode contended --clients 8 --hold-ms 1

uncontended: one client; kazoo's `Lock.acquire(blocking=False)` + `release()` on one name and
the same floor as `dlock bench` (create an EPHEMERAL node + delete it on the session), taking
turns in 200 ms slices over the same window, as `dlock bench` does.

contended: N threads, each with its own session and `Lock` on one name, acquire (blocking),
hold, release, for the duration: acquisitions/s, per-client min/max, waiter wait p50/p99, and
the mutual-exclusion violations seen by a shared in-process flag.

Prints one JSON object after the human-readable lines (`--json` prints only the JSON).
"""

import argparse
import json
import statistics
import threading
import time
import uuid

from kazoo.client import KazooClient

SLICE = 0.2


def pct(samples, q):
    if not samples:
        return None
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))]


def uncontended(hosts, duration, warmup, base):
    zk = KazooClient(hosts=hosts)
    zk.start()
    zk.ensure_path(base)
    lock = zk.Lock(f"{base}/kazoo-uncontended", identifier="bench")
    floor_path = f"{base}/kazoo-floor"

    def lock_pair():
        if not lock.acquire(blocking=False):
            raise RuntimeError("uncontended acquire refused")
        lock.release()

    def floor_pair():
        zk.create(floor_path, b"", ephemeral=True)
        zk.delete(floor_path)

    ops = [lock_pair, floor_pair]
    lat = [[], []]
    measured = [0.0, 0.0]
    turns = len(ops)
    start = time.perf_counter()
    measure_from = start + turns * warmup
    end = start + turns * (warmup + duration)
    turn = 0
    while True:
        now = time.perf_counter()
        if now >= end:
            break
        until = min(now + SLICE, end)
        slice_start = now
        while True:
            t0 = time.perf_counter()
            if t0 >= until:
                break
            ops[turn]()
            if t0 >= measure_from:
                lat[turn].append(time.perf_counter() - t0)
        measured[turn] += max(0.0, time.perf_counter() - max(slice_start, measure_from))
        turn = (turn + 1) % turns
    zk.stop()
    zk.close()
    rows = {}
    for i, label in enumerate(["kazoo_lock", "floor"]):
        rows[label] = {
            "pairs_per_sec": len(lat[i]) / measured[i] if measured[i] else 0.0,
            "p50_us": pct(lat[i], 0.5) * 1e6,
            "p99_us": pct(lat[i], 0.99) * 1e6,
            "pairs": len(lat[i]),
        }
    rows["ratio"] = rows["kazoo_lock"]["pairs_per_sec"] / rows["floor"]["pairs_per_sec"]
    return rows


def contended(hosts, clients, hold, duration, warmup, base):
    path = f"{base}/kazoo-contended-{uuid.uuid4().hex[:8]}"
    holding = [0]
    violations = [0]
    guard = threading.Lock()
    start_at = time.perf_counter() + 1.0
    measure_from = start_at + warmup
    end = measure_from + duration
    counts = [0] * clients
    waits = [[] for _ in range(clients)]
    sessions = []
    for _ in range(clients):
        zk = KazooClient(hosts=hosts)
        zk.start()
        sessions.append(zk)
    sessions[0].ensure_path(path)

    def worker(i):
        lock = sessions[i].Lock(path, identifier=f"c{i}")
        while time.perf_counter() < start_at:
            time.sleep(0.001)
        while True:
            t0 = time.perf_counter()
            if t0 >= end:
                break
            lock.acquire()
            got = time.perf_counter()
            with guard:
                holding[0] += 1
                if holding[0] > 1:
                    violations[0] += 1
            deadline = got + hold
            while time.perf_counter() < deadline:
                time.sleep(max(0.0, min(0.0005, deadline - time.perf_counter())))
            with guard:
                holding[0] -= 1
            lock.release()
            if t0 >= measure_from and got < end:
                counts[i] += 1
                waits[i].append(got - t0)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for zk in sessions:
        zk.stop()
        zk.close()
    all_waits = [w for ws in waits for w in ws]
    total = sum(counts)
    return {
        "acquisitions_per_sec": total / duration,
        "per_client_min": min(counts),
        "per_client_max": max(counts),
        "min_over_max": (min(counts) / max(counts)) if max(counts) else 0.0,
        "wait_p50_ms": (statistics.median(all_waits) * 1e3) if all_waits else None,
        "wait_p99_ms": (pct(all_waits, 0.99) * 1e3) if all_waits else None,
        "violations": violations[0],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", required=True, help="host:port[,host:port...]")
    ap.add_argument("--mode", choices=["uncontended", "contended"], default="uncontended")
    ap.add_argument("--duration", type=float, default=5.0, help="seconds measured per phase")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--hold-ms", type=float, default=1.0)
    ap.add_argument("--base", default="/dlock-bench-kazoo")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.duration <= 0 or a.warmup < 0 or a.clients < 1 or a.hold_ms < 0:
        ap.error("duration must be > 0, warmup and hold >= 0, clients >= 1")
    if a.mode == "uncontended":
        r = uncontended(a.hosts, a.duration, a.warmup, a.base)
        if not a.json:
            for k in ("kazoo_lock", "floor"):
                v = r[k]
                print(f"  {k:<11} {v['pairs_per_sec']:8.0f} pairs/s  p50 {v['p50_us']:7.1f}us  "
                      f"p99 {v['p99_us']:8.1f}us  ({v['pairs']} pairs)")
            print(f"  ratio kazoo/floor = {r['ratio']:.3f}")
    else:
        r = contended(a.hosts, a.clients, a.hold_ms / 1e3, a.duration, a.warmup, a.base)
        if not a.json:
            print(f"  acquisitions/s {r['acquisitions_per_sec']:.0f}, per-client min/max "
                  f"{r['per_client_min']}/{r['per_client_max']} = {r['min_over_max']:.2f}, "
                  f"wait p50 {r['wait_p50_ms']:.2f}ms p99 {r['wait_p99_ms']:.2f}ms, "
                  f"violations {r['violations']}")
    print(json.dumps({"mode": a.mode, **r}))


if __name__ == "__main__":
    main()
