"""Make the built-in eval task, titanlite_mc: sentence endings from the bundled corpus.

Each example is a sentence of a prose file but its last ENDING_WORDS words (the context), its
true ending and the endings of three other sentences (the choices, in a seeded random order).
Short endings keep every request within a short training.seq_len (at most 27 tokens with the
bundled tokenizer). A model that has
learned the corpus picks the true ending; chance is 25%. The task is in lm-eval-harness's format
(titanlite_mc.yaml beside test.jsonl), so `lm_eval --include_path` scores it too.

    python scripts/make_eval_task.py            # writes titanlite/assets/evals/titanlite_mc/
"""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from titanlite.core.arguments import ArgumentParser, int_arg  # noqa: E402

CORPUS = ROOT / "titanlite" / "assets" / "corpus"
ENDING_WORDS = 5
OUT = ROOT / "titanlite" / "assets" / "evals" / "titanlite_mc"
YAML = """\
# titanlite's built-in eval task (scripts/make_eval_task.py): pick a corpus sentence's true
# ending among four. lm-eval-harness 0.4 reads it as is (data_files relative to the working
# directory there; titanlite reads it relative to this file).
task: titanlite_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: test.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: "{{context}}"
doc_to_choice: choices
doc_to_target: label
metric_list:
  - metric: acc
  - metric: acc_norm
"""


def sentences() -> list[list[str]]:
    """The prose files' sentences of 10 to 30 words, as word lists, in file order."""
    found = []
    for path in sorted(CORPUS.glob("prose_*.txt")):
        text = " ".join(path.read_text(encoding="utf-8").split())
        for s in re.split(r"(?<=[.!?])\s+", text):
            words = s.split()
            if 10 <= len(words) <= 30:
                found.append(words)
    return found


def examples(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    pool = sentences()
    picked = rng.sample(range(len(pool)), count)
    out = []
    for i in picked:
        words = pool[i]
        ending = " ".join(words[-ENDING_WORDS:])
        others = rng.sample([j for j in range(len(pool)) if j != i], 3)
        choices = [ending] + [" ".join(pool[j][-ENDING_WORDS:]) for j in others]
        order = list(range(4))
        rng.shuffle(order)
        out.append(
            {
                "context": " ".join(words[:-ENDING_WORDS]),
                "choices": [choices[k] for k in order],
                "label": order.index(0),
            }
        )
    return out


def main() -> None:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int_arg(4, 500), default=40)
    parser.add_argument("--seed", type=int_arg(0), default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = examples(args.count, args.seed)
    (args.out / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (args.out / "titanlite_mc.yaml").write_text(YAML)
    print(f"make_eval_task: {len(rows)} examples in {args.out}")


if __name__ == "__main__":
    main()
