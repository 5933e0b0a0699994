"""titanlite's exit codes and its one-line error: what a shell script, a launcher or a scheduler
reads from a run (docs/failures.md). Every entry point ends a failure the same way."""

from __future__ import annotations

import sys

USER_ERROR = 2  # config, paths, layout, data, hardware: something the user can fix
NONFINITE = 3  # training diverged: a NaN/inf gradient norm
PREEMPTED = 75  # EX_TEMPFAIL, "try again later": stopped on a notice, with a checkpoint
INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a Ctrl-C'd command
# The codes a rank uses on purpose, preferred by titanlite.launch over the ranks torchrun
# stopped because of them when it chooses whose line ends the output.
OWN_CODES = (USER_ERROR, NONFINITE, PREEMPTED, INTERRUPTED)

# Where titanlite.rank leaves each failed rank's code and last line for titanlite.launch.
EXIT_DIR_ENV = "TITANLITE_EXIT_DIR"
# The pid of titanlite.launch, which its ranks (titanlite.rank) must not outlive.
LAUNCHER_PID_ENV = "TITANLITE_LAUNCHER_PID"
# "1" when titanlite.launch's stderr is a terminal (the ranks' own is torchrun's file).
COLOR_ENV = "TITANLITE_COLOR"


class EnvironmentProblem(RuntimeError):
    """A missing or too old package, or a machine that cannot do what the config asks."""


def error_line(problem: object, prog: str = "titanlite") -> str:
    """The one line that says what is wrong and how to fix it; `prog` names the tool that says
    it (prepare, convert_checkpoint, ...)."""
    return f"{prog}: error: {problem}"


def report(problem: object, code: int = USER_ERROR, prog: str = "titanlite") -> int:
    """Print the error line on stderr; the exit code to return."""
    print(error_line(problem, prog), file=sys.stderr)
    return code
