"""The in-loop evaluation equals lm-eval-harness on the exported model: a few steps of the debug
preset through ./run_train.sh with [eval] on and the last checkpoint exported to Hugging Face,
then lm-eval's HFLM on that folder with the same task YAML."""

import json

import pytest
from helpers import expect_one_line, in_pairs, run_script

from titanlite.evals.tasks import BUILTIN_TASKS

STEPS = 4


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("eval")
    done = run_script(
        "run_train.sh",
        [
            "--training.steps",
            str(STEPS),
            "--eval.enabled",
            "--eval.log_samples",
            "--checkpoint.enable_checkpoint",
            "--checkpoint.interval",
            str(STEPS),
            "--checkpoint.last_save_in_hf",
            "--metrics.enable_tensorboard",
            "false",
            "--job.dump_folder",
            str(folder),
        ],
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return folder, done.stdout + done.stderr


def _lm_eval(hf_folder, tmp_path) -> dict:
    lm_eval = pytest.importorskip("lm_eval", reason="lm-eval (the dev extra) is not installed")
    from lm_eval.tasks import TaskManager

    # The shipped YAML, its data file made absolute: lm-eval reads data_files from the
    # working directory, titanlite from the YAML's folder.
    yaml = BUILTIN_TASKS["titanlite_mc"]
    text = yaml.read_text().replace("test: test.jsonl", f"test: {yaml.parent / 'test.jsonl'}")
    (tmp_path / "titanlite_mc.yaml").write_text(text)
    return lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={hf_folder},dtype=float32",
        tasks=["titanlite_mc"],
        task_manager=TaskManager(include_path=str(tmp_path)),
        log_samples=True,
        batch_size=8,
        device="cpu",
    )


@pytest.mark.slow
def test_in_loop_scores_equal_lm_eval_on_the_export(run, tmp_path):
    folder, log = run
    assert f"eval step {STEPS}: titanlite_mc acc " in log  # the shipped task, in the log
    record = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()][-1]
    mine = [
        json.loads(line)
        for line in (folder / "eval_samples" / f"step-{STEPS}" / "titanlite_mc.jsonl")
        .read_text()
        .splitlines()
    ]
    out = _lm_eval(folder / "checkpoint" / f"hf-step-{STEPS}", tmp_path)
    theirs = out["results"]["titanlite_mc"]
    for metric in ("acc", "acc_norm"):
        assert record[f"eval/titanlite_mc/{metric}"] == theirs[f"{metric},none"], metric
        assert record[f"eval/titanlite_mc/{metric}_stderr"] == pytest.approx(
            theirs[f"{metric}_stderr,none"], rel=1e-12
        )
    worst = 0.0
    samples = out["samples"]["titanlite_mc"]
    assert len(samples) == 40 and len(mine) == 160
    for sample in samples:
        for choice, resp in enumerate(sample["resps"]):
            got = mine[sample["doc_id"] * 4 + choice]
            assert (got["example"], got["choice"]) == (sample["doc_id"], choice)
            worst = max(worst, abs(got["loglikelihood"] - resp[0][0]))
    print(f"in-loop vs lm-eval: acc {theirs['acc,none']}, worst log-likelihood gap {worst:.2e}")
    assert worst <= 1e-4, worst


@pytest.mark.slow
def test_broken_tasks_stop_the_launch_with_one_line(tmp_path):
    fewshot = tmp_path / "fewshot.yaml"
    yaml = BUILTIN_TASKS["titanlite_mc"]
    fewshot.write_text(yaml.read_text() + "num_fewshot: 5\n")
    (tmp_path / "test.jsonl").write_text((yaml.parent / "test.jsonl").read_text())
    plain = tmp_path / "plain.jsonl"
    plain.write_text('{"context": "a", "choices": ["b"], "label": 0}\n')

    def run(name: str, *extra: str) -> tuple:
        return ["--job.dump_folder", str(tmp_path / name), "--eval.enabled", *extra], {}

    got = in_pairs(
        {
            "fewshot": run("fewshot", "--eval.tasks", str(fewshot)),
            "absent": run("absent", "--eval.tasks", "hellaswag"),
            "one_choice": run("one_choice", "--eval.tasks", str(plain)),
            "short": run("short", "--training.seq_len", "16"),
        }
    )
    expect_one_line(got["fewshot"], 2, "titanlite: error:", str(fewshot), "only zero-shot")
    expect_one_line(got["absent"], 2, "'hellaswag' is neither a built-in task (titanlite_mc)")
    expect_one_line(got["one_choice"], 2, "line 1: choices must be a list of at least 2")
    expect_one_line(got["short"], 2, "titanlite_mc example", "training.seq_len = 16 tokens")
    for name in got:  # refused before anything was written
        assert not (tmp_path / name).exists(), name
