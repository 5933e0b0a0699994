"""The scripts behind the context-parallel figures in docs/parallelism.md and
docs/performance.md, run at tiny sizes: they run, print their tables, and cp_memory's claim (the
default kernel's per-rank peak within 1/cp + 15% of one process's) holds."""

import re

import pytest
from helpers import check, run_python


@pytest.mark.slow
def test_cp_memory_measures_both_kernels_and_checks_its_bound():
    proc = check(
        run_python(
            ["scripts/cp_memory.py", "--seq", "512", "--cps", "1", "2", "--mask", "block_causal"]
        )
    )
    rows = [line.split() for line in proc.stdout.splitlines() if re.match(r"\s+\d\s", line)]
    assert [r[0] for r in rows] == ["1", "2"], proc.stdout
    auto_ratio, sdpa_ratio = float(rows[1][2]), float(rows[1][4])
    assert auto_ratio <= 0.5 + 0.15 and sdpa_ratio < 1
    assert "'auto' within the bound" in proc.stdout


@pytest.mark.slow
def test_bench_cp_attention_times_every_rank_of_both_kernels():
    proc = check(
        run_python(
            ["scripts/bench_cp_attention.py", "--seq", "512", "--repeats", "1", "--cps", "2"]
        )
    )
    rows = [
        line for line in proc.stdout.splitlines() if re.match(r"\| (causal|block_causal) \|", line)
    ]
    assert len(rows) == 4, proc.stdout  # two masks x two ranks
    causal_share = [float(r.split("|")[-2]) for r in rows[:2]]
    # Head-tail: every rank computes the same pairs, S(S+1)/(2 cp) of them.
    assert causal_share == [pytest.approx(1 + 1 / 512, abs=1e-3)] * 2
