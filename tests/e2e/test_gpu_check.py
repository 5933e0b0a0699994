"""The prepared GPU session's CPU rehearsal, through the script an operator runs on the GPU."""

import json

import pytest
from helpers import check, run_script


@pytest.mark.slow
def test_gpu_check_smoke_runs_every_check(tmp_path):
    proc = check(
        run_script("scripts/bench_gpu.sh", ["--smoke", "--checks-only"], OUT=str(tmp_path))
    )
    summary = json.loads((tmp_path / "gpu_check" / "gpu_check.json").read_text())
    status = {r["check"]: r["status"] for r in summary["results"]}
    assert summary["smoke"] and summary["device"] is None
    # Everything CPU can run passes; the CUDA-allocator checks say why they did not run.
    assert status == {
        "a": "PASS",
        "b": "PASS",
        "c": "PASS",
        "d": "PASS",
        "e": "SKIPPED",
        "f": "SKIPPED",
        "g": "PASS",
        "h": "PASS",
    }, summary["results"]
    by_check = {r["check"]: r for r in summary["results"]}
    assert "needs the CUDA caching allocator" in by_check["e"]["figure"]
    assert "predicted" in by_check["f"]["figure"]  # the dry run itself ran and was parsed
    assert "fell back to 'async'" in by_check["c"]["name"]
    # Every parameter of the model is compared, and printed with its error.
    grads = by_check["a"]["per_parameter"]
    assert len(grads) == 21 and all(r["rel"] is not None and not r["lost"] for r in grads.values())
    assert "tok_embeddings.weight" in proc.stdout and "rel " in proc.stdout
    assert "'auto' (varlen)" in by_check["g"]["name"]  # the default kernel is the one compared
    assert "cp 2/4/8" in by_check["h"]["name"]
    for key in "abcdefgh":
        assert f"({key}) " in proc.stdout
    table = (tmp_path / "gpu_check" / "gpu_check.txt").read_text()
    assert table.count("| PASS |") == 6 and table.count("| SKIPPED |") == 2
    assert (tmp_path / "gpu_check" / "logs" / "c_resumed.log").exists()
