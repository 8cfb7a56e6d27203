//! bench/compare adapter for the Rust nexar (crates.io `nexar`): one process
//! per rank, rank 0 prints the JSON lines of `common.report` with system
//! "nexar-rs".
//!
//! Started by compare.py with RANK, WORLD_SIZE and NEXAR_RS_SEED (the seed's
//! loopback address; rank 0 binds it, the others join it) and the shared
//! flags `--ops a,b --sizes 8,4096`. Sizes, layouts, iteration counts and
//! warm-up are those of bench/compare/common.py (ported in `plan.rs`;
//! `--print-plan` prints them so that test_plan.py can compare).
//!
//! Every (op, size) runs 2 untimed warm-up calls, the first of which is
//! checked for the right result on every rank (the ranks agree on the verdict
//! through a small allreduce), then `iterations(S)` timed calls, each after
//! a barrier, as the Python adapters do. A failed call or a wrong result is
//! reported as a JSON line with an "error" field, never as a time.

mod plan;

use nexar::{ClusterConfig, CpuAdapter, DataType, NexarClient, ReduceOp};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

const SYSTEM: &str = "nexar-rs";
const WARMUP: usize = 2;

fn env_u32(name: &str) -> Result<u32, String> {
    std::env::var(name)
        .map_err(|_| format!("{name} is not set"))?
        .parse()
        .map_err(|e| format!("{name}: {e}"))
}

/// Buffers of one (op, size) and the call that runs the op on them.
struct Case {
    op: String,
    send: Vec<f32>,
    recv: Vec<f32>,
}

impl Case {
    /// Fill the buffers so that the result of one call is known: rank r
    /// contributes r+1 everywhere (broadcast: only the root's data matters).
    fn fill_for_check(&mut self, rank: u32) {
        let v = (rank + 1) as f32;
        if self.op == "broadcast" && rank != 0 {
            self.send.fill(0.0);
        } else {
            self.send.fill(v);
        }
        self.recv.fill(-1.0);
    }

    /// Whether one call after `fill_for_check` produced the right result.
    fn check(&self, rank: u32, n: u32) -> Result<(), String> {
        let sum = (n * (n + 1) / 2) as f32;
        let (buf, name) = match self.op.as_str() {
            "allreduce" | "broadcast" => (&self.send, "buffer"),
            _ => (&self.recv, "recv"),
        };
        let block = match self.op.as_str() {
            "allgather" | "alltoall" => self.recv.len() / n as usize,
            _ => buf.len(),
        };
        for (i, &got) in buf.iter().enumerate() {
            let want = match self.op.as_str() {
                "allreduce" | "reduce_scatter" => sum,
                "broadcast" => 1.0,
                // Block j comes from rank j, which sent j+1.
                _ => (i / block + 1) as f32,
            };
            if got != want {
                return Err(format!(
                    "wrong result on rank {rank}: {name}[{i}] = {got}, want {want}"
                ));
            }
        }
        Ok(())
    }

    async fn call(&mut self, c: &NexarClient, n: u32) -> nexar::Result<()> {
        let (sp, rp) = (self.send.as_mut_ptr() as u64, self.recv.as_mut_ptr() as u64);
        let cs = self.send.len();
        // SAFETY: the pointers and counts describe self.send / self.recv,
        // which outlive the awaited call and are not touched during it.
        unsafe {
            match self.op.as_str() {
                "allreduce" => c.all_reduce(sp, cs, DataType::F32, ReduceOp::Sum).await,
                "broadcast" => c.broadcast(sp, cs, DataType::F32, 0).await,
                "allgather" => c.all_gather(sp, rp, cs, DataType::F32).await,
                "reduce_scatter" => {
                    c.reduce_scatter(sp, rp, self.recv.len(), DataType::F32, ReduceOp::Sum)
                        .await
                }
                // nexar's count is per destination block.
                _ => c.all_to_all(sp, rp, cs / n as usize, DataType::F32).await,
            }
        }
    }
}

fn error_line(op: &str, size: usize, n: u32, err: &str) -> String {
    format!(
        "{{\"system\": \"{SYSTEM}\", \"op\": \"{op}\", \"bytes\": {size}, \"ranks\": {n}, \"error\": {}}}",
        plan::json_string(err)
    )
}

