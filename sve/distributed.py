"""A whole state loaded into a module that may be sharded over processes (FSDP): what both the sharding
strategy (``sve.training.sharding``) and a deep ensemble's restarts (``sve.methods.deep_ensemble``) need."""

from __future__ import annotations

from torch import nn


def load_state(module: nn.Module, state: dict) -> None:
    """``module.load_state_dict(state)``, where the module may be sharded and the state whole (a deep
    ensemble's pretrained start, kept before sharding): each whole tensor is cut to this rank's slice as its
    parameter is laid out. Every rank calls it, with the same state."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    current = module.state_dict()
    state = {
        k: distribute_tensor(v.to(current[k].device_mesh.device_type), current[k].device_mesh, current[k].placements)
        if isinstance(current.get(k), DTensor) and not isinstance(v, DTensor)
        else v
        for k, v in state.items()
    }
    module.load_state_dict(state)
