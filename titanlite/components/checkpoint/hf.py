"""Hugging Face interop: a titanlite DCP checkpoint (any layout) <-> a Hugging Face model folder
(`config.json`, `model.safetensors` or shards with an index, tokenizer files), streaming. What is
family-specific (names, the tensors' values, config.json) is the family's adapter (`hf` of its
record in titanlite/families.py, e.g. models/llama/hf_mapping.py), reached through the model's
name: the config's or the checkpoint manifest's.

    dcp_to_hf(Path("outputs/checkpoint/step-1000"), Path("hf/my-llama"))
    hf_to_dcp(Path("Meta-Llama-3.1-8B"), Path("outputs/checkpoint-init/step-0"))

Streaming: one parameter is read, converted and written at a time, then dropped. The
safetensors format (an 8-byte header length, a JSON header giving each tensor's dtype, shape
and byte range, then the raw little-endian bytes) is read and written here directly: the header
is known before any tensor is, so each tensor goes to disk as soon as it is converted. DCP
checkpoints are read one tensor at a time through DCP's own reader (any layout, resharded on
read) and written one file per tensor (torch's single-file DCP writer keeps a file's tensors
alive until the file is closed), with titanlite's manifest, so `checkpoint.initial_load_path`
and `python -m titanlite.checkpoint verify` accept the result.

Nothing here imports transformers, and nothing is unpickled from a Hugging Face folder: pickle
weights (`pytorch_model.bin`) are refused. (A DCP checkpoint's `.metadata` is unpickled by torch's
DCP reader, as for every DCP load.)
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.planner import WriteItem, WriteItemType

from models.spec import HFAdapter, HFConfigError
from titanlite.components.checkpoint import record as run_record
from titanlite.components.checkpoint.folder import CheckpointError
from titanlite.components.checkpoint.safetensors import (
    Entry,
    SafetensorsWriter,
    nbytes,
    read_rows,
    read_safetensors_header,
    read_tensor,
)
from titanlite.components.checkpoint.storage import (
    SafeFileSystemReader,
    read_manifest,
    save_full_state_dict,
    verify,
)
from titanlite.core.dtypes import DTYPES
from titanlite.families import (
    DEFAULT_FAMILY,
    FAMILIES,
    ModelFamily,
    family_of_args,
    family_of_hf_config,
    model_args,
)

DEFAULT_MAX_SHARD_SIZE = 5 * 10**9  # as transformers' save_pretrained
Report = Callable[[str], None]
# What a weight read from a Hugging Face folder may be: an integer, bool or float8 tensor is a
# quantized model or a broken file, and casting it would train on garbage.
_WEIGHT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)

# ---------------------------------------------------------------------------------------------
# shared pieces


class _Progress:
    """`[i/N] name  done/total MiB  elapsed` lines, one per tensor."""

    def __init__(self, total: int, total_bytes: int, report: Report | None):
        self.total, self.total_bytes, self.report = total, total_bytes, report
        self.i, self.done, self.start = 0, 0, time.perf_counter()

    def tick(self, name: str, nbytes: int) -> None:
        self.i += 1
        self.done += nbytes
        if self.report:
            self.report(
                f"[{self.i}/{self.total}] {name}  {self.done / 2**20:,.1f}/"
                f"{self.total_bytes / 2**20:,.1f} MiB  {time.perf_counter() - self.start:.1f}s"
            )


def _adapter(family: ModelFamily, where: object) -> HFAdapter:
    if family.hf is None:
        raise CheckpointError(f"{where}: model {family.name!r} has no Hugging Face mapping")
    return family.hf


def _check_tensors(
    have: dict[str, tuple[int, ...]],
    want: dict[str, tuple[int, ...]],
    where: str,
    args: Any,
    hf: HFAdapter,
) -> None:
    """Missing, mis-shaped or unexpected tensors -> one line naming the first of them."""
    describe = hf.describe
    missing = [k for k in want if k not in have]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(
            f"{where} has no tensor {missing[0]}{more}, which the model ({describe(args)}) needs"
        )
    for k, shape in want.items():
        if tuple(have[k]) != tuple(shape):
            raise CheckpointError(
                f"{where}: tensor {k} has shape {tuple(have[k])}, the model "
                f"({describe(args)}) needs {tuple(shape)}"
            )
    extra = [k for k in have if k not in want]
    if extra:
        raise CheckpointError(
            f"{where} has tensor {extra[0]}, which a {hf.label} model ({describe(args)}) does "
            "not have"
        )


def _start_output(dst: Path) -> Path:
    """The folder to write into; renamed to `dst` only once complete. Never overwrites."""
    if dst.exists():
        raise CheckpointError(f"{dst} already exists; refusing to overwrite it")
    partial = dst.with_name(f".{dst.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)  # a conversion of ours that died part-way
    partial.mkdir(parents=True)
    return partial


# ---------------------------------------------------------------------------------------------
# DCP -> HF


class _DcpTensors:
    """One tensor at a time, whole, from a DCP checkpoint of any layout."""

    def __init__(self, path: Path):
        self.reader = SafeFileSystemReader(str(path))
        self.metadata = self.reader.read_metadata()
        # Read once, not once per tensor.
        self.reader.read_metadata = lambda *a, **k: self.metadata  # type: ignore[method-assign]

    def shapes(self, prefix: str) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return {
            fqn[len(prefix) :]: (tuple(md.size), md.properties.dtype)
            for fqn, md in self.metadata.state_dict_metadata.items()
            if fqn.startswith(prefix) and isinstance(md, TensorStorageMetadata)
        }

    def load(self, fqn: str) -> torch.Tensor:
        from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

        md = self.metadata.state_dict_metadata[fqn]
        assert isinstance(md, TensorStorageMetadata), fqn
        t = torch.empty(tuple(md.size), dtype=md.properties.dtype)
        _load_state_dict(
            {fqn: t}, storage_reader=self.reader, planner=DefaultLoadPlanner(), no_dist=True
        )
        return t


@dataclass(frozen=True)
class _SourceModel:
    """The model of a checkpoint being exported: its family's adapter, args and tokenizer."""

    hf: HFAdapter
    args: Any
    tokenizer: Path | None  # the one the run recorded or configured, if any


