"""Convert titanlite checkpoints: DCP folder (any layout) <-> one torch.save file or a Hugging Face
folder (Llama, Qwen3, Qwen3 MoE).

    python scripts/convert_checkpoint.py dcp-to-torch outputs/checkpoint/step-100 model.pt [--all]
    python scripts/convert_checkpoint.py torch-to-dcp model.pt outputs/seed/checkpoint/step-0
    python scripts/convert_checkpoint.py dcp-to-hf outputs/checkpoint/step-100 hf/my-llama \\
        [--dtype bfloat16] [--tokenizer DIR] [--max-shard-size 5GB] [--config config.toml]
    python scripts/convert_checkpoint.py hf-to-dcp Meta-Llama-3.1-8B outputs/init/step-0 [--dtype float32]

dcp-to-torch writes the model weights only (keys as in the model's state dict) unless --all.
torch-to-dcp reads the file with weights_only=True (no code from it runs) and writes a complete
checkpoint with a manifest, usable as checkpoint.initial_load_path or a step to resume from.
dcp-to-hf / hf-to-dcp stream one tensor at a time (progress on stderr); see docs/checkpoint.md.
No destination is ever overwritten. Errors: one line, exit code 2.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
import warnings
from pathlib import Path

import torch

from titanlite.components.checkpoint.folder import CheckpointError
from titanlite.components.checkpoint.storage import load_full_state_dict, save_full_state_dict
from titanlite.config.loader import ConfigError
from titanlite.config.schema import SEQ_MAX
from titanlite.core.arguments import ArgumentParser, int_arg
from titanlite.core.dtypes import DTYPES
from titanlite.core.errors import report

_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}


def _check_destination(dst: Path, one_file: bool) -> None:
    """Refuse, before any reading, a destination that exists or whose parent is a file; a
    one-file destination (torch.save) needs its folder to exist (the folder destinations are
    made with their parents)."""
    if dst.exists():
        raise CheckpointError(f"{dst} already exists; refusing to overwrite it")
    if one_file and not dst.parent.exists():
        raise CheckpointError(
            f"destination {dst}: folder {dst.parent} does not exist; create it first"
        )
    parent = dst.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise CheckpointError(f"destination {dst}: {parent} is a file, not a folder")


def dcp_to_torch(src: Path, dst: Path, everything: bool) -> None:
    sd = load_full_state_dict(src, None if everything else ["model"])
    if not everything:
        sd = sd["model"]
    if dst.exists():
        raise CheckpointError(f"{dst} already exists; refusing to overwrite it")
    torch.save(sd, dst)


def _check_torch_file(src: Path) -> None:
    """A torch.save file by its first bytes (a zip archive, or a legacy pickle's protocol
    byte), before torch.load reads it all."""
    with src.open("rb") as f:
        head = f.read(4)
    if not (head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"):
        raise CheckpointError(f"{src} is not a torch.save file (it starts with {head!r})")


def _load_weights(src: Path) -> dict:
    """torch.load with weights_only=True (no code from the file runs): a refusal in one line."""
    try:
        with warnings.catch_warnings():  # "Detected pickle protocol 4": said in the error
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            sd = torch.load(src, weights_only=True, map_location="cpu")
    except Exception as e:  # the unpickler raises many kinds for a file it cannot read
        lines = [ln for ln in str(e).splitlines() if "nsupported" in ln]
        why = lines[0].strip() if lines else f"{type(e).__name__}: {e}".splitlines()[0]
        raise CheckpointError(
            f"{src}: torch.load(weights_only=True) refuses it ({why}); only tensors and plain "
            "containers are read, no code"
        ) from None
    if not isinstance(sd, dict):
        raise CheckpointError(f"{src} holds a {type(sd).__name__}, not a state dict")
    return sd


def torch_to_dcp(src: Path, dst: Path) -> None:
    _check_torch_file(src)
    sd = _load_weights(src)
    if "model" not in sd:  # a bare model state dict
        sd = {"model": sd}
    save_full_state_dict(
        sd,
        dst,
        {
            "step": 0,
            "converted_from": str(src),
            "torch_version": torch.__version__,
            "saved_at": time.time(),
        },
    )


def size_bytes(text: str) -> int:
    """'5GB' (10^9), '2GiB' (2^30), '500MB', or a plain number of bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a size such as 5GB, 500MB or 2GiB")
    size = float(m.group(1)) * _UNITS[m.group(2).upper()]
    # A shard holds at least one byte; past a PiB (or past float range: 1e400 is inf) it is a
    # typo, not a shard size.
    if not 1 <= size <= 2**50:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a size from 1 byte to 1PiB")
    return int(size)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="convert_checkpoint", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="direction", required=True)
    p = sub.add_parser("dcp-to-torch", help="model weights (or everything) as one torch.save file")
    p.add_argument("--all", action="store_true", help="every key, not just the model")
    sub.add_parser("torch-to-dcp", help="a torch.save file as a titanlite checkpoint")
    p = sub.add_parser("dcp-to-hf", help="the model as a Hugging Face folder")
    p.add_argument(
        "--tokenizer",
        type=Path,
        help="tokenizer.json or its folder (default: the one the checkpoint records)",
    )
    p.add_argument(
        "--max-shard-size",
        type=size_bytes,
        default="5GB",
        help="split model.safetensors into shards of at most this size (default 5GB)",
    )
    p.add_argument(
        "--config",
        type=Path,
        help="the titanlite config.toml of the run, for checkpoints whose manifest does "
        "not record the model (default: the run's own config.toml)",
    )
    p.add_argument(
        "--max-position-embeddings",
        type=int_arg(1, SEQ_MAX),
        help="context length in config.json (default: the trained sequence length, "
        "or 131072 for a model with Llama 3.1 RoPE scaling)",
    )
    p.add_argument(
        "--mtp",
        action="store_true",
        help="also the multi-token-prediction modules (DeepSeek-V3's layer n_layers + k, as "
        "the published checkpoints hold them; training only, so off by default)",
    )
    sub.add_parser("hf-to-dcp", help="a Hugging Face folder as a titanlite checkpoint")
    for name, p in sub.choices.items():
        p.add_argument("src", type=Path)
        p.add_argument("dst", type=Path)
        if name in ("dcp-to-hf", "hf-to-dcp"):
            p.add_argument(
                "--dtype",
                choices=list(DTYPES),
                help="dtype of the written weights (default: the source's)",
            )
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        _check_destination(args.dst, one_file=args.direction == "dcp-to-torch")
        if args.direction == "dcp-to-torch":
            dcp_to_torch(args.src, args.dst, args.all)
        elif args.direction == "torch-to-dcp":
            torch_to_dcp(args.src, args.dst)
        else:
            from titanlite.components.checkpoint import hf as hf_checkpoint

            dtype = DTYPES[args.dtype] if args.dtype else None
            if args.direction == "dcp-to-hf":
                hf_checkpoint.dcp_to_hf(
                    args.src,
                    args.dst,
                    dtype=dtype,
                    tokenizer=args.tokenizer,
                    config=args.config,
                    max_shard_size=args.max_shard_size,
                    max_position_embeddings=args.max_position_embeddings,
                    report=_stderr,
                    mtp=args.mtp,
                )
            else:
                hf_checkpoint.hf_to_dcp(args.src, args.dst, dtype=dtype, report=_stderr)
    except (CheckpointError, ConfigError, FileNotFoundError) as e:
        return report(e, prog="convert_checkpoint")
    except OSError as e:  # the disk or a path refused: say which, in one line
        where = e.filename or args.dst
        return report(f"{where}: {e.strerror or e}", prog="convert_checkpoint")
    print(f"wrote {args.dst} in {time.perf_counter() - start:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
