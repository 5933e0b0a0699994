"""A rank's entry point under titanlite.launch: `python -m titanlite.rank MODULE [args]` runs
MODULE.main(args) and, when it returns or raises a failure, writes its last stderr line to
torchrun's per-rank error file (TORCHELASTIC_ERROR_FILE), so the launcher can end the output
with the rank's own reason instead of torchrun's report. Nothing changes for a rank that
succeeds, or outside torchrun.

A MODULE with `outcome(args) -> (code, line)` (titanlite.train) is run through it instead:
under titanlite.launch the rank then hands its one line to the launcher without printing it,
so the terminal shows it once, last (the rank's copy, then the launcher's, was two; with every
rank shown, one more per rank). A crash's traceback likewise goes only to the error file, so
that the ranks that fail because a peer died leave theirs in torchrun.log, not on the terminal;
the launcher prints the root cause's. A rank that torchrun will restart after this failure
prints both itself: its launcher reports only the last attempt."""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

from titanlite.core.errors import EXIT_DIR_ENV, INTERRUPTED, LAUNCHER_PID_ENV, USER_ERROR


class _LastLine:
    """sys.stderr that remembers its last non-empty line (what the user was last told)."""

    def __init__(self, inner: Any):
        self.inner, self.last, self._partial = inner, "", ""

    def write(self, s: str) -> int:
        text = self._partial + s
        lines = text.split("\n")
        self._partial = lines.pop()
        for ln in reversed(lines):
            if ln.strip():
                self.last = ln.strip()
                break
        return self.inner.write(s)

    def last_line(self) -> str:
        return self._partial.strip() or self.last

    def keep(self, line: str) -> None:
        """`line` becomes the last line without being written."""
        self.last, self._partial = line, ""

    def __getattr__(self, name: str) -> Any:  # flush, fileno, isatty, encoding, ...
        return getattr(self.inner, name)


def _record(code: int, line: str, callstack: str = "") -> None:
    # Also where the launcher finds it after torchrun itself was signalled (Ctrl-C, SIGTERM):
    # then torchrun raises instead of reporting the ranks' failures.
    if folder := os.environ.get(EXIT_DIR_ENV):
        try:
            with open(os.path.join(folder, f"rank{os.environ.get('RANK', '0')}.json"), "w") as f:
                json.dump({"code": code, "line": line, "time": time.time()}, f)
        except OSError:
            pass
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    # The layout torch.distributed.elastic's ErrorHandler writes and ProcessFailure reads.
    data = {
        "message": {
            "message": line,
            "extraInfo": {"py_callstack": callstack, "timestamp": str(int(time.time()))},
            "errorCode": code,
        }
    }
    try:
        with open(path, "w") as f:
            json.dump(data, f)
    except OSError:
        pass  # the launcher falls back to naming the rank and its exit code


def _die_with_launcher() -> None:
    """A rank must not outlive titanlite.launch: torchrun starts each rank in its own session,
    so a kill -9 of the launcher's process group leaves the ranks training on, writing
    checkpoints and racing a relaunch. On Linux the kernel sends SIGKILL when the parent dies
    (PR_SET_PDEATHSIG); a watchdog thread covers other systems and a launcher that is not the
    direct parent. SIGKILL, not SIGTERM: a SIGTERM'd rank would save a checkpoint."""
    launcher = int(os.environ.get(LAUNCHER_PID_ENV, "0") or 0)
    if launcher <= 0:
        return
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if not _alive(launcher, parent):  # it died before prctl took effect
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=_watch, args=(launcher, parent), daemon=True).start()


def _alive(launcher: int, parent: int) -> bool:
    if os.getppid() != parent:  # re-parented: our parent has died
        return False
    try:
        os.kill(launcher, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a process with that pid exists
        pass
    return True


def _watch(launcher: int, parent: int) -> None:
    while _alive(launcher, parent):
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGKILL)


def _run(module: Any, argv: list[str], tracker: _LastLine) -> int:
    outcome = getattr(module, "outcome", None)
    if outcome is None:
        return module.main(argv) or 0
    code, line = outcome(argv)
    if line:
        if _launcher_prints_it():
            tracker.keep(line)  # what _record leaves for the launcher to print
        else:
            print(line, file=sys.stderr)
    return code


def _launcher_prints_it() -> bool:
    """titanlite.launch prints a failed rank's line unless torchrun restarts the group after
    this failure (then the line of this attempt would never be shown)."""
    if not os.environ.get(EXIT_DIR_ENV):
        return False
    restarts = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    allowed = os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")
    return int(restarts or 0) >= int(allowed or 0)


def _crashed(tracker: _LastLine) -> str:
    """The traceback of the exception being handled, printed unless titanlite.launch reports
    this failure: then it goes only to the error file (torchrun.log), and the launcher prints
    the root cause's. A rank that fails because a peer died ("Connection closed by peer")
    would otherwise put its traceback above the launcher's line that names that peer."""
    text = traceback.format_exc()
    if _launcher_prints_it():
        tracker.keep(text.strip().rsplit("\n", 1)[-1].strip())  # what print_exc ends with
    else:
        sys.stderr.write(text)
    return text


def main() -> None:
    _die_with_launcher()
    if len(sys.argv) < 2:
        print("usage: python -m titanlite.rank MODULE [args]", file=sys.stderr)
        sys.exit(USER_ERROR)
    module, argv = sys.argv[1], sys.argv[2:]
    sys.argv = [module, *argv]
    sys.stderr = tracker = _LastLine(sys.stderr)
    code, callstack = 1, ""
    try:
        code = _run(importlib.import_module(module), argv, tracker)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except KeyboardInterrupt:
        traceback.print_exc()
        code = INTERRUPTED
    except BaseException:
        callstack = _crashed(tracker)
        code = 1
    finally:
        sys.stderr.flush()
        if code:
            _record(code, tracker.last_line(), callstack)
    sys.exit(code)


if __name__ == "__main__":
    main()
