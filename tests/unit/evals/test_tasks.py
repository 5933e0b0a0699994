"""Task files as lm-eval-harness reads them, the requests as it tokenizes them, the scores as it
computes them; every broken task a TaskError naming the file and the fix."""

import json
import math

import pytest

from titanlite.data import Tokenizer, resolve_tokenizer_path
from titanlite.evals import TaskError, build_requests, load_task, score
from titanlite.evals.requests import encode_pair

DOCS = [
    {"q": "The sky is", "options": ["blue", "made of cheese"], "answer": 0},
    {"q": "Two and two make", "options": ["five", "four"], "answer": 1},
]


def _yaml(tmp_path, body: str, docs=DOCS) -> str:
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    path = tmp_path / "task.yaml"
    path.write_text(body)
    return str(path)


BASE = """\
task: sky
dataset_path: json
dataset_kwargs:
  data_files:
    test: data.jsonl
test_split: test
output_type: multiple_choice
"""


def test_fields_and_templates_read_as_lm_eval_reads_them(tmp_path):
    fields = load_task(
        _yaml(tmp_path, BASE + "doc_to_text: q\ndoc_to_choice: options\ndoc_to_target: answer\n")
    )
    templated = load_task(
        _yaml(
            tmp_path,
            BASE + 'doc_to_text: "Q: {{q}}"\n'
            'doc_to_choice: "{{options}}"\n'  # rendered, then a Python literal
            'doc_to_target: "{{options[answer]}}"\n'  # the right choice's text
            'description: "Answer. "\n',
        )
    )
    assert fields.name == "sky" and fields.target_delimiter == " "
    assert [e.context for e in fields.examples] == ["The sky is", "Two and two make"]
    assert [e.context for e in templated.examples] == [
        "Answer. Q: The sky is",
        "Answer. Q: Two and two make",
    ]
    for task in (fields, templated):
        assert [e.choices for e in task.examples] == [("blue", "made of cheese"), ("five", "four")]
        assert [e.gold for e in task.examples] == [0, 1]
    assert len(load_task("titanlite_mc", limit=3).examples) == 3


def test_plain_jsonl_and_the_builtin_task(tmp_path):
    path = tmp_path / "plain.jsonl"
    path.write_text(json.dumps({"context": "a", "choices": ["b", "c"], "label": 1}) + "\n")
    task = load_task(str(path))
    assert task.name == "plain" and task.examples[0].gold == 1
    builtin = load_task("titanlite_mc")
    assert len(builtin.examples) == 40 and all(len(e.choices) == 4 for e in builtin.examples)


@pytest.mark.parametrize(
    "extra, docs, message",
    [
        (
            "doc_to_text: q\ndoc_to_choice: options\ndoc_to_target: answer\nnum_fewshot: 5\n",
            DOCS,
            "only zero-shot",
        ),
        (
            "doc_to_text: q\ndoc_to_choice: options\ndoc_to_target: answer\nprocess_docs: !!str x\n",
            DOCS,
            "process_docs not supported",
        ),
        (
            "doc_to_text: q\ndoc_to_choice: options\ndoc_to_target: 7\n",
            DOCS,
            "is not an index of the 2 choices",
        ),
        (
            "doc_to_text: q\ndoc_to_choice: options\ndoc_to_target: answer\n",
            [{"q": "x", "options": "ab", "answer": 0}],
            "choices must be a list",
        ),
        (
            'doc_to_text: "{{missing}}"\ndoc_to_choice: options\ndoc_to_target: answer\n',
            DOCS,
            "'missing' is undefined",
        ),
        (
            'doc_to_text: q\ndoc_to_choice: options\ndoc_to_target: "nope"\n',
            DOCS,
            "is not one of the choices",
        ),
        (
            "doc_to_text: q\ndoc_to_choice: options\ndoc_to_target: answer\nmetric_list:\n  - metric: f1\n",
            DOCS,
            "only acc, acc_norm",
        ),
    ],
)
def test_broken_tasks_are_named(tmp_path, extra, docs, message):
    with pytest.raises(TaskError, match=message) as e:
        load_task(_yaml(tmp_path, BASE + extra, docs))
    assert str(tmp_path) in str(e.value) and "\n" not in str(e.value)


