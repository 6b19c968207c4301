# The test kit's kazoo client (see peer.rs): one KazooClient session, driven over the same line
# protocol as CuratorPeer.java so that one Python process serves a whole test.
#
#   stdin:  <id> mutex|read|write <path> <wait_ms>   (wait_ms < 0: forever; 0: one attempt)
#           <id> semaphore <path> <wait_ms> <max_leases>
#           <id> release
#   stdout: ready <session id, hex>
#           <id> acquired <lock node path> <czxid>
#           <id> timeout | <id> released | <id> error <message>
#
# semaphore takes one lease of kazoo's Semaphore (the lease node is reported); mutex is kazoo's Lock, read and write its ReadLock and WriteLock; each request is a lock
# object of its own (a contender of its own), acquired on a thread of its own. Stdin closing
# ends the process.

import sys
import threading

from kazoo.client import KazooClient
from kazoo.exceptions import LockTimeout

OUT = threading.Lock()
HELD = {}


def say(line):
    with OUT:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def acquire(zk, kind, ident, path, wait_ms):
    make = {"mutex": zk.Lock, "read": zk.ReadLock, "write": zk.WriteLock}[kind]
    lock = make(path)
    try:
        if wait_ms == 0:
            got = lock.acquire(blocking=False)
        elif wait_ms < 0:
            got = lock.acquire()
        else:
            got = lock.acquire(timeout=wait_ms / 1000.0)
    except LockTimeout:
        got = False
    except Exception as e:  # reported, not raised: the test reads it
        say("%s error %r" % (ident, e))
        return
    if not got:
        say("%s timeout" % ident)
        return
    node = path + "/" + lock.node
    stat = zk.exists(node)
    HELD[ident] = lock
    say("%s acquired %s %d" % (ident, node, stat.czxid if stat else -1))


def lease(zk, ident, path, wait_ms, max_leases):
    sem = zk.Semaphore(path, max_leases=max_leases)
    try:
        if wait_ms == 0:
            got = sem.acquire(blocking=False)
        elif wait_ms < 0:
            got = sem.acquire()
        else:
            got = sem.acquire(timeout=wait_ms / 1000.0)
    except LockTimeout:
        got = False
    except Exception as e:  # reported, not raised: the test reads it (ValueError on a count)
        say("%s error %r" % (ident, e))
        return
    if not got:
        say("%s timeout" % ident)
        return
    stat = zk.exists(sem.create_path)
    HELD[ident] = sem
    say("%s acquired %s %d" % (ident, sem.create_path, stat.czxid if stat else -1))


def release(ident):
    lock = HELD.pop(ident, None)
    if lock is None:
        say("%s error not held" % ident)
        return
    try:
        lock.release()
        say("%s released" % ident)
    except Exception as e:
        say("%s error %r" % (ident, e))


def main():
    hosts, session_ms = sys.argv[1], int(sys.argv[2])
    # kazoo asks for its `timeout` as the session timeout.
    zk = KazooClient(hosts=hosts, timeout=session_ms / 1000.0)
    try:
        zk.start(timeout=30)
    except Exception as e:
        say("fatal no ZooKeeper session within 30 s at %s: %r" % (hosts, e))
        sys.exit(1)
    say("ready %x" % zk.client_id[0])
    for line in sys.stdin:
        words = line.split()
        if len(words) < 2:
            continue
        ident, verb = words[0], words[1]
        if verb == "release":
            target, args = release, (ident,)
        elif verb == "semaphore":
            target = lease
            args = (zk, ident, words[2], int(words[3]), int(words[4]))
        elif verb in ("mutex", "read", "write"):
            target, args = acquire, (zk, verb, ident, words[2], int(words[3]))
        else:
            say("%s error unknown command %s" % (ident, verb))
            continue
        threading.Thread(target=target, args=args, daemon=True).start()
    sys.exit(0)


if __name__ == "__main__":
    main()
