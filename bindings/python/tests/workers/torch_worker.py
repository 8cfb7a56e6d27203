"""One rank of the torch backend test: every collective on a "nexar" group
and on a gloo group with the same inputs, results compared; DDP for 20 steps
on each; FSDP if it runs on CPU. Launched with torchrun's variables.

argv[1]: which part to run: "collectives", "ddp", "fsdp", "init:<method>".
"""

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import nexar.torch  # noqa: F401  (registers the backend; torch >= 2.5 also does it)

R = int(os.environ["RANK"])
N = int(os.environ["WORLD_SIZE"])


def same(name, a, b, atol=0.0):
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b), name
        for i, (x, y) in enumerate(zip(a, b)):
            same(f"{name}[{i}]", x, y, atol)
        return
    if a is None or b is None:
        assert a is None and b is None, name
        return
    if atol:
        ok = torch.allclose(a.double(), b.double(), atol=atol, rtol=0)
    else:
        ok = torch.equal(a, b)
    if not ok:
        raise AssertionError(f"{name}: nexar {a} != gloo {b}")


def inputs(dt, n=6, salt=0):
    return (torch.arange(n) % 4 + R + 1 + salt).to(dt)


def both(name, fn, groups, ref=None):
    """Run fn(group) on nexar and on gloo (or ref() when gloo cannot), compare."""
    nx, gl = groups
    a = fn(nx)
    try:
        b = fn(gl)
    except (RuntimeError, NotImplementedError, ValueError) as e:
        if ref is None:
            print(f"rank {R}: {name}: gloo cannot ({str(e).splitlines()[0][:80]}); nexar ran", flush=True)
            return
        b = ref()
    same(name, a, b)


