"""Running stage three under ``torchrun``: keeping every rank's per-example state identical.

``torchrun --nproc_per_node N -m featcache finetune ...`` joins the process group through
:func:`featcache.runtime.ranks` (NCCL on GPUs, gloo on the CPU). The network is
wrapped in ``DistributedDataParallel``, which averages its gradients; what lives outside it is
kept identical here:

- ROLE's phi: its gradient is non-zero only on the batch's rows, so each rank sends its rows'
  gradients and every rank rebuilds the same averaged gradient (:func:`sync_row_grad`);
- label state a loss changes while training (LL-Cp's corrected labels): after every step the
  rows each rank changed are gathered and written on every rank (:func:`sync_state_rows`);
- predictions: evaluation and ``end_epoch`` (APL, OPML-SP) see the whole split, gathered from
  the ranks' contiguous shards (:func:`gather_shards`), so every rank selects the same epoch
  and configuration.

:func:`check_same` compares a checksum of the state across ranks after every epoch and stops
the run if anything drifted.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable
from typing import cast

import torch
import torch.distributed as dist
from torch import Tensor

from featcache.errors import FeatcacheError
from featcache.finetune.data import shard_range
from featcache.runtime import Ranks


def all_reduce_sum(tensor: Tensor, job: Ranks) -> Tensor:
    """The sum of ``tensor`` over the ranks (in place; a no-op for one rank)."""
    if job.world > 1:
        dist.all_reduce(tensor)
    return tensor


def _all_gather(tensor: Tensor, job: Ranks) -> list[Tensor]:
    """Every rank's ``tensor`` (same shape on every rank), bool sent as uint8."""
    send = tensor.to(torch.uint8) if tensor.dtype == torch.bool else tensor.contiguous()
    parts = [torch.empty_like(send) for _ in range(job.world)]
    dist.all_gather(parts, send)
    return [p.to(torch.bool) for p in parts] if tensor.dtype == torch.bool else parts


def gather_shards(local: Tensor, num_rows: int, job: Ranks) -> Tensor:
    """The rows of a whole split from each rank's contiguous shard (:func:`shard_range`)."""
    if job.world == 1:
        return local
    per = -(-num_rows // job.world)
    padded = local.new_zeros((per, *local.shape[1:]))
    padded[: local.shape[0]] = local
    parts = _all_gather(padded, job)
    sizes = [len(shard_range(num_rows, r, job.world)) for r in range(job.world)]
    return torch.cat([part[:size] for part, size in zip(parts, sizes, strict=True)])


def sync_row_grad(param: Tensor, index: Tensor, job: Ranks) -> None:
    """Average over ranks the gradient of a per-example table (H, N, L) used only at ``index``."""
    if job.world == 1 or param.grad is None:
        return
    indices = torch.cat(_all_gather(index, job))
    rows = torch.cat(_all_gather(param.grad[:, index], job), dim=1)
    grad = torch.zeros_like(param.grad)
    grad.index_add_(1, indices, rows)
    param.grad.copy_(grad.div_(job.world))


def sync_state_rows(state: dict[str, Tensor], skip: set[str], index: Tensor, num_rows: int,
                    job: Ranks) -> None:
    """Write every rank's batch rows of each per-example state tensor (H, N, ...) on all ranks."""
    if job.world == 1:
        return
    indices = None
    for name, tensor in state.items():
        if name in skip or tensor.dim() < 2 or tensor.shape[1] != num_rows:
            continue
        if indices is None:
            indices = torch.cat(_all_gather(index, job))
        rows = torch.cat(_all_gather(tensor[:, index], job), dim=1)
        tensor[:, indices] = rows


def check_same(tensors: dict[str, Tensor], job: Ranks) -> None:
    """Stop with an error if any tensor differs between ranks (compared through checksums)."""
    if job.world == 1 or not tensors:
        return
    sums = []
    for tensor in tensors.values():
        values = torch.nan_to_num(tensor.detach().double().flatten(), nan=-7.0)
        weights = torch.arange(1, values.numel() + 1, device=values.device, dtype=torch.float64)
        sums.append(torch.stack([values.sum(), (values * weights.remainder(97)).sum()]))
    local = torch.stack(sums)
    parts = _all_gather(local, job)
    for rank, part in enumerate(parts[1:], start=1):
        if not torch.equal(part, parts[0]):
            names = [n for n, a, b in zip(tensors, part, parts[0], strict=True) if not torch.equal(a, b)]
            raise FeatcacheError(f"rank {rank}'s {', '.join(names)} differ from rank 0's; the ranks "
                                 "drifted apart (please report this)")


#: how long a rank that has finished its own configurations waits for the others
PATIENCE = _dt.timedelta(days=7)


def share_results(job: Ranks, step: Callable[[], dict]) -> dict:
    """Run ``step`` (each rank its own work) and give every rank the union of the dicts returned.

    A rank that finishes first waits for the others on a gloo group with a long timeout (a
    rank's configurations may take hours longer than another's; NCCL's watchdog would give up).
    If ``step`` failed on any rank, every rank raises.
    """
    if job.world == 1:
        return step()
    # every rank is a member, so the group is a ProcessGroup (never NON_GROUP_MEMBER)
    group = cast(dist.ProcessGroup, dist.new_group(backend="gloo", timeout=PATIENCE))
    error, result = None, {}
    try:
        result = step()
    except Exception as exc:  # re-raised below, after the other ranks have been told
        error = exc
    parts: list = [None] * job.world
    dist.all_gather_object(parts, (error is not None, result), group=group)
    dist.destroy_process_group(group)
    if error is not None:
        raise error
    if any(failed for failed, _ in parts):
        raise FeatcacheError("another rank failed (see its message); run the same command again "
                             "with --resume to continue")
    merged: dict = {}
    for _, part in parts:
        merged.update(part)
    return merged
