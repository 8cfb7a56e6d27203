"""The Rust adapter runs the same layouts and iteration counts as the Python
adapters: compare `nexar-rs-bench --print-plan N` with common.py.

  python3 bench/compare/nexar-rs/test_plan.py   (after cargo build --release)
"""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import common  # noqa: E402

BIN = os.path.join(HERE, "target", "release", "nexar-rs-bench")
SIZES = [1, 3, 4, 7, 8, 12, 100, 4096, 65536, 1 << 20, 3 << 20, 16 << 20, 256 << 20, 1 << 30]


def main():
    if not os.access(BIN, os.X_OK):
        sys.exit(f"{BIN} not built: cd {HERE} && cargo build --release")
    checked = 0
    for n in (1, 2, 3, 4, 7, 8):
        out = subprocess.run([BIN, "--print-plan", str(n), "--ops", ",".join(common.OPS),
                              "--sizes", ",".join(map(str, SIZES))],
                             check=True, capture_output=True, text=True).stdout.split("\n")
        got = [line.split() for line in out if line]
        want = [[op, str(size), str(n)] + [str(x) for x in common.layout(op, size, n)] +
                [str(common.iterations(common.layout(op, size, n)[0]))]
                for op in common.OPS for size in SIZES]
        if got != want:
            for g, w in zip(got, want):
                if g != w:
                    print(f"mismatch: rust {g} python {w}")
            sys.exit(f"plan differs from common.py for {n} ranks ({len(got)} vs {len(want)} rows)")
        checked += len(want)
    print(f"ok: {checked} (op, size, ranks) layouts and iteration counts equal common.py")


if __name__ == "__main__":
    main()
