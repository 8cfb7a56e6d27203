"""The torch backend's rendezvous across two "hosts": network namespaces
joined by a veth pair, each with its own host name (unshare --uts) and a
Debian-style /etc/hosts (ip netns exec mounts /etc/netns/NS/hosts), where a
host's own name resolves to 127.0.1.1 and the other's to its address. That
is the setup in which rank 0 used to publish a loopback seed and the other
host waited out the group's timeout (30 minutes by default).

Each init method (env://, tcp://, a TCPStore passed in, gloo's tcp:// then
new_group, torchrun's c10d rendezvous) forms the group across the hosts
with no NEXAR_* variable; a loopback NEXAR_ADVERTISE_ADDR, and a plain
nexar job whose seed is named by a host name that is loopback on its host,
fail at once naming the address and NEXAR_ADVERTISE_ADDR, long before their
timeouts. And torchrun --max-restarts=1 recovers from a rank that died
before init_process_group while the others were inside it (one host).

Needs root (namespaces) and iproute2; skips with a message otherwise."""

import os
import secrets
import shutil
import signal
import subprocess
import sys
import time

import pytest

from launch import free_port

torch = pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "workers", "rdv_worker.py")
GROUP_TIMEOUT = 900  # s: every case here must end long before it
CASE_TIMEOUT = 420  # s: what a case may take on a loaded 2-core machine
IFNAME = "nxrdv0"

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("unshare"),
    reason="needs root, iproute2's ip and util-linux's unshare to make network namespaces")


class Hosts:
    """Namespaces hostA and hostB, 10.233.K.1 and .2 on a veth pair."""

    def __init__(self):
        pid = os.getpid()
        k = pid % 200 + 20
        self.ns = [f"nxrdv{pid}a", f"nxrdv{pid}b"]
        self.names = ["hostA", "hostB"]
        self.addrs = [f"10.233.{k}.1", f"10.233.{k}.2"]

    def ip(self, *a):
        subprocess.run(["ip", *a], check=True, capture_output=True)

    def up(self):
        for ns in self.ns:
            self.ip("netns", "add", ns)
        tmp = [f"nxrv{os.getpid() % 100000}a", f"nxrv{os.getpid() % 100000}b"]
        self.ip("link", "add", tmp[0], "netns", self.ns[0], "type", "veth", "peer", "name", tmp[1], "netns", self.ns[1])
        for i, ns in enumerate(self.ns):
            self.ip("-n", ns, "link", "set", tmp[i], "name", IFNAME)
            self.ip("-n", ns, "addr", "add", self.addrs[i] + "/24", "dev", IFNAME)
            self.ip("-n", ns, "link", "set", IFNAME, "up")
            self.ip("-n", ns, "link", "set", "lo", "up")
            # Debian's default: this host's own name on 127.0.1.1
            d = f"/etc/netns/{ns}"
            os.makedirs(d, exist_ok=True)
            with open(f"{d}/hosts", "w") as f:
                f.write(f"127.0.0.1 localhost\n127.0.1.1 {self.names[i]}\n{self.addrs[1 - i]} {self.names[1 - i]}\n")

    def down(self):
        for ns in self.ns:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)

    def popen(self, i, argv, env):
        """argv on host i, with that host's name."""
        cmd = ["ip", "netns", "exec", self.ns[i], "unshare", "--uts", "sh", "-c",
               f'hostname {self.names[i]} && exec "$@"', "sh", *argv]
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=HERE,
                                start_new_session=True)


@pytest.fixture(scope="module")
def hosts():
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("unshare"):
        pytest.skip("needs root, iproute2's ip and util-linux's unshare to make network namespaces")
    h = Hosts()
    try:
        h.up()
    except subprocess.CalledProcessError as e:
        h.down()
        pytest.skip(f"cannot make network namespaces here: {e.stderr.decode().strip()}")
    yield h
    h.down()


def base_env(**kw):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("NEXAR_", "MASTER_", "TORCHELASTIC_"))}
    e.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", RDV_TIMEOUT=str(GROUP_TIMEOUT), GLOO_SOCKET_IFNAME=IFNAME)
    e.update(kw)
    return e


def run_both(hosts, argvs, envs):
    """Start argvs[i] on host i at once; (return codes, outputs). A process
    still running after CASE_TIMEOUT is killed (return code None)."""
    procs = [hosts.popen(i, argvs[i], envs[i]) for i in range(2)]
    deadline = time.monotonic() + CASE_TIMEOUT
    outs, rcs = ["", ""], [None, None]
    for i, p in enumerate(procs):
        try:
            outs[i] = p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0]
            rcs[i] = p.returncode
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    os.killpg(q.pid, signal.SIGKILL)  # torchrun's workers too
            outs[i] = (p.communicate()[0] or "") + "\n<<killed: still running>>"
    return rcs, outs


def show(rcs, outs):
    return "\n".join(f"----- {n} (rc={rc}) -----\n{o[-4000:]}" for n, rc, o in zip(("hostA", "hostB"), rcs, outs))


