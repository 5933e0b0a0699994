"""Submit a training job to SLURM: scripts/multinode_trainer.slurm with this job's #SBATCH lines.

    python scripts/submit.py --config llama_8b.toml --nodes 4 --ngpu 8 --partition train \\
        --time 48:00:00 [--account ACC] [--job-name NAME] [--no-submit] [--section.key value ...]

The config and overrides are checked first (a mistake is one line, exit 2, nothing submitted),
then the script is written to logs/NAME-TIME.slurm (what ran is kept next to its log) and
submitted with sbatch. Prints the job id, the log file and the TensorBoard folder. --ngpu 0
means CPU nodes (gloo, one rank per node). See docs/slurm.md.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "scripts" / "multinode_trainer.slurm"


def sbatch_script(
    template: str,
    *,
    nodes: int,
    ngpu: int,
    partition: str | None,
    time_limit: str,
    account: str | None,
    job_name: str,
    log: str,
) -> str:
    """The template with its #SBATCH lines set; the rest (comments included) unchanged."""
    values = {
        "--job-name": job_name,
        "--nodes": str(nodes),
        "--time": time_limit,
        "--output": log,
        "--gres": f"gpu:{ngpu}" if ngpu > 0 else None,
        "--partition": partition,
    }
    out = []
    for line in template.splitlines():
        m = re.match(r"#SBATCH (--[a-z-]+)=(\S+)(.*)", line)
        if m and m.group(1) in values:
            if values[m.group(1)] is None:  # no GPUs / the cluster's default partition
                continue
            line = f"#SBATCH {m.group(1)}={values[m.group(1)]}{m.group(3)}"
        elif m and m.group(1) == "--cpus-per-task" and ngpu == 0:
            continue  # CPU nodes: whatever the node has
        out.append(line)
        if m and m.group(1) == "--partition" and account:
            out.append(f"#SBATCH --account={account}")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT))
    from titanlite.config.schema import WORLD_MAX
    from titanlite.core.arguments import ArgumentParser, int_arg
    from titanlite.core.errors import report

    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="train_configs/llama_8b.toml")
    p.add_argument("--nodes", type=int_arg(1, WORLD_MAX), default=4)
    p.add_argument(
        "--ngpu", type=int_arg(0, 1024), default=8, help="GPUs (ranks) per node; 0 = CPU nodes"
    )
    p.add_argument("--partition", default=None, help="default: the cluster's default partition")
    p.add_argument("--time", default="48:00:00", dest="time_limit")
    p.add_argument("--account", default=None)
    p.add_argument("--job-name", default="titanlite")
    p.add_argument("--no-submit", action="store_true", help="write the script, do not sbatch it")
    args, overrides = p.parse_known_args(argv)

    from titanlite.config import loader as config
    from titanlite.preflight import checks as preflight

    ranks_per_node = max(args.ngpu, 1)
    try:
        job = config.load(["--config", args.config, *overrides])
        # Checked for the compute nodes' device, not this (often GPU-less) login node's.
        preflight.check(job, args.nodes * ranks_per_node, device="cuda" if args.ngpu else "cpu")
    except preflight.user_errors() as e:
        return report(e)

    logs = ROOT / "logs"
    logs.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    script = logs / f"{args.job_name}-{stamp}.slurm"
    script.write_text(
        sbatch_script(
            TEMPLATE.read_text(),
            nodes=args.nodes,
            ngpu=args.ngpu,
            partition=args.partition,
            time_limit=args.time_limit,
            account=args.account,
            job_name=args.job_name,
            log=str(logs / "%x-%j.out"),
        )
    )
    dump = Path(job.job.dump_folder)
    dump = dump if dump.is_absolute() else ROOT / dump
    if args.no_submit:
        print(f"wrote {script} (not submitted)")
        return 0
    env = {**os.environ, "NGPU": str(ranks_per_node)}
    proc = subprocess.run(
        ["sbatch", "--parsable", str(script), "--config", args.config, *overrides],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        return report(f"sbatch failed: {proc.stderr.strip()}", 1)
    job_id = proc.stdout.strip().split(";")[0]
    print(
        f"submitted job {job_id}: {args.nodes} node(s) x {ranks_per_node} rank(s)\n"
        f"  log:         {logs / f'{args.job_name}-{job_id}.out'}\n"
        f"  outputs:     {dump}\n"
        f"  tensorboard: tensorboard --logdir {dump / job.metrics.save_tb_folder}\n"
        f"  follow:      squeue -j {job_id}; tail -f {logs / f'{args.job_name}-{job_id}.out'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
