"""The Qwen3 presets through the launcher's surface: the dry run plans Qwen3-8B on 8 GPUs, a
tied flavor under pipeline parallel is one line, exit 2 (its head is its embedding, which no
pipeline split can put on two stages), and the MoE debug preset trains on 2 ranks, its experts
split over them, with its load figures in metrics.jsonl."""

from helpers import dry_run, expect_one_line, read_jsonl, run_train


def test_the_dry_run_plans_qwen3_8b_on_8_gpus():
    proc = dry_run("--config", "qwen3_8b.toml", "--dry-run.world_size", "8")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout + proc.stderr
    assert "dry run: qwen3 8B, 8.19B parameters, world 8" in out and "-> FITS" in out, out


def test_a_tied_flavor_under_pipeline_parallel_is_one_line():
    proc = dry_run(
        "--config",
        "qwen3_0.6b.toml",
        "--dry-run.world_size",
        "2",
        "--parallelism.pipeline_parallel_degree",
        "2",
    )
    expect_one_line(proc, 2, "model.flavor = '0.6B' ties its output head to the embedding")


def test_a_llama_only_model_key_for_qwen3_is_one_line_not_ignored():
    proc = dry_run(
        "--config", "qwen3_8b.toml", "--dry-run.world_size", "8", "--model.multiple_of", "512"
    )
    expect_one_line(proc, 2, "[model] multiple_of = 512 is no hyper-parameter of qwen3 models")


def test_the_moe_debug_preset_trains_on_two_ranks_and_logs_its_load(tmp_path):
    """With its experts split over the 2 ranks (expert parallel), from the command line."""
    proc = run_train(
        ["--config", "qwen3_moe_debug.toml", "--training.steps", "2"]
        + ["--model.moe_load_balance", "expert_bias", "--job.dump_folder", str(tmp_path)]
        + ["--parallelism.expert_parallel_degree", "2"],
        NGPU="2",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    layers = {f"layers.{i}.feed_forward" for i in range(4)}
    for r in records:
        assert set(r["moe_imbalance"]) == layers
        assert r["moe_imbalance_max"] == max(r["moe_imbalance"].values()) >= 1
        assert "moe_aux_loss" not in r  # the expert bias balances, no aux loss
    assert "moe imbalance" in proc.stderr
    assert "mesh dp_shard=2, experts: ep=2 x efsdp=1 (world 2)" in proc.stderr


def test_a_tokenizer_larger_than_a_published_vocabulary_is_one_line(tmp_path):
    """Qwen3-0.6B's embedding has 151,936 rows (its tokenizer's 151,669 tokens, padded): a
    tokenizer with more tokens cannot be this model's, and is refused before anything is built."""
    from tokenizers import Tokenizer, models

    path = tmp_path / "tokenizer.json"
    vocab = {f"t{i}": i for i in range(152_000)}
    Tokenizer(models.WordLevel(vocab, unk_token="t0")).save(str(path))
    (tmp_path / "tokenizer_config.json").write_text('{"bos_token": "t1", "eos_token": "t2"}')
    # Through ./run_train.sh itself: preflight refuses it before a process group exists.
    proc = run_train(
        ["--config", "qwen3_0.6b.toml", "--model.tokenizer_path", str(path)]
        + ["--job.dump_folder", str(tmp_path / "out")]
    )
    expect_one_line(proc, 2, "has 152000 tokens, more than the 151936 embedding rows of qwen3 0.6B")