/// Run one (op, size): check, warm up, time. Ok(times) or Err(reason),
/// the same verdict on every rank unless the communicator itself failed.
async fn run_case(c: &NexarClient, op: &str, size: usize) -> Result<Vec<f64>, String> {
    let (rank, n) = (c.rank(), c.world_size());
    let (_, cs, cr) = plan::layout(op, size, n as usize);
    let mut case = Case {
        op: op.to_string(),
        send: vec![0.0; cs],
        recv: vec![0.0; cr],
    };
    let what = |e: nexar::NexarError| format!("{op} of {size} B failed on rank {rank}: {e}");

    case.fill_for_check(rank);
    case.call(c, n).await.map_err(what)?;
    let verdict = case.check(rank, n);
    // Agree on the verdict: the count of ranks that saw a wrong result.
    let mut bad = [if verdict.is_err() { 1.0f32 } else { 0.0 }];
    // SAFETY: one f32 in `bad`, alive across the call.
    unsafe {
        c.all_reduce(bad.as_mut_ptr() as u64, 1, DataType::F32, ReduceOp::Sum)
            .await
    }
    .map_err(|e| format!("{op} of {size} B: result check failed on rank {rank}: {e}"))?;
    verdict?;
    if bad[0] != 0.0 {
        return Err(format!(
            "wrong result on {} rank(s) other than rank {rank}",
            bad[0]
        ));
    }
    for _ in 1..WARMUP {
        case.call(c, n).await.map_err(what)?;
    }
    let iters = plan::iterations(plan::layout(op, size, n as usize).0);
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters {
        c.barrier()
            .await
            .map_err(|e| format!("barrier before {op} of {size} B failed on rank {rank}: {e}"))?;
        let t = Instant::now();
        case.call(c, n).await.map_err(what)?;
        times.push(t.elapsed().as_secs_f64());
    }
    Ok(times)
}

async fn run(ops: Vec<String>, sizes: Vec<usize>) -> Result<(), String> {
    let rank = env_u32("RANK")?;
    let n = env_u32("WORLD_SIZE")?;
    let seed: SocketAddr = std::env::var("NEXAR_RS_SEED")
        .map_err(|_| "NEXAR_RS_SEED is not set".to_string())?
        .parse()
        .map_err(|e| format!("NEXAR_RS_SEED: {e}"))?;
    let mut nexar_cfg = nexar::NexarConfig::from_env();
    // A dead peer should end the run within compare.py's deadline.
    nexar_cfg.collective_timeout = Duration::from_secs(20);
    nexar_cfg.barrier_timeout = Duration::from_secs(20);
    let cfg = ClusterConfig::new(n)
        .with_bind_addr(SocketAddr::new(seed.ip(), 0))
        .with_requested_rank(rank)
        .with_join_timeout(Duration::from_secs(60))
        .with_nexar(nexar_cfg);
    let adapter = Arc::new(CpuAdapter::new());
    let client = if rank == 0 {
        NexarClient::bootstrap_seed(seed, &cfg, adapter).await
    } else {
        NexarClient::bootstrap_join(seed, &cfg, adapter).await
    }
    .map_err(|e| format!("rank {rank}: bootstrap through {seed} failed: {e}"))?;

    for op in &ops {
        for &size in &sizes {
            let (s, _, _) = plan::layout(op, size, n as usize);
            match run_case(&client, op, size).await {
                Ok(times) if rank == 0 => {
                    println!("{}", plan::report(SYSTEM, op, s, n as usize, &times))
                }
                Ok(_) => {}
                Err(e) => {
                    eprintln!("nexar-rs: {e}");
                    if rank == 0 {
                        println!("{}", error_line(op, s, n, &e));
                    }
                }
            }
        }
    }
    client
        .shutdown()
        .await
        .map_err(|e| format!("rank {rank}: shutdown: {e}"))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (ops, sizes, print_plan) = match plan::parse_args(&args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("nexar-rs-bench: {e}");
            std::process::exit(2);
        }
    };
    if let Some(n) = print_plan {
        for op in &ops {
            for &size in &sizes {
                let (s, cs, cr) = plan::layout(op, size, n);
                println!("{op} {size} {n} {s} {cs} {cr} {}", plan::iterations(s));
            }
        }
        return;
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("nexar-rs-bench: tokio runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = rt.block_on(run(ops, sizes)) {
        eprintln!("nexar-rs-bench: {e}");
        std::process::exit(1);
    }
}
