"""Fully sharded data parallel training (``trainer=fsdp``): parameters, gradients and optimiser state split
over the devices, for the full fine-tunes that do not fit one device (Table 3's 7B rows as full fine-tunes).

DDP (``trainer=ddp``) keeps a whole model, its gradients and its AdamW moments on every device: a 7B full
fine-tune needs about 16 bytes per parameter (weights, gradient, two moments; more in float32), which no
single 80 GB GPU holds. FSDP keeps 1/N of each on each of N devices and gathers one unit's weights at a time
for its forward and backward. The units are the backbone's repeated blocks (``repeated_blocks``: the
children of its longest ``nn.ModuleList`` of one class, e.g. LLaMA's decoder layers, BERT's layers, a ViT's
blocks), found on the model itself, so any architecture is wrapped without a list of class names; the rest
of the method (embeddings, heads, member tensors outside the blocks) is the root unit.

This is PyTorch's FSDP2 (``fully_shard``) under Lightning's ``ModelParallelStrategy``: FSDP2 runs on the CPU
over gloo too, so a sharded run is tested against one process (``trainer=fsdp_sim``), while Lightning's
FSDP1 strategy refuses the CPU (PyTorch's FSDP1 needs an accelerator). Frozen and trainable tensors mix
inside one unit for SVE and the LoRA methods (frozen U, V and base weights beside trainable singular values
or adapters): each parameter keeps its own ``requires_grad``, and only the trainable ones get gradients and
optimiser state. Outside a unit's forward a parameter is a ``DTensor`` holding this rank's rows, which the
optimiser step and SVE's projection onto s >= 0 (``constrain_``) act on elementwise.
"""

from __future__ import annotations

import logging
from collections import Counter

import torch
from pytorch_lightning.strategies import ModelParallelStrategy
from torch import nn

from sve.distributed import load_state
from sve.errors import InputError

log = logging.getLogger(__name__)


def repeated_blocks(model: nn.Module) -> set[type[nn.Module]]:
    """The classes of the blocks a model repeats: the children of its longest ``nn.ModuleList`` whose
    children all share one class (empty when it has none of at least two)."""
    best: list[nn.Module] = []
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) > len(best):
            if len(Counter(type(child) for child in module)) == 1:
                best = list(module)
    return {type(best[0])} if len(best) >= 2 else set()


def shard_method(method: nn.Module, mesh) -> list[str]:
    """Applies FSDP2 to ``method``: every repeated block of its backbone a unit, the method the root. The
    member-logit entry points that do not go through ``forward`` (training in member chunks) gather the
    root's parameters as ``forward`` does. Returns the unit classes."""
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    # Lightning calls configure_model for every fit and test: shard once. A method made whole again after
    # training (``unshard_method``) is tested as it is, each rank holding all of it, as under DDP.
    if is_sharded(method) or getattr(method, "was_sharded", False):
        return [b.__name__ for b in repeated_blocks(method.backbone)]
    method.check_sharding()
    method.was_sharded = True
    for p in method.parameters():  # FSDP2 shards by rows of a contiguous tensor (an SVD's Vh is often a view)
        if not p.is_contiguous():
            p.data = p.data.contiguous()
    blocks = tuple(repeated_blocks(method.backbone))
    for module in method.backbone.modules():
        if blocks and isinstance(module, blocks):
            fully_shard(module, mesh=mesh)
    fully_shard(method, mesh=mesh)
    for name in ("member_logits", "chunk_logits"):
        register_fsdp_forward_method(method, name)
    names = [b.__name__ for b in blocks]
    log.info("FSDP units: %s, and the method as the root", ", ".join(names) or "none (no repeated block)")
    return names