def _model_of_checkpoint(
    src: Path, manifest: dict, saved: dict[str, Any], config: Path | None
) -> _SourceModel:
    """The model (family, args and tokenizer, if known) of a checkpoint: from its manifest's
    `model_config`, else from a config.toml: `config`, or the run's own in the dump folder
    (`step-N/../../config.toml`, or an earlier one kept as `config.<time>.toml`) whose hash is
    the manifest's `config_hash`. `saved`: the checkpoint's model tensors (name -> shape,
    dtype), whose embedding gives the vocabulary."""
    recorded = manifest.get("model_config")
    if config is None and recorded:
        name = recorded.get("name", DEFAULT_FAMILY)
        family = FAMILIES.get(name)
        if family is None or family.hf is None:
            raise CheckpointError(f"{src}: model {name!r} has no Hugging Face mapping")
        _vocab_size(src, saved, family.hf)
        tok = recorded.get("tokenizer")
        args = _checked(src, family.hf, lambda: family.args_from_dict(recorded["args"]))
        return _SourceModel(family.hf, args, Path(tok) if tok else None)
    config, job = _run_config(src, manifest, config)
    hf = _adapter(FAMILIES[job.model.name], src)
    vocab_size = _vocab_size(src, saved, hf)
    from titanlite.data import TokenizerError, resolve_tokenizer_path

    try:
        tokenizer: Path | None = resolve_tokenizer_path(job.model.tokenizer_path)
    except TokenizerError:
        tokenizer = Path(job.model.tokenizer_path)  # reported as missing when it is used
    return _SourceModel(hf, _checked(config, hf, lambda: model_args(job, vocab_size)), tokenizer)


def _run_config(src: Path, manifest: dict, config: Path | None) -> tuple[Path, Any]:
    """(config.toml, job config) of the run that saved `src`: `config`, else the one in its
    dump folder."""
    if config is None:
        dump = src.resolve().parent.parent
        found = [
            c
            for c in [dump / "config.toml", *sorted(dump.glob("config.*.toml"))]
            if c.is_file() and run_record.config_hash(c.read_text()) == manifest.get("config_hash")
        ]
        if not found:
            raise CheckpointError(
                f"{src}: cannot tell the model's shape: its manifest has no model_config (saved "
                f"by an older titanlite) and {dump} has no config.toml of the run that saved it; "
                "pass --config with that run's config"
            )
        config = found[0]
    from titanlite.config import loader as config_lib

    return config, config_lib.load(["--config", str(config)])


