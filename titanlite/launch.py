"""torchrun, run in this process, ending with the failed rank's own line and exit code.

    python -m titanlite.launch [torchrun options] -m titanlite.rank titanlite.train [args]

Plain torchrun reports any failed rank as ~30 lines of ChildFailedError and exits 1, so a user
error (exit 2), a non-finite run (3), a preemption (75) or an interrupt (130) all look alike and
the rank's one-line reason scrolls away; and a rank killed by kill -9 or the OOM killer takes
its peers down with it ("Connection closed by peer"), each printing a traceback. Here the ranks
run under `titanlite.rank`, which leaves each failed rank's exit code, last stderr line and
traceback in torchrun's per-rank error file; this launcher prints the root cause's line last (a
rank killed by a signal over the peers that failed because it vanished) and exits with its code
(128 + N for signal N), and keeps torchrun's report, the other ranks' tracebacks in it, in
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


class _TorchrunLog(logging.Filter):
    """Reads torchrun's process log. Its "failed (exitcode: N) local_rank: ..." the launcher
    says better in one line, so the console does not get it (torchrun.log does, in the report);
    its "Sending process P closing signal S" tells the ranks torchrun stopped itself from a rank
    killed from outside, the one to blame."""

    def __init__(self) -> None:
        super().__init__()
        self.signalled: set[int] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        pid = record.args[0] if isinstance(record.args, tuple) and record.args else None
        if msg.startswith("Sending process") and isinstance(pid, int):
            self.signalled.add(pid)
        return not msg.startswith("failed (exitcode")


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


def _pick(
    failures: dict[int, ProcessFailure], signalled: set[int], times: dict[int, float]
) -> tuple[int, ProcessFailure]:
    """The root cause, earliest first: a rank killed by a signal torchrun did not send (kill -9,
    the OOM killer), though its peers, failing because it vanished (exit 1, "Connection closed
    by peer"), may have reported first; else a rank that exited with one of titanlite's own
    codes (others were most likely stopped by torchrun because of it)."""
    killed = {r: f for r, f in failures.items() if f.exitcode < 0 and f.pid not in signalled}
    own = {r: f for r, f in failures.items() if f.exitcode in OWN_CODES}
    # Then a rank that exited by itself (a crash) over ranks torchrun then stopped with SIGTERM,
    # whose timestamps can come first.
    crashed = {r: f for r, f in failures.items() if f.exitcode > 0}
    pool = killed or own or crashed or failures
    # titanlite.rank's times to the microsecond: torchrun's are whole seconds.
    rank = min(pool, key=lambda r: (times.get(r, pool[r].timestamp), r))
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
    torchrun_log = _TorchrunLog()
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(torchrun_log)
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
        times = _exit_times(exit_dir, e.failures)
        rank, failure = _pick(e.failures, torchrun_log.signalled, times)
        log = _keep_report(e.format_msg(), _dump_folder(list(args.training_script_args)))
        _say_failure(rank, failure, log)
        return exit_code(failure)
    finally:
        shutil.rmtree(exit_dir, ignore_errors=True)
    return 0


def _say_failure(rank: int, failure: ProcessFailure, log: Path | None) -> None:
    """The failed rank's own line; else a line naming the rank and how it ended, after a crash's
    traceback (titanlite.rank leaves it in the error file instead of printing it)."""
    line = _message(failure)
    if failure.exitcode in OWN_CODES and line:
        print(line, file=sys.stderr, flush=True)
        return
    code = failure.exitcode
    if code < 0 and -code in signal.valid_signals():
        how = f"was killed by {signal.Signals(-code).name} (signal {-code})"
    else:
        last = f": {line}" if line and not line.startswith("To enable traceback") else ""
        how = f"exited with code {code}{last}"
        if callstack := _callstack(failure):
            print(callstack.rstrip(), file=sys.stderr)
    where = f"; torchrun's report: {log}" if log else ""
    print(error_line(f"rank {rank} {how}{where}"), file=sys.stderr, flush=True)


def _callstack(failure: ProcessFailure) -> str:
    msg = failure.message
    return str(msg.get("extraInfo", {}).get("py_callstack", "")) if isinstance(msg, dict) else ""


def _outcomes(exit_dir: str) -> dict[int, dict]:
    """{rank: titanlite.rank's record of its failure} (code, last line, time)."""
    found = {}
    for path in Path(exit_dir).glob("rank*.json"):
        try:
            found[int(path.stem[len("rank") :])] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return found


def _exit_times(exit_dir: str, failures: dict[int, ProcessFailure]) -> dict[int, float]:
    """When each failed rank recorded its exit; only records of this exit code, as one from an
    attempt torchrun restarted is still there."""
    outcomes = _outcomes(exit_dir)
    return {
        r: float(outcomes[r].get("time", 0))
        for r, f in failures.items()
        if r in outcomes and outcomes[r].get("code") == f.exitcode
    }


def _signalled_outcome(exit_dir: str, sigval: signal.Signals) -> tuple[int, str]:
    """(exit code, line) of the rank that exited with one of titanlite's own codes, earliest
    first; else the shell's code for the signal, with no line of ours to add."""
    outcomes = _outcomes(exit_dir).values()
    own = sorted((o for o in outcomes if o.get("code") in OWN_CODES), key=lambda o: o["time"])
    if own:
        return int(own[0]["code"]), str(own[0].get("line", ""))
    return 128 + int(sigval), ""


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