def is_sharded(method: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(method, FSDPModule)


def unshard_method(method: nn.Module) -> None:
    """Turns a sharded method back into a plain module on every rank, each holding every tensor in full:
    called after training, so that what follows reads the model as on one device (the posterior fits of
    ``after_fit``, rank 0's adapter files and final checkpoint, the metrics' checks). Collective: every
    rank calls it."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    for module in method.modules():  # gather first, while every unit still has its state
        for name, p in list(module._parameters.items()):
            if isinstance(p, DTensor):
                module._parameters[name] = nn.Parameter(p.full_tensor().detach().clone(), requires_grad=p.requires_grad)
    for module in method.modules():
        if isinstance(module, FSDPModule):
            # fully_shard swapped in a subclass and added hooks (forward, state dict) and forward methods to
            # the instance; the parameters' own hooks (the load_state_dict one re-shards) go with them.
            module.__class__ = next(c for c in type(module).__mro__[1:] if not issubclass(c, FSDPModule))
            for name in ("member_logits", "chunk_logits"):
                module.__dict__.pop(name, None)
        for attribute, hooks in list(vars(module).items()):
            if attribute.startswith("_") and attribute.endswith("hooks") and isinstance(hooks, dict):
                for key in [k for k, hook in hooks.items() if is_fsdp_hook(hook)]:
                    del hooks[key]
                    for flags in (
                        "_forward_pre_hooks_with_kwargs",
                        "_forward_hooks_with_kwargs",
                        "_forward_hooks_always_called",
                    ):
                        getattr(module, flags, {}).pop(key, None)
    if hasattr(method, "unshard_state"):  # what a method keeps of its own beside its parameters
        method.unshard_state()


def is_fsdp_hook(hook) -> bool:
    """A hook FSDP registered: a method of one of its objects, or a function of its modules (a lambda)."""
    hook = getattr(hook, "hook", hook)  # state-dict hooks may come wrapped
    owner = getattr(hook, "__self__", None)
    where = type(owner).__module__ if owner is not None else getattr(hook, "__module__", "") or ""
    return where.startswith("torch.distributed.fsdp")


class ShardedStrategy(ModelParallelStrategy):
    """Lightning's strategy for FSDP2 with every device in one data-parallel group (no tensor parallelism):
    the model is sharded by the LightningModule's ``configure_model`` (``shard_method``)."""

    def __init__(self, save_distributed_checkpoint: bool = False, **kwargs):
        super().__init__(save_distributed_checkpoint=save_distributed_checkpoint, **kwargs)

    def setup_environment(self) -> None:
        self._data_parallel_size, self._tensor_parallel_size = self.num_nodes * self.num_processes, 1
        super().setup_environment()

    def optimizer_state(self, optimizer) -> dict:
        # Each rank's own AdamW state (its slices of the trainable tensors, as plain local tensors), gathered as
        # a list on rank 0: a checkpoint resumes on the same number of devices. (PyTorch's consolidation to one
        # full state maps parameters by their names and fails on parameter groups built outside the model.)
        state = optimizer.state_dict()
        state = {**state, "state": {i: {k: local(v) for k, v in s.items()} for i, s in state["state"].items()}}
        gathered = [None] * self.world_size
        torch.distributed.all_gather_object(gathered, state)
        return {"sharded": gathered}

    def load_checkpoint(self, checkpoint_path, weights_only=None) -> dict:
        """A checkpoint file as ``optimizer_state`` and Lightning's full state dict write it: the whole
        trainable tensors cut to this rank's shards (the frozen ones, not stored, put back from the model as
        ``LeanCheckpointing`` does), and this rank's optimiser state. A distributed checkpoint (a folder) is
        Lightning's to load."""
        from pathlib import Path

        from sve.training.checkpoint import read_checkpoint

        path = Path(self.broadcast(str(checkpoint_path)))
        if path.is_dir():
            return super().load_checkpoint(path, weights_only=weights_only)
        checkpoint = read_checkpoint(path)
        module = self.lightning_module
        module.on_load_checkpoint(checkpoint)  # checks the frozen tensors, fills them in (Lightning calls it again)
        load_state(module, checkpoint["state_dict"])
        saved = checkpoint.get("optimizer_states", [])
        for optimizer, state in zip(self.optimizers, saved):
            if "sharded" not in state or len(state["sharded"]) != self.world_size:
                n = len(state["sharded"]) if "sharded" in state else "no"
                raise InputError(
                    f"{path} holds the optimiser state of {n} sharded process(es); this run has "
                    f"{self.world_size}: resume a trainer=fsdp run on the devices it started on"
                )
            optimizer.load_state_dict(as_shards(state["sharded"][self.global_rank], optimizer))
        return checkpoint


def local(value):
    """This rank's part of a sharded tensor, on the CPU (a plain tensor pickles without its device mesh)."""
    from torch.distributed.tensor import DTensor

    return value.to_local().cpu() if isinstance(value, DTensor) else value


def as_shards(state: dict, optimizer) -> dict:
    """A rank's optimiser state as ``optimizer_state`` saved it, its per-parameter tensors made the shards of
    the parameters they belong to again (parameters in the order of the optimiser's groups)."""
    from torch.distributed.tensor import DTensor

    params = [p for group in optimizer.param_groups for p in group["params"]]
    out = {}
    for i, values in state["state"].items():
        p = params[int(i)]
        shard = p.to_local() if isinstance(p, DTensor) else None
        # The parameter's own global shape: a dimension that does not divide by the ranks is sharded unevenly.
        out[i] = {
            k: DTensor.from_local(
                v.to(shard.device), p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride()
            )
            if shard is not None and isinstance(v, torch.Tensor) and v.shape == shard.shape and v.dim() > 0
            else v
            for k, v in values.items()
        }
    return {**state, "state": out}


def fsdp_strategy(save_distributed_checkpoint: bool = False) -> ShardedStrategy:
    """The strategy of ``configs/trainer/fsdp.yaml`` and ``fsdp_sim.yaml``: each rank writes its shard with
    ``save_distributed_checkpoint``, else rank 0 writes the trainable state as one file, as other strategies do."""
    return ShardedStrategy(save_distributed_checkpoint=save_distributed_checkpoint)


__all__ = ["ShardedStrategy", "fsdp_strategy", "is_sharded", "repeated_blocks", "shard_method", "unshard_method"]
