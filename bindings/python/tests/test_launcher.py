"""nexar._launcher: launcher variables in their documented order, Slurm's
hostlist and tasks-per-node forms, the per-job seed port and the loopback
rule, from environment dicts (no launcher runs here; tests/launchers runs
the real ones)."""

import pytest

from nexar import _launcher as L

NEVER = lambda host: False  # noqa: E731 - the resolver: nothing is loopback
ALWAYS = lambda host: True  # noqa: E731


@pytest.mark.parametrize("expr,want", [
    ("", []),
    ("vm", ["vm"]),
    ("node[01-03,7],gpu5", ["node01", "node02", "node03", "node7", "gpu5"]),
    ("node[1-3]", ["node1", "node2", "node3"]),
    ("node[08-11]", ["node08", "node09", "node10", "node11"]),
    ("n[9-10]x", ["n9x", "n10x"]),
    ("a[1-2]b[3-4]", ["a1b3", "a1b4", "a2b3", "a2b4"]),
    ("hostA,hostB", ["hostA", "hostB"]),
    ("r[1-2]-n[0-1],login", ["r1-n0", "r1-n1", "r2-n0", "r2-n1", "login"]),
    ("c[007]", ["c007"]),
    ("x-1.example.org,y[2].example.org", ["x-1.example.org", "y2.example.org"]),
])
def test_expand_hostlist(expr, want):
    assert L.expand_hostlist(expr) == want


@pytest.mark.parametrize("bad", ["node[1-3", "node1-3]", "node[3-1]", "node[a-b]", "node[]", "node[1,,2]"])
def test_expand_hostlist_malformed(bad):
    with pytest.raises(ValueError):
        L.expand_hostlist(bad)


@pytest.mark.parametrize("expr,want", [
    ("4", [4]), ("2(x3),1", [2, 2, 2, 1]), ("1,3(x2)", [1, 3, 3]), (" 2(x2) ", [2, 2]),
])
def test_expand_tasks_per_node(expr, want):
    assert L.expand_tasks_per_node(expr) == want


@pytest.mark.parametrize("bad", ["", "x", "2(3)", "2(x)", "2,,1"])
def test_expand_tasks_per_node_malformed(bad):
    with pytest.raises(ValueError):
        L.expand_tasks_per_node(bad)


def test_job_port_range_and_spread():
    ports = {L.job_port(f"slurm:{j}.0") for j in range(2000)}
    assert all(L.PORT_BASE <= p < L.PORT_BASE + L.PORT_SPAN for p in ports)
    assert len(ports) > 1800  # spread, not a constant
    assert L.job_port("slurm:17.0") == L.job_port("slurm:17.0")
    assert L.job_port("slurm:17.0") != L.job_port("slurm:18.0")
    assert L.job_port("slurm:17.0") != L.job_port("slurm:17.1")


SLURM = {
    "SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_STEP_NODELIST": "host[1-2]",
    "SLURM_JOB_NODELIST": "host[0-2]", "SLURM_JOB_ID": "17", "SLURM_STEP_ID": "0",
}
OMPI = {
    "OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_MCA_ess_base_jobid": "778633217", "OMPI_MCA_orte_num_nodes": "2",
    "OMPI_MCA_orte_hnp_uri": "778633216.0;tcp://127.0.0.1,10.77.0.1,192.0.2.2:56865;tcp6://[fd00::2]:54851",
    "PMIX_RANK": "2", "PMIX_NAMESPACE": "778633217",
}
TORCHRUN = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
            "MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "29500"}


def det(env, **kw):
    kw.setdefault("loopback", NEVER)
    kw.setdefault("nexar_seed", "")
    return L.detect(env, **kw)


def test_slurm():
    i = det(SLURM)
    assert (i.name, i.rank, i.world_size, i.local_rank, i.local_world_size) == ("slurm", 3, 4, 1, 2)
    assert i.seed_host == "host1"  # the step's first host, not the job's
    assert i.seed_port == L.job_port("slurm:17.0")
    assert i.spans_hosts
    assert i.sources["rank"] == "SLURM_PROCID" and i.sources["seed"].startswith("SLURM_STEP_NODELIST")