def test_hub_datasets_and_missing_files_are_refused(tmp_path):
    hub = BASE.replace("dataset_path: json", "dataset_path: allenai/ai2_arc")
    with pytest.raises(TaskError, match="no hub access"):
        load_task(_yaml(tmp_path, hub + "doc_to_text: q\n"))
    with pytest.raises(TaskError, match="neither a built-in task"):
        load_task(str(tmp_path / "absent.yaml"))
    (tmp_path / "data.jsonl").write_text("{not json\n")
    (tmp_path / "t.yaml").write_text(
        BASE + "doc_to_text: q\ndoc_to_choice: options\ndoc_to_target: answer\n"
    )
    with pytest.raises(TaskError, match="line 1: not JSON"):
        load_task(str(tmp_path / "t.yaml"))


def test_requests_follow_lm_eval_tokenization():
    tok = Tokenizer(resolve_tokenizer_path(""))
    # Trailing spaces of the context move to the continuation; the continuation's tokens are
    # those of the whole text past the context's.
    head, tail = encode_pair(tok.encode, "The sky is ", "blue")
    assert head == tok.encode("The sky is") and head + tail == tok.encode("The sky is blue")
    task = load_task("titanlite_mc", limit=2)
    requests = build_requests(task, tok.encode, seq_len=28, prefix_id=tok.bos_id)
    assert [(r.example, r.choice) for r in requests] == [(i, j) for i in range(2) for j in range(4)]
    for r in requests:
        ex = task.examples[r.example]
        whole = tok.encode(ex.context + " " + ex.choices[r.choice])
        assert list(r.tokens) == whole[-29:]  # the last seq_len + 1 tokens
        assert r.continuation == len(whole) - len(tok.encode(ex.context))
    assert any(len(r.tokens) == 29 for r in requests)  # one was cut on the left
    with pytest.raises(TaskError, match="must be 1 to training.seq_len = 8 tokens"):
        build_requests(task, tok.encode, seq_len=8, prefix_id=tok.bos_id)


def test_scores_as_lm_eval_computes_them(tmp_path):
    path = tmp_path / "t.jsonl"
    rows = [
        {"context": "c", "choices": ["a", "bbbb"], "label": 1},  # acc 0, acc_norm 1
        {"context": "c", "choices": ["aa", "b"], "label": 0},  # acc 1, acc_norm 1
        {"context": "c", "choices": ["x", "y"], "label": 1},  # a tie: the first wins, acc 0
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = load_task(str(path))
    got = score(task, [-1.0, -2.0, -1.0, -3.0, -5.0, -5.0])
    assert got["acc"] == pytest.approx(1 / 3) and got["acc_norm"] == pytest.approx(2 / 3)
    # The sample standard deviation over the examples, over sqrt(n).
    assert got["acc_stderr"] == pytest.approx(
        math.sqrt((2 * (1 / 3) ** 2 + (2 / 3) ** 2) / 2) / math.sqrt(3)
    )
    assert got["acc_norm_stderr"] == pytest.approx(got["acc_stderr"])


def test_the_dry_run_states_the_eval_cost():
    from titanlite.config import loader
    from titanlite.planning.eval_plan import eval_cost

    job = loader.load(["--eval.enabled", "--eval.limit", "10", "--training.local_batch_size", "4"])
    line = eval_cost(job, dp_size=2, grad_accum_steps=1, flops_per_step=3e12)
    # 10 examples x 4 choices over 2 ranks, 4 rows a forward; a forward is 1/3 of a step.
    assert "40 requests of 1 task(s) every 100 steps: 5 forward(s) of 4 x 2048 tokens" in line
    assert "~1.67 training steps (5.00e+12 FLOPs)" in line
    assert eval_cost(loader.load(["--eval.enabled", "false"]), 2, 1, 3e12) == ""