def _vocab_size(src: Path, saved: dict[str, Any], hf: HFAdapter) -> int:
    if hf.embedding_key not in saved:
        raise CheckpointError(
            f"{src} has no tensor {hf.embedding_key}: not a {hf.label} checkpoint"
        )
    return saved[hf.embedding_key][0][0]


def _checked(where: object, hf: HFAdapter, make: Callable[[], Any]) -> Any:
    try:
        args = make()
        args.check()
    except (KeyError, ValueError) as e:
        raise CheckpointError(f"{where}: no valid {hf.label} model described ({e})") from None
    return args


def _tokenizer_files(tokenizer: Path, vocab_size: int) -> tuple[Path, dict[str, Any], int, int]:
    """(tokenizer.json, tokenizer_config.json content for transformers, bos id, eos id)."""
    from titanlite.data import Tokenizer, TokenizerError

    path = tokenizer / "tokenizer.json" if tokenizer.is_dir() else tokenizer
    if not path.is_file():
        raise CheckpointError(f"tokenizer {path} does not exist")
    try:
        tok = Tokenizer(path)
    except TokenizerError as e:
        raise CheckpointError(str(e)) from None
    if tok.vocab_size > vocab_size:
        raise CheckpointError(
            f"tokenizer {path} has {tok.vocab_size} tokens, more than the "
            f"model's vocab_size {vocab_size}: it is not this model's tokenizer"
        )
    cfg_path = path.parent / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
    cfg.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    cfg.setdefault("bos_token", tok.decode([tok.bos_id]))
    cfg.setdefault("eos_token", tok.decode([tok.eos_id]))
    return path, cfg, tok.bos_id, tok.eos_id


def _shards(entries: list[tuple[str, tuple[int, ...], torch.dtype]], max_bytes: int) -> list[list]:
    shards: list[list] = [[]]
    size = 0
    for e in entries:
        n = nbytes(e[1], e[2])
        if shards[-1] and size + n > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(e)
        size += n
    return shards


