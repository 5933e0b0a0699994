"""Weights & Biases through ./run_train.sh, offline (no account, no network), read back from the
run's .wandb file: the same scalars as metrics.jsonl (the eval scores too), the resolved config,
and one W&B run across a relaunch that resumes from a checkpoint. The run trains on a Hugging Face dataset saved by
`datasets` (a column other than `text`), the other ecosystem path a user brings."""

import shutil

import pytest
from helpers import SHORT_RUN, check, corpus_paragraphs, read_jsonl, run_script, save_hf_dataset
from wandb_file import read_run


def train(tmp_path, steps: int):
    return check(
        run_script(
            "run_train.sh",
            [
                *SHORT_RUN,
                "--training.steps",
                str(steps),
                "--metrics.enable_wandb",
                "--eval.enabled",
                "--eval.limit",
                "8",
                "--checkpoint.interval",
                "2",
                "--training.dataset_path",
                str(tmp_path / "hf"),
                "--training.dataset_text_field",
                "body",
                "--job.dump_folder",
                str(tmp_path / "run"),
            ],
            timeout=300,
            WANDB_MODE="offline",
            WANDB_DIR=str(tmp_path / "wandb"),
            WANDB_PROJECT="titanlite-test",
        )
    )


@pytest.mark.slow
def test_wandb_logs_the_metrics_and_config_and_resumes_the_same_run(tmp_path):
    save_hf_dataset(tmp_path / "hf", corpus_paragraphs(), column="body")
    train(tmp_path, 4)
    # Resume from step 2 although step 4 was reached: steps 3-4 are trained again.
    shutil.rmtree(tmp_path / "run" / "checkpoint" / "step-4")
    assert "resuming at step 2" in train(tmp_path, 6).stderr

    run_id = (tmp_path / "run" / "wandb_run_id").read_text().strip()
    files = sorted((tmp_path / "wandb" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 2  # one per launch, both of the one W&B run
    runs = [read_run(f) for f in files]
    assert [r["id"] for r in runs] == [run_id, run_id]

    history = [h for r in runs for h in r["history"] if "loss/train" in h]
    jsonl = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in jsonl] == [1, 2, 3, 4, 3, 4, 5, 6]
    assert [(h["step"], h["loss/train"], h["optim/grad_norm"], h["optim/lr"]) for h in history] == [
        (r["step"], r["loss"], r["grad_norm"], r["lr"]) for r in jsonl
    ]
    assert {"throughput/tps", "memory/peak_gib", "time/step_s"} <= set(history[0])
    scored = [h for r in runs for h in r["history"] if "eval/titanlite_mc/acc" in h]
    assert [
        (h["step"], h["eval/titanlite_mc/acc"], h["eval/titanlite_mc/acc_norm_stderr"])
        for h in scored
    ] == [
        (r["step"], r["eval/titanlite_mc/acc"], r["eval/titanlite_mc/acc_norm_stderr"])
        for r in jsonl
        if "eval/titanlite_mc/acc" in r
    ]
    assert [h["step"] for h in scored] == [4, 6]  # each launch's last step
    goodput = [h for r in runs for h in r["history"] if "goodput/goodput_pct" in h]
    assert [h["step"] for h in goodput] == [4, 6]  # once per launch, at its last step

    config = runs[0]["config"]
    assert config["training"]["dataset_text_field"] == "body"
    assert config["metrics"]["enable_wandb"] is True and config["training"]["steps"] == 4
    assert runs[1]["config"]["training"]["steps"] == 6  # the relaunch's resolved config
