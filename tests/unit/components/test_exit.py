"""What a titanlite process does at exit (titanlite/__init__.py): the cyclic garbage it leaves is
still finalized, and then the interpreter's own collections have nothing left to walk."""

import subprocess
import sys
import textwrap

from helpers import ROOT


def test_exit_finalizes_cyclic_garbage_then_freezes():
    code = textwrap.dedent(
        """
        import atexit, gc, sys
        # Registered before titanlite's handler, so it runs after it.
        atexit.register(lambda: print("frozen", gc.get_freeze_count() > 0))
        import titanlite

        class Cycle:
            def __del__(self):
                print("finalized")

        a, b = Cycle(), Cycle()
        a.other, b.other = b, a
        gc.disable()  # only the exit handler may collect the cycle
        del a, b
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert proc.stdout.split() == ["finalized", "finalized", "frozen", "True"], proc.stdout