def test_slurm_batch_script_is_no_task():
    # sbatch's script (no srun) has SLURM_PROCID=0 and the job's SLURM_NTASKS
    # but no step: one process, not rank 0 of 4 waiting for the others.
    batch = {k: v for k, v in SLURM.items() if k not in ("SLURM_STEP_ID",)}
    i = det(batch)
    assert (i.name, i.rank, i.world_size, i.seed) == ("none", None, None, None)
    assert det(dict(batch, SLURM_STEPID="0")).name == "slurm"


def test_slurm_job_nodelist_and_tasks_forms():
    env = {k: v for k, v in SLURM.items() if k not in ("SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE")}
    env["SLURM_TASKS_PER_NODE"] = "3,1"
    i = det(env)
    assert i.seed_host == "host0" and i.local_world_size == 1  # node 1 of "3,1"
    env = dict(env, SLURM_NODEID="0")
    assert det(env).local_world_size == 3
    env.pop("SLURM_TASKS_PER_NODE")
    env["SLURM_NTASKS_PER_NODE"] = "2"
    assert det(env).local_world_size == 2


def test_two_steps_two_jobs_two_ports():
    a = det(SLURM).seed_port
    assert det(dict(SLURM, SLURM_STEP_ID="1")).seed_port != a
    assert det(dict(SLURM, SLURM_JOB_ID="18")).seed_port != a


def test_openmpi():
    i = det(OMPI)
    assert (i.name, i.rank, i.world_size, i.local_rank, i.local_world_size) == ("openmpi", 2, 4, 0, 2)
    assert i.seed_host == "10.77.0.1"  # mpirun's host: its first address that is not loopback
    assert i.seed_port == L.job_port("openmpi:778633217")
    one = dict(OMPI, OMPI_MCA_orte_num_nodes="1", OMPI_COMM_WORLD_LOCAL_SIZE="4")
    assert det(one).seed == f"127.0.0.1:{L.job_port('openmpi:778633217')}"


def test_pmix_rank_only():
    i = det({"PMIX_RANK": "1", "PMIX_NAMESPACE": "prterun-x-1@1"})
    assert (i.name, i.rank, i.world_size, i.seed) == ("pmix", 1, None, None)
    assert i.job_id == "pmix:prterun-x-1@1"
    i = det({"PMIX_RANK": "1", "PMIX_NAMESPACE": "ns", "MASTER_ADDR": "h", "WORLD_SIZE": "2"})
    assert (i.rank, i.world_size, i.seed) == (1, 2, f"h:{L.job_port('pmix:ns')}")


def test_order_torchrun_beats_slurm_beats_openmpi_beats_pmix():
    i = det({**OMPI, **SLURM, **TORCHRUN})
    assert (i.name, i.rank, i.world_size, i.local_rank, i.local_world_size, i.seed) == \
        ("torchrun", 5, 8, 1, 4, "10.0.0.9:29500")
    i = det({**OMPI, **SLURM})
    assert (i.name, i.rank, i.world_size, i.seed_host) == ("slurm", 3, 4, "host1")
    i = det(OMPI)
    assert i.name == "openmpi" and i.rank == 2
    # Per variable: torchrun under srun sets RANK and WORLD_SIZE; MASTER_ADDR
    # from the user; the port still the job's.
    i = det({**SLURM, "MASTER_ADDR": "10.1.1.1"})
    assert i.seed == f"10.1.1.1:{L.job_port('slurm:17.0')}"


def test_explicit_beats_everything():
    i = det({**SLURM, **TORCHRUN}, rank=0, world_size=2, local_rank=0, local_world_size=2, seed="10.9.9.9:1234",
            nexar_seed="10.8.8.8:1")
    assert (i.name, i.rank, i.world_size, i.local_rank, i.local_world_size, i.seed) == \
        ("explicit", 0, 2, 0, 2, "10.9.9.9:1234")
    assert i.sources["rank"] == "argument"


