"""A rank's entry point under titanlite.launch: `python -m titanlite.rank MODULE [args]` runs
MODULE.main(args) and, when it returns or raises a failure, writes its last stderr line to
torchrun's per-rank error file (TORCHELASTIC_ERROR_FILE), so the launcher can end the output
with the rank's own reason instead of torchrun's report. Nothing changes for a rank that
succeeds, or outside torchrun."""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback
from typing import Any

from titanlite.core.errors import EXIT_DIR_ENV, INTERRUPTED, USER_ERROR


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

    def __getattr__(self, name: str) -> Any:  # flush, fileno, isatty, encoding, ...
        return getattr(self.inner, name)


def _record(code: int, line: str) -> None:
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
            "extraInfo": {"py_callstack": "", "timestamp": str(int(time.time()))},
            "errorCode": code,
        }
    }
    try:
        with open(path, "w") as f:
            json.dump(data, f)
    except OSError:
        pass  # the launcher falls back to naming the rank and its exit code


def main() -> None:
    if len(sys.argv) < 2:
        print("usage: python -m titanlite.rank MODULE [args]", file=sys.stderr)
        sys.exit(USER_ERROR)
    module, argv = sys.argv[1], sys.argv[2:]
    sys.argv = [module, *argv]
    sys.stderr = tracker = _LastLine(sys.stderr)
    code: int = 1
    try:
        code = importlib.import_module(module).main(argv) or 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except KeyboardInterrupt:
        traceback.print_exc()
        code = INTERRUPTED
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stderr.flush()
        if code:
            _record(code, tracker.last_line())
    sys.exit(code)


if __name__ == "__main__":
    main()
