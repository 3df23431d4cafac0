# Vendored unchanged from the shared peer scripts (shared/peers/salt_peer.py) so that `make bench-salt`
# runs from a clean clone. Not this project's code: excluded from ruff and mypy (pyproject.toml).
#!/usr/bin/env python3
"""Peer measurement: SaltStack (master + minions over ZeroMQ, minions dial out to the master), on this machine.

Setup (once):
    python3 -m venv "$SALT_PEER_VENV"          # default: <tempdir>/salt-peer/venv
    "$SALT_PEER_VENV/bin/pip" install salt     # 3008.4 was the newest that installed (3008.5 needs certifi>=2026.10.23)
Run (the script re-execs itself under $SALT_PEER_VENV/bin/python if `import salt` fails):
    python3 salt_peer.py [--rounds 3] [--base <tempdir>/salt-peer/run] [--minion-threads] [--pubs 2] [--window 30]

What it does, per round (everything fresh under --base, loopback only, ports 40505/40506):
  starts one salt-master (auto_accept, interface 127.0.0.1, default worker_threads=5) and salt-minions (distinct ids and
  root_dirs) as plain foreground processes via subprocess.Popen, PIDs recorded; then
  c. master RSS/PSS (sum over all master processes) with 0, 1, 10, 50 idle minions connected (before any job ran),
     plus one minion's RSS/PSS (keepalive parent + minion process) and idle CPU (ms/s) of master and minions;
  a. with only m00 connected: 200 sequential `test.echo ['x']` jobs via LocalClient.cmd (call -> return),
     and 200 via LocalClient.cmd_async + a persistent master event-bus subscriber (call -> ret event); p50/p99 ms;
     the same cmd_async path again with 10 minions connected (still one target), with CPU/job of the target minion,
     each non-target minion (Salt publishes every job to all minions; they decrypt and drop it) and the master;
  b. with 10 minions: `test.echo` jobs for --window s, each job targets ONE minion (round-robin), <=64 outstanding
     (cmd_async publisher threads + one event-bus reader thread); jobs/s and CPU-s per job of master, minions
     (incl. reaped per-job child processes via cutime/cstime), and this client, from /proc/PID/stat;
  then stops every process it started by PID (SIGTERM, then SIGKILL for survivors of the recorded process tree).
Needs --max-minions >= 10. One default round takes ~5 min on 2 cores (mostly minion start-up and settling).
Prints a Markdown table (medians over rounds) and one JSON line (`SALT_PEER_JSON {...}`) with per-round values.
--minion-threads sets `multiprocessing: False` on the minions (Salt's default forks one process per job).
"""
import argparse, json, os, shutil, signal, statistics, subprocess, sys, threading, time

import tempfile
VENV = os.environ.get("SALT_PEER_VENV", os.path.join(tempfile.gettempdir(), "salt-peer", "venv"))
try:
    import salt.client, salt.config, salt.utils.event, salt.version  # noqa: E401
except ImportError:
    if os.path.exists(f"{VENV}/bin/python") and os.path.realpath(sys.prefix) != os.path.realpath(VENV):
        os.execv(f"{VENV}/bin/python", [f"{VENV}/bin/python"] + sys.argv)
    raise

PUB_PORT, RET_PORT = 40505, 40506
TICK = os.sysconf("SC_CLK_TCK")
STARTED = []  # (pid, starttime) of every process this script started (roots); trees are derived from them


# ---------------------------------------------------------------- /proc helpers
def procs():
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            s = open(f"/proc/{d}/stat").read()
        except OSError:
            continue
        f = s[s.rfind(")") + 2:].split()
        out[int(d)] = dict(ppid=int(f[1]), cpu=sum(int(x) for x in f[11:15]), start=int(f[19]))
    return out


def tree(root, ps=None):
    ps = ps or procs()
    if root not in ps:
        return []
    kids = {}
    for pid, p in ps.items():
        kids.setdefault(p["ppid"], []).append(pid)
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def cpu_snapshot(roots):
    ps = procs()
    return {pid: (ps[pid]["start"], ps[pid]["cpu"]) for r in roots for pid in tree(r, ps)}


