"""titanlite: a modular, PyTorch-native stack for pretraining language models. The package's
layers, from the entry points down to `core`, are in docs/architecture.md."""

import atexit
import gc


def _collect_then_freeze() -> None:
    # At exit, the interpreter's own collections walk every object torch's import made, which
    # costs a launcher, preflight or rank process ~0.7 s of CPU on every exit (measured: 4.63 s ->
    # 3.86 s for a process that only imports titanlite.train). One collection here still
    # finalizes the cyclic garbage (files, writers); freezing then leaves nothing to walk.
    gc.collect()
    gc.freeze()


# Registered first, so it runs last: after every other exit handler (logging's flush among them).
atexit.register(_collect_then_freeze)

__version__ = "0.1.0"
