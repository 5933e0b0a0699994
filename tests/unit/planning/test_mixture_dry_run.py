"""`--dry-run` prints the data mixture's plan for the cluster's global batch: targets, achieved
shares and tokens from the config alone; epochs where a source's manifest is readable here
(unknown for a path that is only on the cluster); a source read past its max_repetition is
marked in the plan, printed whole, and then refused with training's own line (exit 2)."""

from pathlib import Path

from helpers import DEBUG_CONFIG, dry_run

from titanlite.data import BUILTIN_DATASETS
from titanlite.data.prepare import prepare
from titanlite.data.shards import ShardSet


def test_the_dry_run_prints_the_mixture_plan_at_the_clusters_batch(tmp_path):
    code = tmp_path / "code"
    prepare(sorted(Path(BUILTIN_DATASETS["titanlite_corpus"]).glob("code_*")), code, quiet=True)
    config = tmp_path / "mix.toml"
    sources = {"code": (code, 0.25, 1.0), "web": ("/cluster/web", 0.75, 1.0)}
    config.write_text(
        DEBUG_CONFIG.read_text()
        + "".join(
            f'\n[[data.sources]]\nname = "{n}"\npath = "{p}"\nweight = {w}\nmax_repetition = {r}\n'
            for n, (p, w, r) in sources.items()
        )
        + "\n[[data.phases]]\nstart_step = 51\nweights = { code = 0.75, web = 0.25 }\n"
    )
    # 100 steps of 8 sequences x 32 ranks x 256 tokens: 25,600 windows, half of them in each
    # phase; code takes 25% then 75% of them (50% over the run).
    # --dry-run.vocab_size: plan as for a cluster (no tokenizer or data path checked here).
    cluster = ("--dry-run.world_size", "32", "--dry-run.vocab_size", "2000")
    proc = dry_run("--config", str(config), "--training.steps", "100", *cluster)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("titanlite: error: data source 'code' would")
    lines = proc.stdout[proc.stdout.index("data mixture:") :].splitlines()
    code_row, web_row = lines[1].split(), lines[2].split()
    assert code_row[:4] == ["code", "50.00%", "50.00%", f"{12_800 * 256:,}"], lines
    assert web_row[:4] == ["web", "50.00%", "50.00%", f"{12_800 * 256:,}"], lines
    per_epoch = ShardSet(code).num_windows(256)
    assert float(code_row[4]) == round(12_800 / per_epoch, 3)
    assert " ".join(web_row[4:]) == "unknown (not read here)"
    # The bundled code files hold far fewer than 12,800 windows: the plan says when it runs out.
    assert (
        f"OVERRUN: code would be read {12_800 / per_epoch:.2f} times, past max_repetition = 1"
        in (proc.stdout)
    )