def cpu_delta(before, after):
    """CPU seconds used between two snapshots (utime+stime+cutime+cstime, so reaped children count)."""
    tot = 0
    for pid, (st, c) in after.items():
        b = before.get(pid)
        tot += c - b[1] if b and b[0] == st else c
    return tot / TICK


def mem(pid):
    rss = pss = 0
    try:
        for line in open(f"/proc/{pid}/smaps_rollup"):
            if line.startswith("Rss:"):
                rss = int(line.split()[1])
            elif line.startswith("Pss:"):
                pss = int(line.split()[1])
    except OSError:
        pass
    return rss, pss


def tree_mem_mib(root):
    r = p = 0
    for pid in tree(root):
        a, b = mem(pid)
        r, p = r + a, p + b
    return round(r / 1024, 1), round(p / 1024, 1)


def established_on(port):
    n = 0
    for fn in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            for line in open(fn).readlines()[1:]:
                f = line.split()
                if int(f[1].split(":")[1], 16) == port and f[3] == "01":
                    n += 1
        except OSError:
            pass
    return n


def listening(port):
    for line in open("/proc/net/tcp").readlines()[1:]:
        f = line.split()
        if int(f[1].split(":")[1], 16) == port and f[3] == "0A":
            return True
    return False


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


# ---------------------------------------------------------------- process control
class Cluster:
    def __init__(self, base, minion_threads=False):
        self.base, self.minion_threads = base, minion_threads
        self.master = None
        self.minions = {}  # id -> Popen
        self.mconf = f"{base}/master/conf/master"

    def _popen(self, argv, log):
        p = subprocess.Popen(argv, stdout=open(log, "ab"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        STARTED.append((p.pid, procs().get(p.pid, {}).get("start")))
        return p

    def start_master(self):
        d = f"{self.base}/master"
        os.makedirs(f"{d}/conf", exist_ok=True)
        open(self.mconf, "w").write(
            f"root_dir: {d}\npki_dir: {d}/pki\ncachedir: {d}/cache\nsock_dir: {d}/sock\n"
            f"log_file: {d}/master.log\npidfile: {d}/master.pid\nuser: root\n"
            f"interface: 127.0.0.1\npublish_port: {PUB_PORT}\nret_port: {RET_PORT}\nauto_accept: True\n")
        self.master = self._popen([f"{VENV}/bin/salt-master", "-c", f"{d}/conf"], f"{d}/stdout.log")
        t0 = time.time()
        while time.time() - t0 < 120:
            if (os.path.exists(f"{d}/sock/publish_pull.ipc") and os.path.exists(f"{d}/cache/.root_key")
                    and listening(PUB_PORT) and listening(RET_PORT)):
                time.sleep(2)
                return time.time() - t0
            if self.master.poll() is not None:
                raise RuntimeError("salt-master exited; see " + d)
            time.sleep(0.2)
        raise RuntimeError("salt-master not ready in 120 s")

    def opts(self):
        return salt.config.client_config(self.mconf)

    def start_minions(self, ids, timeout=600):
        """Start minions and wait for their salt/minion/<id>/start events and their publish connections."""
        ev = salt.utils.event.get_event("master", opts=self.opts(), listen=True)
        t0 = time.time()
        for mid in ids:
            d = f"{self.base}/{mid}"
            os.makedirs(f"{d}/conf", exist_ok=True)
            open(f"{d}/conf/minion", "w").write(
                f"id: {mid}\nmaster: 127.0.0.1\nmaster_port: {RET_PORT}\npublish_port: {PUB_PORT}\n"
                f"root_dir: {d}\npki_dir: {d}/pki\ncachedir: {d}/cache\nsock_dir: {d}/sock\n"
                f"log_file: {d}/minion.log\npidfile: {d}/minion.pid\nuser: root\n"
                f"enable_fqdns_grains: False\n"  # no reverse-DNS lookups of non-loopback addresses
                + ("multiprocessing: False\n" if self.minion_threads else ""))
            self.minions[mid] = self._popen([f"{VENV}/bin/salt-minion", "-c", f"{d}/conf"], f"{d}/stdout.log")
        pending = set(ids)
        while pending and time.time() - t0 < timeout:
            e = ev.get_event(wait=1, tag="salt/minion/", full=True)
            if e and e["tag"].endswith("/start"):
                pending.discard(e["tag"].split("/")[2])
        ev.destroy()
        if pending:
            raise RuntimeError(f"minions did not start: {sorted(pending)[:5]}...")
        want = len(self.minions)
        while established_on(PUB_PORT) < want and time.time() - t0 < timeout:
            time.sleep(0.5)
        return time.time() - t0

    def settle(self, max_s=60):
        """Wait until master+minions are idle (< 0.05 + 0.01*minions CPU-s per s; idle minions run a 1 s
        scheduler loop), then return idle CPU use in ms per s: (master, all minions) over 5 s."""
        roots = [self.master.pid] + [p.pid for p in self.minions.values()]
        quiet = 0.05 + 0.01 * len(self.minions)
        t0 = time.time()
        while time.time() - t0 < max_s:
            a = cpu_snapshot(roots)
            time.sleep(2)
            if cpu_delta(a, cpu_snapshot(roots)) / 2 < quiet:
                break
        else:
            print(f"  (not idle after {max_s}s)", file=sys.stderr)
        mr, nr = [self.master.pid], [p.pid for p in self.minions.values()]
        a, b = cpu_snapshot(mr), cpu_snapshot(nr)
        time.sleep(5)
        return round(cpu_delta(a, cpu_snapshot(mr)) / 5 * 1000, 1), round(cpu_delta(b, cpu_snapshot(nr)) / 5 * 1000, 1)

    def stop_minions(self, ids):
        self._stop([self.minions.pop(m) for m in ids])

    def stop_all(self):
        self._stop(list(self.minions.values()))
        self.minions = {}
        if self.master:
            self._stop([self.master], grace=30)
            self.master = None

    @staticmethod
    def _stop(popens, grace=20):
        ps = procs()
        victims = {pid: ps[pid]["start"] for p in popens for pid in tree(p.pid, ps)}
        for p in popens:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        t0 = time.time()
        for p in popens:
            try:
                p.wait(timeout=max(0.1, grace - (time.time() - t0)))
            except subprocess.TimeoutExpired:
                pass
        time.sleep(0.5)
        ps = procs()
        for pid, st in victims.items():  # survivors of the recorded trees (same pid AND same start time)
            if pid in ps and ps[pid]["start"] == st:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in popens:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


# ---------------------------------------------------------------- measurements
def lat_cmd(opts, tgt, n, warm=20):
    lc = salt.client.LocalClient(mopts=opts)
    ts = []
    for i in range(warm + n):
        t = time.perf_counter()
        r = lc.cmd(tgt, "test.echo", ["x"], timeout=10)
        dt = time.perf_counter() - t
        assert r == {tgt: "x"}, r
        if i >= warm:
            ts.append(dt * 1000)
    lc.destroy()
    return ts


def lat_async(opts, tgt, n, warm=20):
    lc = salt.client.LocalClient(mopts=opts)
    ev = salt.utils.event.get_event("master", opts=opts, listen=True)
    ts, pubs = [], []
    for i in range(warm + n):
        t = time.perf_counter()
        jid = lc.cmd_async(tgt, "test.echo", ["x"])
        tp = time.perf_counter()
        e = ev.get_event(wait=10, tag=f"salt/job/{jid}/ret/", full=True)
        dt = time.perf_counter() - t
        assert e and e["data"]["return"] == "x", e
        if i >= warm:
            ts.append(dt * 1000)
            pubs.append((tp - t) * 1000)
    ev.destroy()
    lc.destroy()
    return ts, pubs


def throughput(cl, ids, window=30.0, depth=64, pubs=2):
    opts = cl.opts()
    # warm every minion (module loading) before the window
    lc = salt.client.LocalClient(mopts=opts)
    for mid in ids:
        for _ in range(3):
            assert lc.cmd(mid, "test.echo", ["x"], timeout=10) == {mid: "x"}
    lc.destroy()

    sem = threading.BoundedSemaphore(depth)
    lock = threading.Lock()
    outstanding, early, lats = {}, {}, []
    st = dict(pub=0, done=0, done_in_window=0, errors=0, stop_pub=False, reader_ready=False, end=None)
    counter = [0]

    def reader():
        ev = salt.utils.event.get_event("master", opts=opts, listen=True)
        ev.connect_pub()
        st["reader_ready"] = True
        while True:
            e = ev.get_event(wait=0.2, tag="salt/job/", full=True)
            now = time.perf_counter()
            if e and "/ret/" in e["tag"]:
                jid = e["tag"].split("/")[2]
                with lock:
                    t0 = outstanding.pop(jid, None)
                    if t0 is None:
                        early[jid] = now
                        continue
                    lats.append(now - t0)
                    st["done"] += 1
                    if st["end"] and now <= st["end"]:
                        st["done_in_window"] += 1
                sem.release()
            if st["stop_pub"] and not outstanding and st["pubs_done"] == pubs:
                break
            if st["stop_pub"] and time.perf_counter() > st["end"] + 30:
                break
        ev.destroy()

    def publisher():
        lc = salt.client.LocalClient(mopts=opts)
        while True:
            if not sem.acquire(timeout=0.5):
                if time.perf_counter() > st["end"] + 30:
                    break
                continue
            if time.perf_counter() >= st["end"]:
                sem.release()
                break
            with lock:
                i = counter[0]
                counter[0] += 1
            t0 = time.perf_counter()
            try:
                jid = lc.cmd_async(ids[i % len(ids)], "test.echo", ["x"])
            except Exception:  # noqa: BLE001
                jid = 0
            if not jid:
                st["errors"] += 1
                sem.release()
                continue
            with lock:
                st["pub"] += 1
                if jid in early:
                    now = early.pop(jid)
                    lats.append(now - t0)
                    st["done"] += 1
                    if now <= st["end"]:
                        st["done_in_window"] += 1
                    sem.release()
                else:
                    outstanding[jid] = t0
        with lock:
            st["pubs_done"] += 1
        lc.destroy()

    st["pubs_done"] = 0
    rt = threading.Thread(target=reader)
    rt.start()
    while not st["reader_ready"]:
        time.sleep(0.05)
    time.sleep(0.5)
    roots_m = [cl.master.pid]
    roots_n = [cl.minions[m].pid for m in ids]
    c0m, c0n, c0c, s0 = cpu_snapshot(roots_m), cpu_snapshot(roots_n), os.times(), open("/proc/stat").readline()
    t_start = time.perf_counter()
    st["end"] = t_start + window
    pts = [threading.Thread(target=publisher) for _ in range(pubs)]
    for t in pts:
        t.start()
    for t in pts:
        t.join()
    st["stop_pub"] = True
    rt.join()
    t_drained = time.perf_counter()
    time.sleep(2)  # let minions reap per-job children so their CPU lands in cutime/cstime
    c1m, c1n, c1c, s1 = cpu_snapshot(roots_m), cpu_snapshot(roots_n), os.times(), open("/proc/stat").readline()
    busy = lambda s: (lambda f: (sum(f[:8]) - f[3] - f[4]))(list(map(int, s.split()[1:])))  # noqa: E731
    done = st["done"]
    res = dict(
        jobs_per_s=round(st["done_in_window"] / window, 1),
        jobs_done_total=done, published=st["pub"], lost=st["pub"] - done, errors=st["errors"],
        drain_s=round(t_drained - st["end"], 2),
        lat_ms_p50=round(pct(lats, 50) * 1000, 1), lat_ms_p99=round(pct(lats, 99) * 1000, 1),
        master_cpu_ms_per_job=round(cpu_delta(c0m, c1m) / done * 1000, 2),
        minions_cpu_ms_per_job=round(cpu_delta(c0n, c1n) / done * 1000, 2),
        client_cpu_ms_per_job=round(((c1c.user + c1c.system) - (c0c.user + c0c.system)) / done * 1000, 2),
        machine_busy_cpu_s=round((busy(s1) - busy(s0)) / TICK, 1),
        wall_s=round(time.perf_counter() - t_start, 1),
        depth=depth, publisher_threads=pubs)
    return res


def one_round(args, r):
    base = args.base
    if os.path.isdir(base):
        shutil.rmtree(base)
    os.makedirs(base)
    cl = Cluster(base, args.minion_threads)
    out = {}
    try:
        out["master_start_s"] = round(cl.start_master(), 1)
        cl.settle()
        out["c_master_mib_0"] = tree_mem_mib(cl.master.pid)
        ids = [f"m{i:02d}" for i in range(args.max_minions)]
        steps = sorted({1, min(10, args.max_minions), args.max_minions})
        for n, prev in zip(steps, [0] + steps[:-1]):
            t = cl.start_minions(ids[prev:n])
            out[f"idle_cpu_ms_per_s_master_minions_{n}"] = cl.settle()
            out[f"c_master_mib_{n}"] = tree_mem_mib(cl.master.pid)
            out[f"minions_start_s_{n}"] = round(t, 1)
            print(f"  round {r}: {n} minions up ({t:.1f}s); master RSS/PSS MiB {out[f'c_master_mib_{n}']}", file=sys.stderr)
            if n == 1:
                out["c_minion_mib_1"] = tree_mem_mib(cl.minions["m00"].pid)
            if n == args.max_minions:
                per = [tree_mem_mib(cl.minions[m].pid) for m in ids[:n]]
                out[f"c_minion_mib_{n}_median"] = (statistics.median(p[0] for p in per), statistics.median(p[1] for p in per))
                ps = procs()
                out["minion_procs_each"] = len(tree(cl.minions["m00"].pid, ps))
                out["master_procs"] = len(tree(cl.master.pid, ps))
        cl.stop_minions(ids[1:])
        time.sleep(3)
        opts = cl.opts()
        t = lat_cmd(opts, "m00", args.n)
        out["a_cmd_ms"] = (round(pct(t, 50), 1), round(pct(t, 99), 1))
        t, p = lat_async(opts, "m00", args.n)
        out["a_async_ms"] = (round(pct(t, 50), 1), round(pct(t, 99), 1))
        out["a_async_pub_call_ms"] = (round(pct(p, 50), 1), round(pct(p, 99), 1))
        print(f"  round {r}: a cmd {out['a_cmd_ms']} async {out['a_async_ms']}", file=sys.stderr)
        cl.start_minions(ids[1:10])
        cl.settle()
        tgt_root, others = [cl.minions["m00"].pid], [cl.minions[m].pid for m in ids[1:10]]
        c0t, c0o, c0m = cpu_snapshot(tgt_root), cpu_snapshot(others), cpu_snapshot([cl.master.pid])
        t, p = lat_async(opts, "m00", args.n, warm=0)
        time.sleep(2)
        c1t, c1o, c1m = cpu_snapshot(tgt_root), cpu_snapshot(others), cpu_snapshot([cl.master.pid])
        out["a_async_10connected_ms"] = (round(pct(t, 50), 1), round(pct(t, 99), 1))
        # CPU per job with 10 connected, one target: the target minion, each non-target minion (broadcast cost), master
        out["a10_cpu_ms_per_job"] = dict(target_minion=round(cpu_delta(c0t, c1t) / args.n * 1000, 2),
                                         each_nontarget_minion=round(cpu_delta(c0o, c1o) / args.n / 9 * 1000, 2),
                                         master=round(cpu_delta(c0m, c1m) / args.n * 1000, 2))
        out["b"] = throughput(cl, ids[:10], args.window, 64, args.pubs)
        print(f"  round {r}: b {out['b']}", file=sys.stderr)
    finally:
        cl.stop_all()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--base", default=os.path.join(tempfile.gettempdir(), "salt-peer", "run"))
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--window", type=float, default=30.0)
    ap.add_argument("--pubs", type=int, default=2, help="publisher threads for b")
    ap.add_argument("--max-minions", type=int, default=50)
    ap.add_argument("--minion-threads", action="store_true", help="minion multiprocessing: False")
    args = ap.parse_args()

    def bye(*_):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, bye)

    rounds = []
    for r in range(args.rounds):
        rounds.append(one_round(args, r))
    # leftover check: nothing we started may survive
    ps = procs()
    left = [pid for pid, st in STARTED if pid in ps and ps[pid]["start"] == st]
    med = lambda f: statistics.median(f(x) for x in rounds)  # noqa: E731
    M = args.max_minions
    rows = [
        ("a. cmd() latency, 1 minion, p50 / p99 ms", f"{med(lambda x: x['a_cmd_ms'][0])} / {med(lambda x: x['a_cmd_ms'][1])}"),
        ("a. cmd_async + event bus, p50 / p99 ms", f"{med(lambda x: x['a_async_ms'][0])} / {med(lambda x: x['a_async_ms'][1])}"),
        ("   of which cmd_async() call (publish RTT), p50 ms", f"{med(lambda x: x['a_async_pub_call_ms'][0])}"),
        ("a'. cmd_async + event, 10 minions connected, p50 / p99 ms",
         f"{med(lambda x: x['a_async_10connected_ms'][0])} / {med(lambda x: x['a_async_10connected_ms'][1])}"),
        ("a'. CPU ms/job: target minion / each non-target minion / master",
         f"{med(lambda x: x['a10_cpu_ms_per_job']['target_minion'])} / {med(lambda x: x['a10_cpu_ms_per_job']['each_nontarget_minion'])}"
         f" / {med(lambda x: x['a10_cpu_ms_per_job']['master'])}"),
        ("b. throughput, 10 minions, 1 target/job, <=64 outstanding, jobs/s", f"{med(lambda x: x['b']['jobs_per_s'])}"),
        ("b. latency under load p50 / p99 ms", f"{med(lambda x: x['b']['lat_ms_p50'])} / {med(lambda x: x['b']['lat_ms_p99'])}"),
        ("b. master CPU ms/job", f"{med(lambda x: x['b']['master_cpu_ms_per_job'])}"),
        ("b. minions CPU ms/job (all 10, incl. per-job children)", f"{med(lambda x: x['b']['minions_cpu_ms_per_job'])}"),
        ("b. client (LocalClient) CPU ms/job", f"{med(lambda x: x['b']['client_cpu_ms_per_job'])}"),
    ] + [(f"c. master RSS / PSS MiB, {n} minions", f"{med(lambda x: x[f'c_master_mib_{n}'][0])} / {med(lambda x: x[f'c_master_mib_{n}'][1])}")
         for n in sorted({0, 1, min(10, M), M})] + [
        (f"c. idle CPU ms/s at {M} minions: master / all minions",
         f"{med(lambda x: x[f'idle_cpu_ms_per_s_master_minions_{M}'][0])} / {med(lambda x: x[f'idle_cpu_ms_per_s_master_minions_{M}'][1])}")] + [
        ("c. one minion RSS / PSS MiB (keepalive parent + minion)",
         f"{med(lambda x: x[f'c_minion_mib_{M}_median'][0])} / {med(lambda x: x[f'c_minion_mib_{M}_median'][1])}"),
    ]
    print(f"\n### Salt {salt.version.__version__} peer, {args.rounds} round(s), medians"
          f"{' (minion multiprocessing: False)' if args.minion_threads else ''}\n")
    print("| measure | value |\n|---|---|")
    for k, v in rows:
        print(f"| {k} | {v} |")
    print("\nSALT_PEER_JSON " + json.dumps(dict(salt=salt.version.__version__, minion_threads=args.minion_threads,
                                                 rounds=rounds, leftover_pids=left)))


if __name__ == "__main__":
    try:
        main()
    finally:
        # belt and braces: kill any survivor of what we started (same pid + same start time only)
        ps = procs()
        for pid, st in STARTED:
            if pid in ps and ps[pid]["start"] == st:
                for p in tree(pid, ps):
                    try:
                        os.kill(p, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
