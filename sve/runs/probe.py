"""One training step's worth of the real model before any training: ``probe`` runs one forward/backward on
a real training batch and one evaluation forward, without changing the model or any random state, so a method
that cannot run on the chosen backbone or data fails at start rather than after training. It also returns the
trainable parameters that receive no gradient (under DDP these stop training, so ``run`` refuses them).
"""

from __future__ import annotations

import torch


@torch.no_grad()
def _restore(saved: dict[str, torch.Tensor], module: torch.nn.Module) -> None:
    for name, tensor in module.state_dict(keep_vars=True).items():
        if name in saved and isinstance(tensor, torch.Tensor):
            tensor.copy_(saved[name])


def probe(module, datamodule) -> list[str]:
    """One training forward/backward and one evaluation forward on a real training batch; the model, its
    gradients and every random state are as before. Returns the names of trainable parameters without a
    gradient."""
    batch = next(iter(datamodule.train_dataloader()))
    batch.pop("loss_scale", None)
    batch.pop("rows", None)
    batch = {k: v.to(module.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    saved = {
        k: v.detach().clone()
        for k, v in module.state_dict().items()  # e.g. BatchNorm statistics
        if isinstance(v, torch.Tensor)
    }  # (method extra state is not touched by a forward)
    trainable = {n: p for n, p in module.named_parameters() if p.requires_grad}
    grads = {n: p.grad for n, p in trainable.items()}
    was_training = module.training
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        try:
            for p in trainable.values():
                p.grad = None
            module.train()
            logits = module.method(dict(batch))
            module.method.loss(logits, batch["labels"]).backward()
            unused = [n for n, p in trainable.items() if p.grad is None]
            module.eval()
            with torch.no_grad():
                module.method(dict(batch))
        finally:
            for n, p in trainable.items():
                p.grad = grads[n]
            _restore(saved, module)
            module.train(was_training)
    return unused
