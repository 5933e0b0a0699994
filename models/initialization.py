"""Layout-invariant random initialization.

Each element's value is a function of (seed, parameter name, the element's index in the full
tensor) only, computed with a counter-based hash instead of a stateful generator. A rank that
holds a shard of a parameter (FSDP, tensor parallel, or both) fills just its own elements and
gets exactly the values the single-process model would have there, without ever materializing
the full parameter. The only thing borrowed from the distributed world is DTensor's public
description of where a local shard sits in the global tensor.
"""

from __future__ import annotations

import hashlib
import math

import torch

_M32 = 0xFFFFFFFF
_CHUNK = 1 << 22  # elements per pass: bounds the int64/float64 temporaries


def _mulmod32(x: torch.Tensor, c: int) -> torch.Tensor:
    # (x * c) mod 2^32 without int64 overflow: split c into 16-bit halves.
    lo = x * (c & 0xFFFF)
    hi = ((x * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & _M32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    # "lowbias32" integer hash (Wellons): a bijection on 32-bit values with good avalanche.
    x = x ^ (x >> 16)
    x = _mulmod32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mulmod32(x, 0x846CA68B)
    return x ^ (x >> 16)


def _keys(seed: int, name: str) -> tuple[int, int]:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:4], "little"), int.from_bytes(digest[4:8], "little")


def hashed_uniform(index: torch.Tensor, seed: int, name: str) -> torch.Tensor:
    """Uniform(0, 1) float64 values, one per int64 element index, for the stream (seed, name)."""
    k1, k2 = _keys(seed, name)
    h = _mix32((index & _M32) ^ k1)
    h = _mix32(h ^ (index >> 32) ^ k2)
    return (h.double() + 0.5) / 2.0**32


def _local_region(tensor: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...], tuple[int, ...]]:
    """(local tensor, global shape, global offset of the local tensor)."""
    from torch.distributed.tensor import DTensor

    if isinstance(tensor, DTensor):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        _, offset = compute_local_shape_and_global_offset(
            tensor.shape, tensor.device_mesh, tensor.placements
        )
        return tensor.to_local(), tuple(tensor.shape), tuple(offset)
    return tensor, tuple(tensor.shape), (0,) * tensor.dim()


def _global_indices(
    local_shape: tuple[int, ...],
    offset: tuple[int, ...],
    global_shape: tuple[int, ...],
    rows: slice,
    device: torch.device,
) -> torch.Tensor:
    strides = [1] * len(global_shape)
    for d in range(len(global_shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * global_shape[d + 1]
    idx = torch.zeros((), dtype=torch.int64, device=device)
    for d, (n, o, s) in enumerate(zip(local_shape, offset, strides)):
        r = torch.arange(n, dtype=torch.int64, device=device)
        if d == 0:
            r = r[rows]
        view = [1] * len(local_shape)
        view[d] = -1
        idx = idx + ((r + o) * s).view(view)
    return idx


@torch.no_grad()
def fill_trunc_normal_(
    tensor: torch.Tensor, std: float, seed: int, name: str, cutoff: float | None = 2.0
) -> torch.Tensor:
    """Fill with N(0, std²) truncated to [-cutoff, cutoff] (absolute, as torch's trunc_normal_;
    None = not truncated), by inverse-CDF sampling of hashed uniforms."""
    local, global_shape, offset = _local_region(tensor)
    if local.numel() == 0:
        return tensor
    if cutoff is None:
        lo, hi = 0.0, 1.0
    else:
        lo = 0.5 * (1 + math.erf(-cutoff / std / math.sqrt(2)))
        hi = 0.5 * (1 + math.erf(cutoff / std / math.sqrt(2)))
    shape = tuple(local.shape) if local.dim() else (1,)
    row_elems = max(1, math.prod(shape[1:]))
    rows_per_chunk = max(1, _CHUNK // row_elems)
    flat = local.view(shape)
    for start in range(0, shape[0], rows_per_chunk):
        rows = slice(start, min(start + rows_per_chunk, shape[0]))
        idx = _global_indices(shape, offset or (0,), global_shape or (1,), rows, local.device)
        u = lo + hashed_uniform(idx, seed, name) * (hi - lo)
        z = math.sqrt(2) * torch.erfinv((2 * u - 1).clamp(-1 + 1e-16, 1 - 1e-16))
        flat[rows].copy_(z * std)
    return tensor