def dcp_to_hf(
    src: Path,
    dst: Path,
    *,
    dtype: torch.dtype | None = None,
    tokenizer: Path | None = None,
    config: Path | None = None,
    max_shard_size: int = DEFAULT_MAX_SHARD_SIZE,
    max_position_embeddings: int | None = None,
    report: Report | None = None,
    mtp: bool = False,
) -> None:
    """Write the model of titanlite checkpoint `src` as a Hugging Face folder `dst` (for its
    family's Hugging Face architecture, e.g. LlamaForCausalLM).

    `dtype` (default: the checkpoint's), `tokenizer` (a tokenizer.json or its folder; default:
    the one the checkpoint records, skipped with a note when it cannot be found), `config` (a
    titanlite config.toml, for checkpoints whose manifest does not record the model), `mtp`:
    also the multi-token-prediction modules, which only training runs (written as DeepSeek-V3's
    published checkpoints hold them); without them, the main model."""
    if dst.exists():
        raise CheckpointError(f"{dst} already exists; refusing to overwrite it")
    reader, saved, model = _open_checkpoint(src, config)
    tok = _export_tokenizer(tokenizer, model, report)
    hf, args = model.hf, _exported_args(model, mtp, report)
    keys = list(hf.state_dict_shapes(args))
    out_dtype = {k: dtype or saved[k][1] for k in keys}
    entries, owner = _export_entries(hf, args, keys, {k: saved[k][0] for k in keys}, out_dtype)
    _warn_dropped(hf, args, keys, reader, report)
    try:
        cfg = hf.hf_config(
            args,
            dtype=out_dtype[hf.embedding_key],
            max_position_embeddings=max_position_embeddings,
            bos_token_id=tok[2] if tok else None,
            eos_token_id=tok[3] if tok else None,
        )
    except HFConfigError as e:
        raise CheckpointError(f"{src}: {e}") from None
    loaded: dict[str, torch.Tensor] = {}  # the one titanlite tensor whose parts are being written

    def convert(name: str) -> torch.Tensor:
        key, part, shape = owner[name]
        if key not in loaded:
            loaded.clear()
            loaded[key] = hf.to_hf_tensor(key, reader.load(f"model.{key}"), args)
        t = loaded[key]
        return t if part is None else t.reshape(-1, *shape)[part]

    partial = _start_output(dst)
    try:
        (partial / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        if tok:
            shutil.copyfile(tok[0], partial / "tokenizer.json")
            (partial / "tokenizer_config.json").write_text(json.dumps(tok[1], indent=2) + "\n")
        _write_safetensors(partial, entries, convert, max_shard_size, report)
        partial.rename(dst)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def _exported_args(model: _SourceModel, mtp: bool, report: Report | None) -> Any:
    if mtp or model.hf.inference_args is None:
        return model.args
    main = model.hf.inference_args(model.args)
    if main != model.args and report:
        report(
            "note: the multi-token-prediction modules (training only) are not exported; "
            "convert_checkpoint.py dcp-to-hf --mtp (checkpoint.export_mtp) writes them too"
        )
    return main


def _open_checkpoint(
    src: Path, config: Path | None
) -> tuple[_DcpTensors, dict[str, tuple[tuple[int, ...], torch.dtype]], _SourceModel]:
    """The checkpoint, verified: its reader, its model tensors (name -> shape, dtype) and its
    model, whose every tensor it holds at its shape."""
    problems = verify(src, checksums=False)
    if problems:
        raise CheckpointError("; ".join(problems[:3]))
    manifest = read_manifest(src)
    reader = _DcpTensors(src)
    saved = reader.shapes("model.")
    if not saved:
        raise CheckpointError(
            f"{src} holds no model weights (keys: {', '.join(manifest.get('keys', []))})"
        )
    model = _model_of_checkpoint(src, manifest, saved, config)
    have = {k: s for k, (s, _) in saved.items()}
    _check_tensors(have, model.hf.state_dict_shapes(model.args), str(src), model.args, model.hf)
    return reader, saved, model


def _export_tokenizer(
    tokenizer: Path | None, model: _SourceModel, report: Report | None
) -> tuple[Path, dict[str, Any], int, int] | None:
    """The tokenizer files to write: `tokenizer`'s, else the recorded one's if it is found."""
    vocab_size = model.args.vocab_size
    if tokenizer is not None:
        return _tokenizer_files(tokenizer, vocab_size)
    if model.tokenizer is not None:
        try:
            return _tokenizer_files(model.tokenizer, vocab_size)
        except CheckpointError as e:
            if report:
                report(f"note: no tokenizer files written ({e}); pass --tokenizer")
    elif report:
        report("note: the checkpoint records no tokenizer; pass --tokenizer to include one")
    return None


def part_shape(shape: tuple[int, ...], parts: int) -> tuple[int, ...]:
    """The shape of each of the `parts` HF tensors a titanlite tensor of `shape` is made of
    (HFAdapter.split_names: each of its rows is parts / rows of them, concatenated)."""
    per_row = parts // shape[0]
    if per_row * shape[0] != parts or shape[1] % per_row:
        raise ValueError(f"a tensor of shape {shape} is not {parts} stacked tensors")
    return (shape[1] // per_row, *shape[2:])


def _export_entries(
    hf: HFAdapter,
    args: Any,
    keys: list[str],
    shapes: dict[str, tuple[int, ...]],
    out_dtype: dict[str, torch.dtype],
) -> tuple[list[tuple[str, tuple[int, ...], torch.dtype]], dict[str, tuple[str, int | None, Any]]]:
    """(the HF tensors to write: name, shape, dtype; HF name -> (its titanlite key, its index
    among the key's parts or None for the whole key, its shape)). A key's parts are
    consecutive, so its titanlite tensor is read once."""
    entries, owner = [], {}
    for k in keys:
        names = hf.split_names(k, args)
        if names is None:
            parts: list[tuple[str, int | None, tuple[int, ...]]] = [
                (hf.to_hf_name(k), None, shapes[k])
            ]
        else:
            parts = [(n, j, part_shape(shapes[k], len(names))) for j, n in enumerate(names)]
        for name, j, shape in parts:
            entries.append((name, shape, out_dtype[k]))
            owner[name] = (k, j, shape)
    return entries, owner


def _warn_dropped(
    hf: HFAdapter, args: Any, keys: list[str], reader: _DcpTensors, report: Report | None
) -> None:
    """A note naming the titanlite-only tensors that are not zero (an MoE's expert bias): the
    exported model, which has no place for them, computes something else."""
    dropped = [k for k in keys if hf.split_names(k, args) == ()]
    nonzero = [k for k in dropped if reader.load(f"model.{k}").count_nonzero()]
    if nonzero and report:
        report(
            f"note: {len(nonzero)} of the {len(dropped)} tensors a {hf.label} Hugging Face "
            f"model has no place for are non-zero and not exported ({nonzero[0]}, ...): the "
            "exported model routes tokens without them, so its choices of experts and its "
            "outputs differ from the trained model's"
        )


def _write_safetensors(
    folder: Path,
    entries: list[tuple[str, tuple[int, ...], torch.dtype]],
    convert: Callable[[str], torch.Tensor],
    max_shard_size: int,
    report: Report | None,
) -> None:
    """`entries` (HF name, shape, dtype) as model.safetensors, or as shards of at most
    `max_shard_size` bytes with their index; each tensor is `convert(HF name)`, written and
    dropped in turn."""
    shards = _shards(entries, max_shard_size)
    names = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    total = sum(nbytes(s, d) for _, s, d in entries)
    progress = _Progress(len(entries), total, report)
    for name, shard in zip(names, shards):
        writer = SafetensorsWriter(folder / name, shard)
        for hf_name, shape, d in shard:
            t = convert(hf_name).to(d)
            writer.write(hf_name, t)
            progress.tick(hf_name, nbytes(shape, d))
            del t
        writer.close()
    if len(shards) > 1:
        index = {
            "metadata": {"total_size": total},
            "weight_map": {e[0]: n for n, shard in zip(names, shards) for e in shard},
        }
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


# ---------------------------------------------------------------------------------------------
# HF -> DCP


def _hf_tensors(src: Path) -> dict[str, Entry]:
    """name -> where it lies, over model.safetensors or the shards of its index."""
    index_path = src / "model.safetensors.index.json"
    if index_path.is_file():
        try:
            weight_map = json.loads(index_path.read_text())["weight_map"]
        except (ValueError, KeyError) as e:
            raise CheckpointError(f"{index_path}: unreadable index ({e})") from None
        files = sorted(set(weight_map.values()))
    elif (src / "model.safetensors").is_file():
        weight_map, files = None, ["model.safetensors"]
    elif list(src.glob("pytorch_model*.bin")) or (src / "consolidated.00.pth").is_file():
        raise CheckpointError(
            f"{src} holds pickle weights only (pytorch_model.bin / .pth); titanlite reads "
            "safetensors only, never pickle: re-save them with transformers' "
            "save_pretrained(..., safe_serialization=True)"
        )
    else:
        raise CheckpointError(f"{src} has no model.safetensors (nor an index of shards)")
    out: dict[str, Entry] = {}
    for name in files:
        path = src / name
        if not path.is_file():
            raise CheckpointError(f"{path} (named in {index_path.name}) is missing")
        for tensor, entry in read_safetensors_header(path).items():
            if tensor in out:
                raise CheckpointError(f"tensor {tensor} is in both {out[tensor].file} and {path}")
            out[tensor] = entry
    for tensor, name in (weight_map or {}).items():
        if tensor not in out or out[tensor].file.name != name:
            raise CheckpointError(f"{index_path}: tensor {tensor} is not in {name}")
    return out


class _StreamingSavePlanner(DefaultSavePlanner):
    """Plans the save from placeholder tensors (right shape and dtype, no memory) and produces
    each real tensor only when the writer asks for it."""

    def __init__(self, produce: Callable[[str], torch.Tensor]):
        super().__init__()
        self.produce = produce

    def resolve_data(self, write_item: WriteItem) -> Any:
        if write_item.type == WriteItemType.BYTE_IO:
            return super().resolve_data(write_item)
        return self.produce(write_item.index.fqn)


def read_hf_config(
    src: Path, family: ModelFamily | None = None
) -> tuple[dict[str, Any], Any, ModelFamily]:
    """(config.json, the family's args for it, the family): `family`, else the one whose adapter
    reads config.json's model_type."""
    path = src / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{src} has no config.json: not a Hugging Face model folder")
    try:
        cfg = json.loads(path.read_text())
    except ValueError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    family = family or family_of_hf_config(cfg)
    adapter = _adapter(family, src)
    try:
        args = adapter.args_from_hf_config(cfg)
    except HFConfigError as e:
        raise CheckpointError(f"{src}/{e}") from None
    if adapter.fit_tensors is not None:
        try:
            names = set(_hf_tensors(src))
        except CheckpointError:  # the tensor check that follows names what is wrong
            return cfg, args, family
        args = adapter.fit_tensors(args, names)
    return cfg, args, family


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _folder_dtype(config: dict[str, Any], dtypes: list[torch.dtype]) -> torch.dtype:
    """The dtype a folder's weights are meant to have: config.json's (`torch_dtype` before
    transformers 5), else its tensors' most common floating one."""
    named = DTYPES.get(str(config.get("dtype") or config.get("torch_dtype")))
    if named is not None:
        return named
    floating = [d for d in dtypes if d in _WEIGHT_DTYPES]
    return max(set(floating), key=floating.count, default=torch.float32)


def _check_dtypes(entries: dict[str, Entry], dtype: torch.dtype, where: str) -> str | None:
    """A tensor of no floating dtype -> one line; floating ones of another dtype than `dtype`
    are cast on read: the one note that says so, for the whole folder."""
    for name, e in entries.items():
        if e.dtype not in _WEIGHT_DTYPES:
            raise CheckpointError(
                f"{where}: tensor {name} has dtype {_dtype_name(e.dtype)}, the model needs "
                f"floating weights ({_dtype_name(dtype)})"
            )
    other = [n for n, e in entries.items() if e.dtype != dtype]
    if not other:
        return None
    found = "/".join(sorted({_dtype_name(entries[n].dtype) for n in other}))
    return (
        f"note: {where}: {len(other)} of its {len(entries)} tensors (e.g. {other[0]}) are "
        f"{found}, cast to {_dtype_name(dtype)}"
    )


class HFFolder:
    """A Hugging Face model folder, checked: its config describes a model of the family (the
    configured model `expect`, when given, field by field; the family: `expect`'s, else the one
    config.json's model_type names) and its safetensors hold exactly that model's tensors at
    their shapes, in floating dtypes. `dtype`: what the weights are read as (default: the
    folder's own); `cast_note` says which tensors that casts, if any. Only headers are read
    here."""

    def __init__(self, src: Path, expect: Any = None, dtype: torch.dtype | None = None):
        self.src = src
        family = None if expect is None else family_of_args(expect)
        self.config, self.args, family = read_hf_config(src, family)
        self.hf = hf = _adapter(family, src)
        if expect is not None:
            differ = [
                f"{f} {getattr(self.args, f)} (config.json) vs {getattr(expect, f)} (configured)"
                for f in hf.shape_fields
                if getattr(self.args, f) != getattr(expect, f)
            ]
            if differ:
                raise CheckpointError(
                    f"{src} holds another model than the configured one: {'; '.join(differ)}"
                )
        self.tied = bool(self.config.get("tie_word_embeddings", False))
        self.tensors = _hf_tensors(src)
        self.shapes = hf.state_dict_shapes(self.args)
        self.family = family
        have = {n: e.shape for n, e in self.tensors.items() if not hf.ignored.match(n)}
        want = dict(part for k in self.shapes for part in self.parts(k))
        _check_tensors(have, want, str(src), self.args, hf)
        read = {n: self.tensors[n] for n in want}
        self.dtype = dtype or _folder_dtype(self.config, [e.dtype for e in read.values()])
        self.cast_note = _check_dtypes(read, self.dtype, str(src))

    def parts(self, key: str) -> list[tuple[str, tuple[int, ...]]]:
        """The HF tensors (name, shape) that titanlite parameter `key` is read from."""
        shape = self.shapes[key]
        names = self._stacked(key)
        if names is None:
            return [(self.hf.source_name(key, self.tied), shape)]
        return [(n, part_shape(shape, len(names))) for n in names]

    def _stacked(self, key: str) -> tuple[str, ...] | None:
        """The HF tensors that `key` is stacked from (HFAdapter.split_names; () for a
        titanlite-only key, zeros), or None when it is one tensor: the adapter's single one,
        or the folder's fused tensor when it holds that instead of the parts."""
        names = self.hf.split_names(key, self.args)
        if names and names[0] not in self.tensors and self._fused(key):
            return None
        return names

    def _fused(self, key: str) -> bool:
        try:
            return self.hf.source_name(key, self.tied) in self.tensors
        except KeyError:  # the adapter names the key's parts only
            return False

    def rows(self, key: str, lo: int, hi: int, files: dict[Path, BinaryIO]) -> torch.Tensor:
        """Rows [lo, hi) of parameter `key` as the HF files hold them (before from_hf_tensor),
        reading only those rows' bytes (of stacked parts, only those rows' parts); `files`:
        the files opened so far, left open for the next call."""
        shape, names = self.shapes[key], self._stacked(key)
        if names is None:
            entry = self.tensors[self.hf.source_name(key, self.tied)]
            return read_rows(_opened(files, entry), entry, lo, hi)
        if not names:
            return torch.zeros((hi - lo, *shape[1:]))
        per_row = len(names) // shape[0]
        entries = [self.tensors[n] for n in names[lo * per_row : hi * per_row]]
        stacked = [read_tensor(_opened(files, e), e) for e in entries]
        return torch.cat(stacked).reshape(hi - lo, *shape[1:])


def _opened(files: dict[Path, BinaryIO], entry: Entry) -> BinaryIO:
    if entry.file not in files:
        files[entry.file] = entry.file.open("rb")
    return files[entry.file]


def hf_to_dcp(
    src: Path, dst: Path, *, dtype: torch.dtype | None = None, report: Report | None = None
) -> None:
    """Write the Hugging Face folder `src` as a complete titanlite checkpoint `dst`
    (model weights, manifest), usable as `checkpoint.initial_load_path` on any layout.
    `dtype` defaults to the folder's own (HFFolder.dtype)."""
    if dst.exists():
        raise CheckpointError(f"{dst} already exists; refusing to overwrite it")
    folder = HFFolder(src, dtype=dtype)
    if folder.cast_note and report:
        report(folder.cast_note)
    args, shapes = folder.args, folder.shapes
    # A titanlite-only tensor (no HF part) is float32, as the model holds it.
    out_dtype = {k: folder.dtype if folder.parts(k) else dtype or torch.float32 for k in shapes}
    placeholders = {k: torch.empty((), dtype=out_dtype[k]).expand(s) for k, s in shapes.items()}
    progress = _Progress(
        len(shapes), sum(nbytes(s, out_dtype[k]) for k, s in shapes.items()), report
    )
    files: dict[Path, BinaryIO] = {}

    def produce(fqn: str) -> torch.Tensor:
        key = fqn.removeprefix("model.")
        t = folder.hf.from_hf_tensor(key, folder.rows(key, 0, shapes[key][0], files), args)
        t = t.to(out_dtype[key]).contiguous()
        progress.tick(key, t.nbytes)
        return t

    tok = src / "tokenizer.json"
    info = {
        "step": 0,
        "converted_from": str(src.resolve()),
        "torch_version": torch.__version__,
        "titanlite_version": run_record.titanlite_version(),
        "saved_at": time.time(),
        "model_config": run_record.model_config_record(
            folder.family.name, None, args, tok.resolve() if tok.is_file() else None
        ),
    }
    try:
        save_full_state_dict(
            {"model": placeholders},
            dst,
            info,
            planner=_StreamingSavePlanner(produce),
            file_per_tensor=True,
        )
    finally:
        for f in files.values():
            f.close()
