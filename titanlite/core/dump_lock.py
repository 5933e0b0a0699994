"""One run per job.dump_folder at a time: a lock on `<dump_folder>/.run.lock`, held for the run.

Two runs in one folder would interleave metrics.jsonl, replace each other's step-N checkpoints
and leave the second's config.toml. The lock is an flock(2) on the lock file: the kernel drops
it when the holding process dies, however it dies (kill -9, a node reboot's end of the process,
a SLURM requeue), so a stale lock never blocks the next run. The file also records the holder
(host, pid, start time), read only to name it in the refusal.

Who holds it: titanlite.launch for a single-node run (so that it lasts across torchrun's
restarts of the ranks, which the launcher outlives); otherwise global rank 0 (a multi-node
launch, where every node has its own launcher, plain torchrun, Ray). The holder exports
HELD_ENV so that the ranks it starts neither probe nor take it again.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import IO

LOCK_NAME = ".run.lock"
# Set by the process that holds the lock for the run: the lock file's absolute path.
HELD_ENV = "TITANLITE_DUMP_LOCK"


class FolderInUse(RuntimeError):
    """Another live run holds the dump folder."""


def lock_path(dump_folder: str | Path) -> Path:
    return Path(dump_folder).resolve() / LOCK_NAME


def held_by_launcher(dump_folder: str | Path) -> bool:
    """The lock for this folder is held by the process that started this one."""
    return os.environ.get(HELD_ENV) == str(lock_path(dump_folder))


def _try_lock(path: Path) -> IO[str] | None:
    """The open lock file, locked; None when another open file holds the lock."""
    if sys.platform == "win32":  # no flock: no lock (titanlite trains on Linux and macOS)
        return open(path, "a+")  # noqa: SIM115 - held open for the run
    import fcntl

    f = open(path, "a+")  # noqa: SIM115 - held open for the run
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    return f


def _holder(path: Path) -> str:
    try:
        rec = json.loads(path.read_text())
        return f"pid {rec['pid']} on {rec['host']}, since {rec['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder not recorded yet"


def _refuse(path: Path) -> FolderInUse:
    return FolderInUse(
        f"job.dump_folder: {path.parent} is in use by another run ({_holder(path)}); wait for "
        "it to end, or choose another --job.dump_folder"
    )


def probe(dump_folder: str | Path) -> None:
    """Raise FolderInUse if a live run holds the folder (the folder must exist)."""
    path = lock_path(dump_folder)
    f = _try_lock(path)
    if f is None:
        raise _refuse(path)
    f.close()  # closing the only descriptor releases the flock


def hold(dump_folder: str | Path) -> IO[str]:
    """Take the folder's lock for this process's life (keep the returned file open), record
    this process as its holder and export HELD_ENV to the processes it starts."""
    folder = Path(dump_folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = lock_path(folder)
    f = _try_lock(path)
    if f is None:
        raise _refuse(path)
    f.seek(0)
    f.truncate()
    since = time.strftime("%Y-%m-%d %H:%M:%S")
    f.write(json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": since}))
    f.flush()
    os.environ[HELD_ENV] = str(path)
    return f
