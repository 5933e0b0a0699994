"""torchrun, run in this process, ending with the failed rank's own line and exit code.

    python -m titanlite.launch [torchrun options] -m titanlite.rank titanlite.train [args]

Plain torchrun reports any failed rank as ~30 lines of ChildFailedError and exits 1, so a user
error (exit 2), a non-finite run (3), a preemption (75) or an interrupt (130) all look alike and
the rank's one-line reason scrolls away. Here the ranks run under `titanlite.rank`, which leaves
each failed rank's exit code and last stderr line in torchrun's per-rank error file; this
launcher prints that line last and exits with that code, and keeps torchrun's report in
`<job.dump_folder>/torchrun.log`.

torchrun runs in this very process (not as a child), so every signal reaches it exactly as
before: SIGTERM/SIGUSR1 preemption and Ctrl-C behave as with `python -m torch.distributed.run`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported only once the launch is under way
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from titanlite.core.dump_lock import FolderInUse, hold
from titanlite.core.errors import (
    COLOR_ENV,
    EXIT_DIR_ENV,
    LAUNCHER_PID_ENV,
    OWN_CODES,
    error_line,
    report,
)


class _DropFailureRecord(logging.Filter):
    """torchrun logs "failed (exitcode: N) local_rank: ..." before raising; the launcher says
    it better in one line, so the console does not get it (torchrun.log does, in the report)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("failed (exitcode")


def _dump_folder(training_args: list[str]) -> Path | None:
    """The run's job.dump_folder, for the log; None when the config cannot tell (preflight has
    already vetted it in run_train.sh, so this only fails for a hand-made command line)."""
    try:
        from titanlite.config.loader import load

        args = training_args[1:] if training_args[:1] == ["titanlite.train"] else training_args
        return Path(load(args).job.dump_folder)
    except Exception:
        return None


def _hold_dump_folder(args) -> IO[str] | None:
    """The run's dump-folder lock, held by this launcher across torchrun's restarts of the
    ranks. A multi-node launch has a launcher per node: there global rank 0 takes it."""
    if str(args.nnodes) not in ("1", "1:1"):
        return None
    folder = _dump_folder(list(args.training_script_args))
    return None if folder is None else hold(folder)


def _pick(failures: dict[int, ProcessFailure]) -> tuple[int, ProcessFailure]:
    """The root cause: a rank that exited with one of titanlite's own codes (others were most
    likely stopped by torchrun because of it), earliest first."""
    own = {r: f for r, f in failures.items() if f.exitcode in OWN_CODES}
    # Then a rank that exited by itself (a crash) over ranks killed by a signal: those are
    # usually the ones torchrun stopped with SIGTERM after the crash, and their timestamps can
    # come first.
    crashed = {r: f for r, f in failures.items() if f.exitcode > 0}
    pool = own or crashed or failures
    rank = min(pool, key=lambda r: (pool[r].timestamp, r))
    return rank, pool[rank]


def _message(failure: ProcessFailure) -> str:
    msg = failure.message
    if isinstance(msg, dict):
        msg = msg.get("message", "")
    return str(msg or "").strip()


def _keep_report(report: str, folder: Path | None) -> Path | None:
    if folder is None:
        return None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        log = folder / "torchrun.log"
        with log.open("a") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n{report}\n")
        return log
    except OSError:
        return None


def exit_code(failure: ProcessFailure) -> int:
    code = failure.exitcode
    return 128 - code if code < 0 else code  # killed by signal N: the shell's 128 + N


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        lock = _hold_dump_folder(args)  # noqa: F841 - held until this process ends
    except FolderInUse as e:
        return report(e)
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(
        _DropFailureRecord()
    )
    exit_dir = tempfile.mkdtemp(prefix="titanlite-exits-")
    os.environ[EXIT_DIR_ENV] = exit_dir  # the ranks inherit it through torchrun
    os.environ[LAUNCHER_PID_ENV] = str(os.getpid())  # the ranks die with this process
    os.environ.setdefault(COLOR_ENV, "1" if sys.stderr.isatty() else "0")
    try:
        run(args)
    except SignalException as e:
        # torchrun was signalled itself (Ctrl-C reaches the whole process group; SLURM or a
        # scheduler sends SIGTERM) and has already stopped the ranks, waiting for their final
        # checkpoint: the line to end with is a rank's own.
        code, line = _signalled_outcome(exit_dir, e.sigval)
        if line:
            print(line, file=sys.stderr, flush=True)
        return code
    except ChildFailedError as e:
        rank, failure = _pick(e.failures)
        code = exit_code(failure)
        log = _keep_report(e.format_msg(), _dump_folder(list(args.training_script_args)))
        line = _message(failure)
        if failure.exitcode in OWN_CODES and line:
            print(line, file=sys.stderr, flush=True)
        else:
            how = (
                f"was killed by {signal.Signals(-failure.exitcode).name}"
                if failure.exitcode < 0 and -failure.exitcode in signal.valid_signals()
                else f"exited with code {failure.exitcode}"
            )
            where = f"; torchrun's report: {log}" if log else ""
            last = f": {line}" if line and not line.startswith("To enable traceback") else ""
            print(error_line(f"rank {rank} {how}{last}{where}"), file=sys.stderr, flush=True)
        return code
    finally:
        shutil.rmtree(exit_dir, ignore_errors=True)
    return 0


def _signalled_outcome(exit_dir: str, sigval: signal.Signals) -> tuple[int, str]:
    """(exit code, line) of the rank that exited with one of titanlite's own codes, earliest
    first; else the shell's code for the signal, with no line of ours to add."""
    outcomes = []
    for path in Path(exit_dir).glob("rank*.json"):
        try:
            outcomes.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    own = sorted((o for o in outcomes if o.get("code") in OWN_CODES), key=lambda o: o["time"])
    if own:
        return int(own[0]["code"]), str(own[0].get("line", ""))
    return 128 + int(sigval), ""


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
