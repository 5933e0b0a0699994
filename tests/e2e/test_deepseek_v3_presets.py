"""The DeepSeek-V3 presets through the launcher's surface: the dry run plans 671B on 256 and
2,048 GPUs (expert parallel inside FSDP; and without MTP under pipeline parallel), the debug
preset trains on 2 ranks with its experts split over them and logs its MTP loss, and the
family's mistakes are one line, exit 2, before anything is built."""

import pytest
from helpers import dry_run, expect_one_line, preflight_cases, read_jsonl, run_train

DEBUG = ["--config", "deepseek_v3_debug.toml"]


@pytest.mark.parametrize("world", [256, 2048])
def test_the_dry_run_plans_671b(world):
    proc = dry_run("--config", "deepseek_v3_671b.toml", "--dry-run.world_size", str(world))
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout + proc.stderr
    # 671B and the MTP module's 11.5B (without the copies of the embedding and head the
    # published checkpoint keeps for it: titanlite shares the main model's).
    assert f"dry run: deepseek_v3 671B, 682.64B parameters, world {world}" in out, out
    assert "EP 64 x efsdp" in out and "-> FITS" in out, out


def test_the_dry_run_plans_671b_under_pipeline_parallel_without_mtp():
    proc = dry_run(
        "--config",
        "deepseek_v3_671b.toml",
        "--dry-run.world_size",
        "2048",
        "--model.mtp_depth",
        "0",
        "--parallelism.pipeline_parallel_degree",
        "8",
        "--training.local_batch_size",
        "8",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout + proc.stderr
    assert "671.03B parameters" in out and "pp=8 x dp_shard=256" in out, out


def test_the_debug_preset_trains_on_two_ranks_with_expert_parallel_and_logs_its_mtp_loss(
    tmp_path,
):
    proc = run_train(
        [*DEBUG, "--training.steps", "2", "--job.dump_folder", str(tmp_path)]
        + ["--parallelism.expert_parallel_degree", "2"],
        NGPU="2",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        # 1 dense block, 3 MoE blocks and the MTP module's MoE block
        assert set(r["moe_imbalance"]) == {f"layers.{i}.feed_forward" for i in (1, 2, 3)} | {
            "mtp.4.block.feed_forward"
        }
        assert 0 < r["loss_mtp"] < 10 and r["moe_aux_loss"] > 0  # the sequence-wise loss
    assert "loss_mtp" in proc.stderr
    assert "mesh dp_shard=2, experts: ep=2 x efsdp=1 (world 2)" in proc.stderr


def test_the_familys_mistakes_are_one_line_before_anything_is_built():
    world3 = {"NGPU": "3"}
    cases = {
        "kv_latent_0": ([*DEBUG, "--model.kv_lora_rank", "0"], {}),
        "topk_group": ([*DEBUG, "--model.moe_topk_group", "5"], {}),
        "heads_tp": ([*DEBUG, "--parallelism.tensor_parallel_degree", "3"], world3),
        "experts_ep": ([*DEBUG, "--parallelism.expert_parallel_degree", "3"], world3),
        "mtp_pp": ([*DEBUG, "--parallelism.pipeline_parallel_degree", "2"], {"NGPU": "2"}),
    }
    got = preflight_cases(cases, shell=("kv_latent_0", "mtp_pp"))
    expect_one_line(got["kv_latent_0"], 2, "[model] kv_lora_rank = 0: must be >= 1")
    expect_one_line(got["topk_group"], 2, "topk_group 5 must be in 1..n_group (4)")
    expect_one_line(got["heads_tp"], 2, "n_heads = 8 is not divisible by")
    expect_one_line(got["experts_ep"], 2, "this model has 8 experts: pick a divisor of it")
    expect_one_line(
        got["mtp_pp"], 2, "model.mtp_depth = 1 (multi-token prediction) is not built for pipeline"
    )
