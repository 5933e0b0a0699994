"""`python -m titanlite.train ARGS`: what run_train.sh (through torchrun and titanlite.rank, which
calls `main`) and SLURM start. titanlite.cli turns every outcome into one line and an exit code."""

from __future__ import annotations

from titanlite.cli import cli, main, outcome

__all__ = ["cli", "main", "outcome"]

if __name__ == "__main__":
    cli()
