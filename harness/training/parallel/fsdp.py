"""``train.parallel: fsdp``: a stage trained with FSDP2 (torch's ``fully_shard``) instead of DDP, behind the hooks
of :class:`harness.training.parallel.ddp.DataParallel`, so :func:`harness.training.loop.train_stage` stays one loop.

**A sharded replica.** At the stage's start every rank deep-copies the runner's model (after ``prepare_stage_model``:
a ``PeftModel`` is copied with its adapter, so peft is applied first and sharded after) and shards the copy:
``fully_shard`` on every transformer block (the classes the model lists in ``_no_split_modules``), then on a root
module that runs the loop's training forward (:class:`harness.training.parallel.ddp._SupervisedLogits`: the loop calls
the model body and the head separately, and the root's hooks must see the whole forward to gather the embedding, the
final norm and the head). The loop trains the replica — its optimiser, clipping, grad norm and diagnostics see
DTensor parameters, gradients and optimiser state sharded over ranks.

The runner's model itself stays a plain, full model on every rank: stage transitions (adapter merges, ``init``
reloads), evaluation, the stage cache and every checkpoint writer work on it unchanged. :meth:`sync` copies the
replica's full weights into it (``get_model_state_dict(full_state_dict=True)``: an all-gather every rank joins)
before each evaluation and resumable checkpoint and at the stage's end. Why not evaluate the sharded module with
all ranks in step: generation and the probes call the model's parts directly (no root hook to gather the weights),
and evaluation sharded over ranks (each rank its own items) would run a different number of forwards per rank,
which sharded forwards (one all-gather per block) cannot. The cost is one full copy of the weights per rank; the
gradients and the AdamW state (2 fp32 tensors per weight), the larger part of training memory, are sharded.

Gradients: each rank back-propagates its term of the global token mean scaled by the world size (as under DDP), and
FSDP2's reduce-scatter averages over ranks (its default divide factor is the world size, like DDP's all-reduce), so
the gradient equals one process's on the whole batch. Row masks (``new_token_rows``) become post-accumulate-grad
hooks on the sharded matrices (FSDP2 calls them after the reduce-scatter): zeroing rows after the sum equals zeroing
them before. With ``precision: bf16-autocast`` the blocks compute in bf16 (``MixedPrecisionPolicy(param_dtype=
bfloat16, reduce_dtype=float32)``), the sharded master weights and optimiser state stay fp32.

Resumable checkpoints store the optimiser state gathered to rank 0 as an ordinary (unsharded) ``state_dict`` (the
one-process format); ``--resume`` with the same number of ranks reads it on every rank and shards it back
(``set_optimizer_state_dict(full_state_dict=True)``). Gathering to rank 0 bounds the model size by one host's
memory; ``torch.distributed.checkpoint``'s sharded save would lift that and is not used yet.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import distribute_tensor

from harness.training.adapters import mark_masked_rows, masked_rows, unwrap
from harness.training.parallel.ddp import DataParallel, ParallelError, _SupervisedLogits

_ROOT_PREFIX = "model."  # the root module's name for the replica (_SupervisedLogits.model)


def _block_classes(model) -> set[str]:
    """Transformer block class names: transformers lists them as the modules it never splits across devices."""
    names = set(getattr(unwrap(model), "_no_split_modules", None) or [])
    if not names:
        raise ParallelError(
            f"train.parallel: fsdp needs a model whose transformer blocks are known "
            f"(_no_split_modules); {type(unwrap(model)).__name__} lists none"
        )
    return names


class FullyShardedDataParallel(DataParallel):
    """This rank's hooks for one ``fsdp`` stage: :meth:`trained_module` builds the sharded replica the loop
    trains; :meth:`logits_module`, :meth:`sync` and :meth:`optimizer_state` work on it."""

    sharded = True

    def __init__(self):
        super().__init__()
        self._root = None

    def trained_module(self, model: torch.nn.Module, precision: str) -> torch.nn.Module:
        """A copy of ``model`` sharded over the ranks (blocks, then the root); what the loop's optimiser trains."""
        if getattr(unwrap(model).config, "vision_config", None) is not None:
            # not tried: the vision tower and projector would need sharding units of their own
            raise ParallelError("train.parallel: fsdp does not support image-text models yet; use ddp")
        self.device = next(model.parameters()).device  # the hooks' collectives (DataParallel.device)
        replica = copy.deepcopy(model)
        rows = {name: masked_rows(p) for name, p in model.named_parameters() if masked_rows(p) is not None}
        policy = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            if precision == "bf16-autocast"
            else MixedPrecisionPolicy()
        )
        blocks = _block_classes(replica)
        for module in replica.modules():
            if type(module).__name__ in blocks:
                fully_shard(module, mp_policy=policy)
        self._root = fully_shard(_SupervisedLogits(replica), mp_policy=policy)
        for name, p in replica.named_parameters():
            if name in rows:
                _mask_sharded_rows(p, rows[name])
        return replica

    def logits_module(self, model: torch.nn.Module) -> torch.nn.Module:
        """The sharded root: its forward gathers the weights block by block and frees them again."""
        if self._root is None or self._root.model is not model:
            raise RuntimeError("FullyShardedDataParallel.logits_module: call trained_module first, with this model")
        return self._root

    def sync(self, model: torch.nn.Module) -> None:
        """Copy the replica's full weights into the runner's ``model`` (every rank; an all-gather per tensor)."""
        full = get_model_state_dict(self._root, options=StateDictOptions(full_state_dict=True))
        with torch.no_grad():
            model.load_state_dict({k.removeprefix(_ROOT_PREFIX): v for k, v in full.items()})

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The optimiser state gathered to rank 0 (CPU), as a one-process ``optimizer.state_dict()``: the
        parameters numbered in group order, which is how the one-process loop's ``param_groups`` number them
        (the replica has the model's parameter order). Other ranks get ``{}`` (they do not write)."""
        full = get_optimizer_state_dict(
            self._root, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        if not full:
            return {}
        index = {name: i for i, name in enumerate(n for g in full["param_groups"] for n in g["params"])}
        return {
            "state": {index[name]: value for name, value in full["state"].items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in full["param_groups"]],
        }

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """The inverse of :meth:`optimizer_state`: the one-process state (every rank read it from the resume
        point) keyed by parameter names again, then sharded onto this rank's optimiser by torch."""
        names = {id(p): name for name, p in self._root.named_parameters()}
        order = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
        full = {
            "state": {order[i]: value for i, value in state["state"].items()},
            "param_groups": [{**g, "params": [order[i] for i in g["params"]]} for g in state["param_groups"]],
        }
        set_optimizer_state_dict(self._root, optimizer, full, options=StateDictOptions(full_state_dict=True))


def _mask_sharded_rows(param: torch.nn.Parameter, rows: list[int]) -> None:
    """``new_token_rows`` on a sharded matrix: after FSDP2's reduce-scatter, zero this rank's rows of the
    gradient other than ``rows`` (the mask is sharded the way the matrix is, so each rank masks its own rows)."""
    frozen = torch.ones(param.shape[0], dtype=torch.bool, device=param.device)
    frozen[torch.tensor(rows, dtype=torch.long, device=param.device)] = False
    local = distribute_tensor(
        frozen.view(-1, *([1] * (param.ndim - 1))), param.device_mesh, param.placements, src_data_rank=None
    ).to_local()  # every rank built the same mask: no scatter
    if local.shape[0] != param.to_local().shape[0]:
        raise RuntimeError(f"row mask shard has {local.shape[0]} rows, the parameter's {param.to_local().shape[0]}")
    mark_masked_rows(
        param, rows
    )  # the optimiser puts it in the no-decay group (harness.training.adapters.param_groups)
    param.register_post_accumulate_grad_hook(lambda p: p.grad.to_local().masked_fill_(local, 0))