@needs_root
@pytest.mark.parametrize("method", ["env", "tcp", "store", "gloo-tcp-new-group"])
def test_init_method_across_hosts(hosts, method):
    """Rank 0 on hostA, rank 1 on hostB, the store named hostA (127.0.1.1 on
    hostA itself): the group forms with no NEXAR_* variable."""
    port = free_port()
    envs = [base_env(RANK=str(r), WORLD_SIZE="2", RDV_HOST="hostA", RDV_PORT=str(port),
                     MASTER_ADDR="hostA", MASTER_PORT=str(port)) for r in range(2)]
    rcs, outs = run_both(hosts, [[sys.executable, WORKER, method]] * 2, envs)
    assert rcs == [0, 0], show(rcs, outs)
    for r in range(2):
        assert f"rank {r}: {method} sum 3" in outs[r], show(rcs, outs)


@needs_root
def test_torchrun_c10d_across_hosts(hosts):
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    if torchrun is None:
        pytest.skip("torchrun is not installed next to this Python")
    port = free_port()
    argv = [torchrun, "--nnodes=2", "--nproc-per-node=1", "--max-restarts=0", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=hostA:{port}", f"--rdzv-id=rdv{port}", WORKER, "torchrun"]
    rcs, outs = run_both(hosts, [argv, argv], [base_env(), base_env()])
    assert rcs == [0, 0], show(rcs, outs)
    assert "torchrun sum 3" in outs[0] and "torchrun sum 3" in outs[1], show(rcs, outs)


@needs_root
def test_loopback_advertise_fails_at_once(hosts):
    """NEXAR_ADVERTISE_ADDR=127.0.0.1 on rank 0 while rank 1 is on the
    other host: both fail naming the address and the variable, instead of
    waiting out the group's timeout."""
    port = free_port()
    envs = [base_env(RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="hostA", MASTER_PORT=str(port)) for r in range(2)]
    envs[0]["NEXAR_ADVERTISE_ADDR"] = "127.0.0.1"
    start = time.monotonic()
    rcs, outs = run_both(hosts, [[sys.executable, WORKER, "env"]] * 2, envs)
    took = time.monotonic() - start
    assert None not in rcs and rcs[0] != 0 and rcs[1] != 0, show(rcs, outs)
    assert took < GROUP_TIMEOUT, took  # it did not wait for the timeout
    for o in outs:
        assert "127.0.0.1" in o and "NEXAR_ADVERTISE_ADDR" in o, show(rcs, outs)


@needs_root
def test_plain_job_with_a_loopback_seed_name_fails_at_once(hosts):
    """nexar.init() on both hosts, NEXAR_SEED=hostA:PORT (127.0.1.1 on
    hostA): hostA's rank advertises loopback; the seed refuses the job at
    once, naming the address and NEXAR_ADVERTISE_ADDR, instead of a
    formation that waits out the connect timeout."""
    port = free_port()
    token = secrets.token_hex(16)
    prog = "import nexar\nwith nexar.init() as c:\n    print('formed', c.rank, flush=True)\n"
    envs = [base_env(NEXAR_RANK=str(r), NEXAR_WORLD_SIZE="2", NEXAR_SEED=f"hostA:{port}", NEXAR_TOKEN=token,
                     NEXAR_CONNECT_TIMEOUT=f"{GROUP_TIMEOUT}s") for r in range(2)]
    rcs, outs = run_both(hosts, [[sys.executable, "-c", prog]] * 2, envs)
    assert None not in rcs and rcs[0] != 0 and rcs[1] != 0, show(rcs, outs)
    for o in outs:
        assert "advertises 127." in o and "NEXAR_ADVERTISE_ADDR" in o, show(rcs, outs)


def test_torchelastic_restart_after_an_early_death(tmp_path):
    """torchrun --max-restarts=1, 3 ranks: on attempt 0 rank 2 exits before
    init_process_group while ranks 0 and 1 are inside it. The restart must
    complete (it used to hang: the join counter was not per attempt)."""
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    if torchrun is None:
        pytest.skip("torchrun is not installed next to this Python")
    from datetime import timedelta

    import torch.distributed as dist

    marks = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=120))
    env = base_env(ELASTIC_MARK_PORT=str(marks.port), RDV_TIMEOUT="120")
    argv = [torchrun, "--nnodes=1", "--nproc-per-node=3", "--max-restarts=1", "--monitor-interval=0.5",
            "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0", os.path.join(HERE, "workers", "elastic_early_worker.py")]
    p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         cwd=str(tmp_path), start_new_session=True)
    try:
        out = p.communicate(timeout=CASE_TIMEOUT)[0]
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # torchrun and its workers
        out = p.communicate()[0] + "\n<<killed: the restarted job hung>>"
    assert "rank 2: attempt 0: exiting before init" in out, out[-6000:]
    assert p.returncode == 0, out[-6000:]
    for r in range(3):
        assert f"rank {r}: attempt 1 sum 6" in out, out[-6000:]
