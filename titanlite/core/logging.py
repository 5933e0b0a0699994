"""One logger for the whole stack, prefixed with the rank. Every rank logs (torchrun's
--local-ranks-filter, i.e. LOG_RANK, decides whose output is shown)."""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("titanlite")


def init_logger() -> None:
    if logger.handlers:
        return
    rank = os.environ.get("RANK", "0")
    handler = logging.StreamHandler()
    handler.setFormatter(
        logging.Formatter(f"[rank{rank}] %(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    )
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