def test_nexar_seed_and_master_port_override_the_derived_port():
    i = det(SLURM, nexar_seed="10.2.3.4:4000")
    assert i.seed == "10.2.3.4:4000" and i.sources["seed"] == "NEXAR_SEED"
    i = det({**SLURM, "MASTER_PORT": "31000"})
    assert i.seed == "host1:31000"
    assert det({**TORCHRUN}, nexar_seed="[fd00::1]:5").seed == "[fd00::1]:5"


def test_malformed_names_the_variable():
    with pytest.raises(ValueError, match="SLURM_PROCID='x'"):
        det(dict(SLURM, SLURM_PROCID="x"))
    with pytest.raises(ValueError, match="SLURM_STEP_NODELIST"):
        det(dict(SLURM, SLURM_STEP_NODELIST="n[1-"))
    with pytest.raises(ValueError, match="NEXAR_SEED"):
        det(SLURM, nexar_seed="nohostport")


def test_no_launcher():
    i = det({})
    assert (i.name, i.rank, i.world_size, i.seed) == ("none", None, None, None)


def test_loopback_seed_host_across_hosts():
    # Debian's /etc/hosts: the first node's own name is 127.0.1.1 there.
    i = det(SLURM, loopback=ALWAYS, global_addrs=lambda: ["10.77.0.1"])
    assert i.seed_host == "10.77.0.1" and "loopback here" in i.sources["seed"]
    with pytest.raises(ValueError, match="NEXAR_ADVERTISE_ADDR") as e:
        det(SLURM, loopback=ALWAYS, global_addrs=lambda: ["10.77.0.1", "192.0.2.2"])
    assert "host1" in str(e.value) and "spans hosts" in str(e.value)
    # One host: loopback is right.
    one = dict(SLURM, SLURM_STEP_TASKS_PER_NODE="4", SLURM_NODEID="0")
    assert det(one, loopback=ALWAYS, global_addrs=lambda: []).seed_host == "host1"
    # A host the user named is left to libnexar and the torch rendezvous.
    assert det({**SLURM, "MASTER_ADDR": "hostA"}, loopback=ALWAYS, global_addrs=lambda: []).seed_host == "hostA"


def test_export_sets_only_unset():
    env = {"RANK": "3", "MASTER_PORT": ""}
    i = det(SLURM)
    done = L.export(i, env)
    assert env["RANK"] == "3" and "RANK" not in done
    assert env == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                   "MASTER_ADDR": "host1", "MASTER_PORT": str(L.job_port("slurm:17.0"))}
    assert L.export(det({}), {}) == {}


def _clear(monkeypatch):
    # setenv first, so that the variables export() sets are removed again.
    for k in list(SLURM) + list(TORCHRUN) + list(OMPI) + ["NEXAR_SEED", "SLURM_NODELIST", "SLURM_STEPID"]:
        monkeypatch.setenv(k, "")
        monkeypatch.delenv(k)


def test_real_environment_reads_nexar_seed(monkeypatch):
    _clear(monkeypatch)
    monkeypatch.setenv("NEXAR_SEED", "10.4.4.4:4444")
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    i = L.detect()
    assert i.seed == "10.4.4.4:4444" and i.rank == 0 and i.world_size == 1


def test_torch_hook_exports_for_nexar_only(monkeypatch):
    torch_dist = pytest.importorskip("torch.distributed")
    import nexar.torch as nt

    _clear(monkeypatch)
    for k, v in SLURM.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("SLURM_STEP_NODELIST", "127.0.0.1")
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "4")  # one host: loopback is right
    monkeypatch.setenv("SLURM_NODEID", "0")
    seen = {}

    def fake(backend=None, init_method=None, *a, **kw):
        import os
        seen[backend] = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}

    import torch.distributed.distributed_c10d as c10d
    monkeypatch.setattr(c10d, "init_process_group", fake)
    nt._hook_init(torch_dist, c10d)
    c10d.init_process_group("gloo")
    assert seen["gloo"]["RANK"] is None  # other backends: untouched
    c10d.init_process_group("nexar")
    assert seen["nexar"] == {"RANK": "3", "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1",
                             "MASTER_PORT": str(L.job_port("slurm:17.0"))}
    assert torch_dist.init_process_group._nexar_hooked
