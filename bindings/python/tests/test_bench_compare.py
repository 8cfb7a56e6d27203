"""bench/compare's results table: each nexar flavour's busbw as a share of
the two-way ceilings it measured (in cache, and out of cache when taken)."""

import importlib.util
import os

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def load_compare():
    spec = importlib.util.spec_from_file_location(
        "bench_compare", os.path.join(ROOT, "bench", "compare", "compare.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def ceiling(op, gbs, before, after):
    return {"system": "tcp-stream", "op": op, "bytes": 0, "ranks": 2, "time_us": 0,
            "algbw_gbs": gbs, "busbw_gbs": gbs, "netns": True, "before_gbs": before, "after_gbs": after}


def run(system, gbs):
    return {"system": system, "op": "allreduce", "bytes": 16 << 20, "ranks": 2, "time_us": 1000.0,
            "p99_us": 1200.0, "algbw_gbs": gbs, "busbw_gbs": gbs, "netns": True}


def table(tmp_path, results):
    out = tmp_path / "results.md"
    load_compare().write_table(results, str(out), "test")
    lines = out.read_text().splitlines()
    hdr = next(line for line in lines if line.startswith("| op |"))
    row = next(line for line in lines if line.startswith("| allreduce |"))
    cols = [c.strip() for c in hdr.strip("|").split("|")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cols) == len(cells)
    return dict(zip(cols, cells)), "\n".join(lines)


def test_shares_of_both_ceilings(tmp_path):
    got, text = table(tmp_path, [
        ceiling("stream-both", 2.0, 1.9, 2.1),
        ceiling("stream-both-cold", 1.25, 1.2, 1.3),
        run("gloo", 0.5), run("nexar", 0.8), run("nexar-plain", 1.0),
    ])
    assert got["nexar / 2-way"] == "40 %"
    assert got["nexar-plain / 2-way"] == "50 %"
    assert got["nexar / 2-way cold"] == "64 %"
    assert got["nexar-plain / 2-way cold"] == "80 %"
    assert "out of cache, as a large collective's buffers): 1.25 GB/s per direction " \
           "(before and after the systems: 1.20 and 1.30)" in text


def test_no_cold_column_without_its_ceiling(tmp_path):
    # Results of runs before the out-of-cache streams existed: no column for them.
    got, _ = table(tmp_path, [ceiling("stream-both", 2.0, 2.0, None), run("nexar-plain", 1.0)])
    assert got["nexar-plain / 2-way"] == "50 %"
    assert not any(k.endswith("2-way cold") for k in got)


def test_volume_table(tmp_path):
    """The volume runs' table: link bytes per call against the minimum
    (2 S between 2 hosts), and CPU per call and per link GB."""
    S = 16 << 20
    vol = {"system": "nexar", "op": "volume", "bytes": S, "ranks": 4, "netns": True, "per_host": 2,
           "calls": 18, "link_bytes": 3 * S * 18, "link_ratio": 1.5, "cpu_s_call": 0.012,
           "cpu_s_per_link_gb": 0.012 / (3 * S / 1e9), "time_us": 9000.0}
    out = tmp_path / "results.md"
    load_compare().write_table([run("gloo", 0.5), vol], str(out), "test")
    text = out.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| nexar | 2 |"))
    assert [c.strip() for c in row.strip("|").split("|")] == ["nexar", "2", "48.0 MiB", "1.50", "12.0", "0.24"]
    assert "| volume |" not in text  # not a row of the main table
