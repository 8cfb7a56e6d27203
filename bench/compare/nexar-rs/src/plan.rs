//! The parts of bench/compare/common.py the adapter needs, ported line by
//! line: layout, iterations, busbw factor, median/p99/mean and the JSON line
//! of `common.report`. test_plan.py checks layout and iterations against
//! common.py; the unit tests below check the statistics.

pub const OPS: [&str; 5] = [
    "allreduce",
    "broadcast",
    "allgather",
    "reduce_scatter",
    "alltoall",
];
const ELEM: usize = 4; // float32

/// common.busbw_factor
pub fn busbw_factor(op: &str, n: usize) -> f64 {
    let n = n as f64;
    match op {
        "allreduce" => 2.0 * (n - 1.0) / n,
        "broadcast" => 1.0,
        _ => (n - 1.0) / n,
    }
}

/// common.layout: (S actually used in bytes, send elements, recv elements).
pub fn layout(op: &str, size: usize, n: usize) -> (usize, usize, usize) {
    if op == "allreduce" || op == "broadcast" {
        let c = (size / ELEM).max(1);
        return (c * ELEM, c, c);
    }
    let block = (size / ELEM / n).max(1);
    let total = block * n;
    match op {
        "allgather" => (total * ELEM, block, total),
        "reduce_scatter" => (total * ELEM, total, block),
        _ => (total * ELEM, total, total),
    }
}

/// common.iterations
pub fn iterations(size: usize) -> usize {
    ((256usize << 20) / size.max(1)).clamp(5, 1000)
}

/// statistics.median: the mean of the two middle values for an even count.
pub fn median(times: &[f64]) -> f64 {
    let mut s = times.to_vec();
    s.sort_by(f64::total_cmp);
    let k = s.len();
    if k % 2 == 1 {
        s[k / 2]
    } else {
        (s[k / 2 - 1] + s[k / 2]) / 2.0
    }
}

/// common.p99: nearest rank, the ceil(0.99 n)-th smallest.
pub fn p99(times: &[f64]) -> f64 {
    let mut s = times.to_vec();
    s.sort_by(f64::total_cmp);
    s[(99 * s.len()).div_ceil(100) - 1]
}

/// Python's round(x, digits) for the magnitudes printed here.
fn round(x: f64, digits: i32) -> f64 {
    let k = 10f64.powi(digits);
    (x * k).round() / k
}

/// A JSON string literal.
pub fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// common.report's JSON line from rank 0's per-iteration times (seconds).
pub fn report(system: &str, op: &str, size: usize, n: usize, times: &[f64]) -> String {
    let t = median(times);
    let alg = size as f64 / t / 1e9;
    let mean = times.iter().sum::<f64>() / times.len() as f64;
    format!(
        "{{\"system\": {}, \"op\": {}, \"bytes\": {size}, \"ranks\": {n}, \"time_us\": {:?}, \
         \"p99_us\": {:?}, \"mean_us\": {:?}, \"algbw_gbs\": {:?}, \"busbw_gbs\": {:?}, \"iters\": {}}}",
        json_string(system),
        json_string(op),
        round(t * 1e6, 2),
        round(p99(times) * 1e6, 2),
        round(mean * 1e6, 2),
        round(alg, 4),
        round(alg * busbw_factor(op, n), 4),
        times.len()
    )
}

/// Parsed flags: ops, sizes, and the world size of `--print-plan` if given.
pub type Args = (Vec<String>, Vec<usize>, Option<usize>);

/// common.parse_args, plus `--print-plan N` (print layouts and iteration
/// counts for N ranks instead of running).
pub fn parse_args(args: &[String]) -> Result<Args, String> {
    let mut ops: Vec<String> = OPS.iter().map(|s| s.to_string()).collect();
    let mut sizes = vec![8, 4096, 1 << 20];
    let mut print_plan = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--ops" => ops = value()?.split(',').map(str::to_string).collect(),
            "--sizes" => {
                sizes = value()?
                    .split(',')
                    .map(|x| x.parse().map_err(|e| format!("--sizes {x}: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--print-plan" => {
                print_plan = Some(value()?.parse().map_err(|e| format!("--print-plan: {e}"))?)
            }
            _ => return Err(format!("unknown argument {a}")),
        }
    }
    if let Some(bad) = ops.iter().find(|o| !OPS.contains(&o.as_str())) {
        return Err(format!("unknown op {bad}; known: {}", OPS.join(",")));
    }
    Ok((ops, sizes, print_plan))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_even_and_odd() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
    }

    #[test]
    fn p99_nearest_rank() {
        let t: Vec<f64> = (1..=1000).map(f64::from).collect();
        assert_eq!(p99(&t), 990.0); // ceil(0.99 * 1000) = 990th smallest
        let t: Vec<f64> = (1..=5).map(f64::from).collect();
        assert_eq!(p99(&t), 5.0);
        let t: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(p99(&t), 99.0);
    }

    #[test]
    fn report_fields() {
        let line = report("nexar-rs", "allreduce", 1 << 20, 2, &[0.001, 0.002, 0.003]);
        assert!(line.contains("\"time_us\": 2000.0"), "{line}");
        assert!(line.contains("\"p99_us\": 3000.0"), "{line}");
        assert!(line.contains("\"busbw_gbs\": 0.5243"), "{line}");
        assert!(line.contains("\"iters\": 3"), "{line}");
    }

    #[test]
    fn bad_args() {
        assert!(parse_args(&["--ops".into(), "allgatherx".into()]).is_err());
        assert!(parse_args(&["--sizes".into()]).is_err());
        assert!(parse_args(&["--frob".into()]).is_err());
    }
}
