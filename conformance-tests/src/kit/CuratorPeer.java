// The test kit's Apache Curator client (see peer.rs): one CuratorFramework session, driven
// over a line protocol so that one JVM serves a whole test.
//
//   stdin:  <id> mutex|read|write <path> <wait_ms>   (wait_ms < 0: forever; 0: one attempt)
//           <id> semaphore <path> <wait_ms> <max_leases>
//           <id> release
//   stdout: ready <session id, hex>
//           <id> acquired <lock node path> <czxid>
//           <id> timeout | <id> released | <id> error <message>
//
// semaphore takes one lease of an InterProcessSemaphoreV2 (the lease node is reported);
// mutex is InterProcessMutex; read and write are the two sides of InterProcessReadWriteLock,
// each request a lock object of its own (a contender of its own). Curator ties a hold to the
// thread that acquired it, so every request gets a thread that acquires, then waits for its
// release command and releases. Stdin closing ends the process.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.RetryNTimes;
import org.apache.zookeeper.data.Stat;

public final class CuratorPeer {
    private static final Object OUT = new Object();
    private static final Map<String, LinkedBlockingQueue<String>> HELD = new ConcurrentHashMap<>();

    private static void say(String line) {
        synchronized (OUT) {
            System.out.println(line);
            System.out.flush();
        }
    }

    public static void main(String[] args) throws Exception {
        String connect = args[0];
        int sessionMs = Integer.parseInt(args[1]);
        CuratorFramework client = CuratorFrameworkFactory.builder()
                .connectString(connect)
                .sessionTimeoutMs(sessionMs)
                .connectionTimeoutMs(15000)
                .retryPolicy(new RetryNTimes(3, 200))
                .build();
        client.start();
        if (!client.blockUntilConnected(30, TimeUnit.SECONDS)) {
            say("fatal no ZooKeeper session within 30 s at " + connect);
            System.exit(1);
        }
        long session = client.getZookeeperClient().getZooKeeper().getSessionId();
        say("ready " + Long.toHexString(session));
        // getLockPath is protected; the recipes keep the held node's path there.
        Method lockPath = InterProcessMutex.class.getDeclaredMethod("getLockPath");
        lockPath.setAccessible(true);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            String[] w = line.trim().split(" ");
            if (w.length < 2) {
                continue;
            }
            String id = w[0];
            if (w[1].equals("release")) {
                LinkedBlockingQueue<String> q = HELD.remove(id);
                if (q == null) {
                    say(id + " error not held");
                } else {
                    q.add("release");
                }
                continue;
            }
            if (w[1].equals("semaphore")) {
                InterProcessSemaphoreV2 sem = new InterProcessSemaphoreV2(client, w[2], Integer.parseInt(w[4]));
                String path = w[2];
                long waitMs = Long.parseLong(w[3]);
                Thread t = new Thread(() -> lease(client, sem, path, id, waitMs));
                t.setDaemon(true);
                t.start();
                continue;
            }
            InterProcessMutex lock;
            switch (w[1]) {
                case "mutex":
                    lock = new InterProcessMutex(client, w[2]);
                    break;
                case "read":
                    lock = new InterProcessReadWriteLock(client, w[2]).readLock();
                    break;
                case "write":
                    lock = new InterProcessReadWriteLock(client, w[2]).writeLock();
                    break;
                default:
                    say(id + " error unknown command " + w[1]);
                    continue;
            }
            long waitMs = Long.parseLong(w[3]);
            Thread t = new Thread(() -> hold(client, lock, lockPath, id, waitMs));
            t.setDaemon(true);
            t.start();
        }
        System.exit(0);
    }

    /// Takes a lease of `sem`, reports its node, and returns it when told to.
    private static void lease(CuratorFramework client, InterProcessSemaphoreV2 sem, String path,
                              String id, long waitMs) {
        try {
            Lease lease = waitMs < 0 ? sem.acquire() : sem.acquire(waitMs, TimeUnit.MILLISECONDS);
            if (lease == null) {
                say(id + " timeout");
                return;
            }
            String node = path + "/leases/" + lease.getNodeName();
            Stat stat = client.checkExists().forPath(node);
            LinkedBlockingQueue<String> q = new LinkedBlockingQueue<>();
            HELD.put(id, q);
            say(id + " acquired " + node + " " + (stat == null ? -1 : stat.getCzxid()));
            q.take();
            sem.returnLease(lease);
            say(id + " released");
        } catch (Throwable e) {
            say(id + " error " + String.valueOf(e).replace('\n', ' '));
        }
    }

    /// Acquires `lock`, reports it, and releases it on this thread when told to.
    private static void hold(CuratorFramework client, InterProcessMutex lock, Method lockPath,
                             String id, long waitMs) {
        try {
            boolean got;
            if (waitMs < 0) {
                lock.acquire();
                got = true;
            } else {
                got = lock.acquire(waitMs, TimeUnit.MILLISECONDS);
            }
            if (!got) {
                say(id + " timeout");
                return;
            }
            String path = (String) lockPath.invoke(lock);
            Stat stat = client.checkExists().forPath(path);
            LinkedBlockingQueue<String> q = new LinkedBlockingQueue<>();
            HELD.put(id, q);
            say(id + " acquired " + path + " " + (stat == null ? -1 : stat.getCzxid()));
            q.take();
            lock.release();
            say(id + " released");
        } catch (Throwable e) {
            say(id + " error " + String.valueOf(e).replace('\n', ' '));
        }
    }
}