def collectives():
    dist.init_process_group("gloo")
    nx = dist.new_group(backend="nexar")
    gl = dist.new_group(backend="gloo")
    assert dist.get_backend(nx) == "nexar"
    G = (nx, gl)
    ops_f = [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX]
    ops_i = ops_f + [dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR]
    dts = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
           torch.int32, torch.int64]
    for dt in dts:
        for op in (ops_f if dt.is_floating_point else ops_i):
            def f(g, op=op, dt=dt):
                t = inputs(dt)
                dist.all_reduce(t, op=op, group=g)
                return t
            both(f"all_reduce {dt} {op}", f, G)
            def f_async(g, op=op, dt=dt):
                t = inputs(dt)
                w = dist.all_reduce(t, op=op, group=g, async_op=True)
                w.wait()
                return w.get_future().value()[0]
            both(f"all_reduce async {dt} {op}", f_async, G)
    # AVG: gloo lacks it; reference is SUM / N
    t = inputs(torch.float32)
    dist.all_reduce(t, op=dist.ReduceOp.AVG, group=nx)
    s = inputs(torch.float32)
    dist.all_reduce(s, group=gl)
    same("all_reduce AVG", t, s / N, atol=1e-6)
    # non-contiguous
    def nc(g):
        t = torch.arange(24.0).reshape(4, 6) + R
        dist.all_reduce(t[:, 1:3], group=g)
        return t
    # gloo (torch 2.15) reduces a non-contiguous view as if it were
    # contiguous from its data pointer, so compare with a local reference.
    want = torch.arange(24.0).reshape(4, 6) + R
    want[:, 1:3] = sum(torch.arange(24.0).reshape(4, 6)[:, 1:3] + q for q in range(N))
    same("all_reduce non-contiguous", nc(nx), want)
    def coalesced(g):
        ts = [inputs(torch.float32), inputs(torch.float32, 3, 1)]
        g.allreduce_coalesced(ts, dist.AllreduceCoalescedOptions()).wait()
        return ts
    both("allreduce_coalesced", coalesced, G)
    for root in range(N):
        def bc(g, root=root):
            t = inputs(torch.float32)
            dist.broadcast(t, group_src=root, group=g)
            return t
        both(f"broadcast root {root}", bc, G)
        def rd(g, root=root):
            t = inputs(torch.int64)
            dist.reduce(t, group_dst=root, op=dist.ReduceOp.MAX, group=g)
            return t if R == root else None
        both(f"reduce root {root}", rd, G)
        def ga(g, root=root):
            out = [torch.empty(6) for _ in range(N)] if R == root else None
            dist.gather(inputs(torch.float32), out, group_dst=root, group=g)
            return out
        both(f"gather root {root}", ga, G)
        def sc(g, root=root):
            out = torch.empty(6)
            ins = [inputs(torch.float32, salt=j) for j in range(N)] if R == root else None
            dist.scatter(out, ins, group_src=root, group=g)
            return out
        both(f"scatter root {root}", sc, G)
    for dt in (torch.float32, torch.bfloat16, torch.int64, torch.bool):
        def ag(g, dt=dt):
            out = [torch.empty(6, dtype=dt) for _ in range(N)]
            dist.all_gather(out, inputs(torch.int64).to(dt), group=g)
            return out
        both(f"all_gather {dt}", ag, G)
        def agt(g, dt=dt):
            out = torch.empty(6 * N, dtype=dt)
            dist.all_gather_into_tensor(out, inputs(torch.int64).to(dt), group=g)
            return out
        both(f"all_gather_into_tensor {dt}", agt, G)
    def agc(g):
        outs = [[torch.empty(6), torch.empty(3)] for _ in range(N)]
        g.allgather_coalesced(outs, [inputs(torch.float32), inputs(torch.float32, 3)]).wait()
        return outs
    both("allgather_coalesced", agc, G)
    def agtc(g):
        outs = [torch.empty(6 * N), torch.empty(3 * N)]
        g.allgather_into_tensor_coalesced(outs, [inputs(torch.float32), inputs(torch.float32, 3)]).wait()
        return outs
    both("allgather_into_tensor_coalesced", agtc, G,
         ref=lambda: [torch.cat([(torch.arange(n) % 4 + q + 1).float() for q in range(N)]) for n in (6, 3)])
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
        def rs(g, op=op):
            out = torch.empty(6)
            dist.reduce_scatter(out, [inputs(torch.float32, salt=j) for j in range(N)], op=op, group=g)
            return out
        both(f"reduce_scatter {op}", rs, G)
        def rst(g, op=op):
            out = torch.empty(6)
            dist.reduce_scatter_tensor(out, torch.cat([inputs(torch.float32, salt=j) for j in range(N)]),
                                       op=op, group=g)
            return out
        both(f"reduce_scatter_tensor {op}", rst, G)
    def rstc(g):
        outs = [torch.empty(6), torch.empty(2)]
        ins = [torch.cat([inputs(torch.float32, salt=j) for j in range(N)]),
               torch.cat([inputs(torch.float32, 2, j) for j in range(N)])]
        g.reduce_scatter_tensor_coalesced(outs, ins, dist.ReduceScatterOptions()).wait()
        return outs
    both("reduce_scatter_tensor_coalesced", rstc, G,
         ref=lambda: [sum((torch.arange(n) % 4 + q + 1 + R).float() for q in range(N)) for n in (6, 2)])
    def a2a_eq(g):
        out = torch.empty(2 * N)
        dist.all_to_all_single(out, torch.arange(2.0 * N) + 100 * R, group=g)
        return out
    both("all_to_all_single equal", a2a_eq, G)
    def a2a_uneq(g):
        # rank i sends j+1 rows to rank j; rows of 3
        ins = torch.cat([torch.full((j + 1, 3), 10.0 * R + j) for j in range(N)])
        out = torch.empty(N * (R + 1), 3)
        dist.all_to_all_single(out, ins, output_split_sizes=[R + 1] * N,
                               input_split_sizes=[j + 1 for j in range(N)], group=g)
        return out
    both("all_to_all_single unequal", a2a_uneq, G)
    def a2a(g):
        outs = [torch.empty(R + 1) for _ in range(N)]
        dist.all_to_all(outs, [torch.full((j + 1,), float(R * 10 + j)) for j in range(N)], group=g)
        return outs
    both("all_to_all", a2a, G,
         ref=lambda: [torch.full((R + 1,), float(i * 10 + R)) for i in range(N)])
    # point to point
    def p2p(g):
        nxt, prv = (R + 1) % N, (R - 1) % N
        out = torch.empty(4, dtype=torch.bfloat16)
        if R % 2 == 0:
            dist.send(inputs(torch.bfloat16, 4), group_dst=nxt, group=g, tag=7)
            dist.recv(out, group_src=prv, group=g, tag=7)
        else:
            dist.recv(out, group_src=prv, group=g, tag=7)
            dist.send(inputs(torch.bfloat16, 4), group_dst=nxt, group=g, tag=7)
        return out
    both("send/recv", p2p, G)
    def p2p_async(g):
        nxt, prv = (R + 1) % N, (R - 1) % N
        out = torch.empty(4)
        ops = [dist.P2POp(dist.irecv, out, group_peer=prv, group=g),
               dist.P2POp(dist.isend, inputs(torch.float32, 4), group_peer=nxt, group=g)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        return out
    both("batch_isend_irecv", p2p_async, G)
    def anysrc(g):
        if R == 0:
            got = []
            for _ in range(N - 1):
                t = torch.empty(1)
                src = dist.recv(t, group=g)
                got.append((src, t.item()))
            return torch.tensor(sorted(got))
        dist.send(torch.tensor([float(R)]), group_dst=0, group=g)
        return None
    both("recv anysource", anysrc, G)
    both("barrier", lambda g: dist.barrier(group=g), G)
    def objs(g):
        out = [None] * N
        dist.all_gather_object(out, {"rank": R, "x": [R] * R}, group=g)
        lst = [{"from": R}] if R == 0 else [None]
        dist.broadcast_object_list(lst, group_src=0, group=g)
        return torch.tensor([len(str(out)), len(str(lst))])
    both("object collectives", objs, G)
    def sparse(g):
        i = torch.tensor([[R, 2], [0, R + 1]])
        t = torch.sparse_coo_tensor(i, torch.tensor([1.0 + R, 10.0]), (N + 1, N + 2))
        dist.all_reduce(t, group=g)
        return t.to_dense()
    both("sparse all_reduce", sparse, G)
    def monitored(g):
        dist.monitored_barrier(group=g, timeout=timedelta(seconds=10), wait_all_ranks=True)
        return torch.tensor([1.0])
    both("monitored_barrier", monitored, G)
    # monitored_barrier names the rank that does not come, as gloo does
    if N > 1:
        if R == 0:
            try:
                nx.monitored_barrier(timedelta(seconds=1))
            except RuntimeError as e:
                assert f"Rank {N - 1} failed to pass monitoredBarrier" in str(e), e
            else:
                raise AssertionError("monitored_barrier passed without every rank")
        elif R != N - 1:
            try:
                nx.monitored_barrier(timedelta(seconds=3))
            except RuntimeError as e:
                assert "received errors while waiting for send/recv from rank 0" in str(e), e
            else:
                raise AssertionError("monitored_barrier passed though rank 0 failed it")
        dist.barrier(group=nx)
    # an error reaches whoever waits
    try:
        dist.broadcast(torch.zeros(1), group_src=N + 5, group=nx)
    except (ValueError, RuntimeError, nexar.Error) as e:
        pass
    else:
        raise AssertionError("bad root accepted")
    bad = nx.allreduce([torch.zeros(2, dtype=torch.int32)], _opts(dist.ReduceOp.AVG))
    try:
        bad.wait()
    except ValueError:
        pass
    else:
        raise AssertionError("error of an async op was lost")
    dist.barrier(group=nx)
    _finish()
    print(f"rank {R}: collectives ok", flush=True)


def _finish():
    # Destroy right after the last barrier, with no pause: a rank that
    # leaves first must not fail the slower ones.
    dist.barrier()
    dist.destroy_process_group()


def _opts(op):
    o = dist.AllreduceOptions()
    o.reduceOp = op
    return o


import nexar  # noqa: E402


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _train(wrap, steps=20):
    model = wrap(_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(100 + R)
    for _ in range(steps):
        x = torch.randn(16, 8, generator=g)
        y = torch.randn(16, 4, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return model


def ddp():
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    nx = dist.new_group(backend="nexar")
    gl = dist.new_group(backend="gloo")
    a = _train(lambda m: DDP(m, process_group=nx, bucket_cap_mb=0.0001))
    b = _train(lambda m: DDP(m, process_group=gl, bucket_cap_mb=0.0001))
    for (name, p), q in zip(a.module.named_parameters(), b.module.parameters()):
        same(f"ddp {name}", p.detach(), q.detach(), atol=1e-5)
    # parameters agree across ranks too
    flat = torch.cat([p.detach().reshape(-1) for p in a.parameters()])
    allf = [torch.empty_like(flat) for _ in range(N)]
    dist.all_gather(allf, flat, group=nx)
    for f in allf:
        same("ddp replicas", f, flat, atol=0)
    _finish()
    print(f"rank {R}: ddp ok", flush=True)


def fsdp():
    dist.init_process_group("gloo")
    nx = dist.new_group(backend="nexar")
    gl = dist.new_group(backend="gloo")
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    def run(g):
        m = _train(lambda m: FSDP(m, process_group=g, device_id=torch.device("cpu"), use_orig_params=True))
        with FSDP.summon_full_params(m):
            return [p.detach().clone() for p in m.parameters()]
    a = run(nx)
    b = run(gl)
    same("fsdp", a, b, atol=1e-5)
    _finish()
    print(f"rank {R}: fsdp ok", flush=True)


def init_method(method):
    if method == "env":
        dist.init_process_group("nexar")
    elif method == "tcp":
        dist.init_process_group("nexar", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
                                rank=R, world_size=N)
    elif method.startswith("file"):
        dist.init_process_group("nexar", init_method="file://" + os.environ["NEXAR_TEST_FILE"],
                                rank=R, world_size=N)
    t = torch.full((3,), float(R))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((3,), float(sum(range(N))))), t
    sub = dist.new_group([0, N - 1] if N > 1 else [0])
    if R in (0, N - 1):
        u = torch.ones(2)
        dist.all_reduce(u, group=sub)
        assert u[0].item() == (2 if N > 1 else 1)
    _finish()
    print(f"rank {R}: init {method} ok", flush=True)



def peer_death(spec):
    """Rank N-1 SIGKILLs itself at step 3 of a loop of `what` on a "nexar"
    group: ddp, fsdp, fsdp2 (fully_shard), wait (async_op, work.wait()) or
    future (async_op, work.get_future().wait()). The others must get a
    Python exception naming it within seconds, then exit normally: after
    destroy_process_group, or straight away with spec "what+exit". The
    victim writes its time of death to $NEXAR_TEST_FILE."""
    import signal
    import time

    what, _, how = spec.partition("+")
    dist.init_process_group("nexar")
    victim = N - 1
    if what == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(_model(), bucket_cap_mb=0.0001)
    elif what == "fsdp":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        model = FSDP(_model(), device_id=torch.device("cpu"), use_orig_params=True)
    elif what == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        model = _model()
        for m in model:
            if isinstance(m, torch.nn.Linear):
                fully_shard(m)
        fully_shard(model)
    else:
        model = None
    opt = torch.optim.SGD(model.parameters(), lr=0.05) if model is not None else None
    g = torch.Generator().manual_seed(100 + R)

    def step():
        if model is None:
            t = torch.ones(1 << 12)
            w = dist.all_reduce(t, async_op=True)
            if what == "wait":
                w.wait()
            else:
                t = w.get_future().wait()[0]
            assert t[0].item() == N, t[0].item()
            return
        opt.zero_grad()
        x, y = torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    for i in range(200):
        if R == victim and i == 3:
            with open(os.environ["NEXAR_TEST_FILE"], "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            step()
        except Exception as e:  # noqa: BLE001 - the error under test
            dead = float(open(os.environ["NEXAR_TEST_FILE"]).read())
            msg = str(e).replace("\n", " ")[:400]
            print(f"rank {R}: peer death {what}: {type(e).__name__} at step {i}, "
                  f"{time.time() - dead:.3f} s after the kill: {msg}", flush=True)
            assert f"rank {victim}" in str(e).lower(), f"error does not name rank {victim}: {e}"
            break
    else:
        raise AssertionError(f"peer death {what}: no error in 200 steps")
    if how != "exit":
        try:
            dist.destroy_process_group()
        except Exception as e:  # noqa: BLE001 - only the exit status is checked after this
            print(f"rank {R}: destroy_process_group: {type(e).__name__}: {e}", flush=True)
    print(f"rank {R}: peer death {spec} ok", flush=True)


if __name__ == "__main__":
    what = sys.argv[1]
    if what.startswith("init:"):
        init_method(what[5:])
    elif what.startswith("peerdeath:"):
        peer_death(what[10:])
    else:
        globals()[what]()
