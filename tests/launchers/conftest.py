"""Two "hosts" for the launcher tests: network namespaces joined by a veth
pair, host0 at 10.0.0.1 and host1 at 10.0.0.2 (the addresses the samples
name), each with its own host name (unshare --uts) and a Debian-style
/etc/hosts (ip netns exec bind-mounts /etc/netns/NS/hosts; the daemons get
it by a bind mount in their own mount namespace): a host's own name is
127.0.1.1 there, the other's is its address, as are the Kubernetes pod
names the manifests use.

Marker "full": the cases only make test-launchers runs; make test runs
the others (-m "not full")."""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
SAMPLES = os.path.join(ROOT, "docs", "samples", "launchers")
PROGRAMS = os.path.join(HERE, "programs")
VENV_BIN = os.path.dirname(sys.executable)
IFNAME = "nxl0"
NAMES = ["host0", "host1"]
ADDRS = ["10.0.0.1", "10.0.0.2"]
POD_NAMES = "train-0.train ddp-0.ddp"


def pytest_configure(config):
    config.addinivalue_line("markers", "full: only in the full form (make test-launchers)")


class Hosts:
    def __init__(self, tmp):
        pid = os.getpid()
        self.ns = [f"nxl{pid}a", f"nxl{pid}b"]
        self.names, self.addrs = NAMES, ADDRS
        self.tmp = tmp
        self.hostsfiles = []

    def ip(self, *a):
        subprocess.run(["ip", *a], check=True, capture_output=True)

    def up(self):
        for ns in self.ns:
            self.ip("netns", "add", ns)
        pid = os.getpid() % 100000
        tmp = [f"nxlv{pid}a", f"nxlv{pid}b"]
        self.ip("link", "add", tmp[0], "netns", self.ns[0], "type", "veth", "peer", "name", tmp[1], "netns", self.ns[1])
        for i, ns in enumerate(self.ns):
            self.ip("-n", ns, "link", "set", tmp[i], "name", IFNAME)
            self.ip("-n", ns, "addr", "add", self.addrs[i] + "/24", "dev", IFNAME)
            self.ip("-n", ns, "link", "set", IFNAME, "up")
            self.ip("-n", ns, "link", "set", "lo", "up")
            # The pods' own names too, as Kubernetes writes a pod's hosts
            # file (its address, then its host name): torchrun's c10d
            # rendezvous finds it hosts the store by resolving both.
            text = (f"127.0.0.1 localhost\n127.0.1.1 {self.names[i]}\n{self.addrs[1 - i]} {self.names[1 - i]}\n"
                    + f"{self.addrs[0]} {POD_NAMES} ddp-0\n{self.addrs[1]} ddp-1\n")
            d = f"/etc/netns/{ns}"
            os.makedirs(d, exist_ok=True)
            with open(f"{d}/hosts", "w") as f:
                f.write(text)
            self.hostsfiles.append(f"{d}/hosts")

    def down(self):
        for ns in self.ns:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)

    def argv(self, i, argv, hostname=None):
        """argv on host i, under its host name (or hostname, as a pod's)
        and hosts file."""
        return ["ip", "netns", "exec", self.ns[i], "unshare", "--uts", "sh", "-c",
                f'hostname {hostname or self.names[i]} && exec "$@"', "sh", *argv]

    def daemon_argv(self, i, argv):
        """argv on host i outside ip netns exec (which remounts /sys, where
        slurmd wants its cgroup file system): nsenter into the network
        namespace, a mount namespace of its own for the hosts file."""
        return ["nsenter", f"--net=/run/netns/{self.ns[i]}", "unshare", "--mount", "--uts", "sh", "-c",
                f'mount --bind {self.hostsfiles[i]} /etc/hosts && hostname {self.names[i]} && exec "$@"', "sh", *argv]

    def popen(self, i, argv, env, cwd, daemon=False, out=None, hostname=None):
        cmd = self.daemon_argv(i, argv) if daemon else self.argv(i, argv, hostname)
        return subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out or subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)


def kill_tree(p):
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(5)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


@pytest.fixture(scope="session")
def hosts(tmp_path_factory):
    assert os.path.isdir(SAMPLES), f"{SAMPLES} is missing: the launcher samples are what these tests run"
    assert os.path.isdir(PROGRAMS), f"{PROGRAMS} is missing"
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("unshare") or not shutil.which("nsenter"):
        pytest.skip("the launcher tests need root, iproute2's ip, unshare and nsenter to make network namespaces")
    h = Hosts(tmp_path_factory.mktemp("hosts"))
    try:
        h.up()
    except subprocess.CalledProcessError as e:
        h.down()
        pytest.skip(f"cannot make network namespaces here: {e.stderr.decode().strip()}")
    yield h
    h.down()


def base_env(**kw):
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("NEXAR_", "MASTER_", "TORCHELASTIC_", "SLURM_", "OMPI_", "PMIX_"))
         and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    e["PATH"] = os.pathsep.join([os.path.join(ROOT, "build"), VENV_BIN, e.get("PATH", "/usr/bin:/bin")])
    # The machine these run on is shared: a process stalled for seconds
    # under load must not be declared dead (failure detection is tested
    # elsewhere: docs/fault-tolerance.md).
    e.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME=IFNAME, NEXAR_HEARTBEAT_TIMEOUT="60s")
    e.update(kw)
    return e


def wait_all(procs, timeout):
    """Outputs and return codes of procs; any still running after timeout
    is killed (return code None)."""
    deadline = time.monotonic() + timeout
    outs, rcs = [], []
    for p in procs:
        try:
            out = p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0]
            rcs.append(p.returncode)
        except subprocess.TimeoutExpired:
            for q in procs:
                kill_tree(q)
            out = (p.communicate()[0] or "") + "\n<<killed: still running>>"
            rcs.append(None)
        outs.append(out or "")
    return rcs, outs
