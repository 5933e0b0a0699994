"""Convert titanlite checkpoints: DCP folder (any layout) <-> one torch.save file.

    python scripts/convert_checkpoint.py dcp-to-torch outputs/checkpoint/step-100 model.pt [--all]
    python scripts/convert_checkpoint.py torch-to-dcp model.pt outputs/seed/checkpoint/step-0

dcp-to-torch writes the model weights only (keys as in the model's state dict) unless --all.
torch-to-dcp reads the file with weights_only=True (no code from it runs) and writes a complete
checkpoint with a manifest, usable as checkpoint.initial_load_path or a step to resume from.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from titanlite.checkpoint_storage import CheckpointError, load_full_state_dict, save_full_state_dict


def dcp_to_torch(src: Path, dst: Path, everything: bool) -> None:
    sd = load_full_state_dict(src, None if everything else ["model"])
    if not everything:
        sd = sd["model"]
    if dst.exists():
        raise CheckpointError(f"{dst} already exists; refusing to overwrite it")
    torch.save(sd, dst)


def torch_to_dcp(src: Path, dst: Path) -> None:
    sd = torch.load(src, weights_only=True, map_location="cpu")
    if "model" not in sd:  # a bare model state dict
        sd = {"model": sd}
    save_full_state_dict(sd, dst, {"step": 0, "converted_from": str(src),
                                   "torch_version": torch.__version__, "saved_at": time.time()})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("direction", choices=["dcp-to-torch", "torch-to-dcp"])
    parser.add_argument("src", type=Path)
    parser.add_argument("dst", type=Path)
    parser.add_argument("--all", action="store_true", help="dcp-to-torch: every key, not just the model")
    args = parser.parse_args(argv)
    try:
        if args.direction == "dcp-to-torch":
            dcp_to_torch(args.src, args.dst, args.all)
        else:
            torch_to_dcp(args.src, args.dst)
    except (CheckpointError, FileNotFoundError) as e:
        print(f"convert_checkpoint: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
