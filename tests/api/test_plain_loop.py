"""A method trained by a hand-written PyTorch loop ends where the Lightning path ends: nothing the framework
does in training (the singular values' projection included) needs its Lightning module."""

import hydra
import pytorch_lightning as pl
import torch

from sve.runs.run import build, run
from sve.training.checkpoint import read_checkpoint
from tests.conftest import compose_cfg

OVERRIDES = [
    "method=sve",
    "ensemble_size=2",
    "backbone=tiny_vit",
    "dataset=synthetic_image",
    "callbacks=default",
    "method.lr=0.05",
]  # large enough that some singular values reach zero


def test_a_plain_loop_trains_sve_as_the_lightning_path_does(tmp_path):
    cfg = compose_cfg(OVERRIDES, tmp_path / "lightning")
    run(cfg)
    lightning = read_checkpoint(tmp_path / "lightning" / "checkpoints" / "final.ckpt")["state_dict"]

    # The loop: the same seed, data order, optimiser, schedule and clipping as the config's, nothing else.
    pl.seed_everything(int(cfg.seed), workers=True)
    _, data, method, _ = build(cfg)
    data.setup()
    data.order_seed = int(cfg.seed)
    params = method.trainable_parameters()
    steps = int(cfg.trainer.limit_train_batches)
    optimizer = hydra.utils.instantiate(cfg.optimizer)(params, lr=cfg.method.lr)
    schedule = hydra.utils.instantiate(cfg.scheduler)(optimizer, total_steps=steps, max_epochs=1)
    method.train()
    for _, batch in zip(range(steps), data.train_dataloader()):
        loss = method.loss(method(batch), batch["labels"])
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, float(cfg.trainer.gradient_clip_val))
        optimizer.step()  # the singular values' projection onto s >= 0 comes with the step
        schedule.step()

    state = {f"method.{k}": v for k, v in method.state_dict().items()}
    trained = [k for k in lightning if k.endswith(("singular_values", "biases", "heads.weight", "heads.bias"))]
    assert trained and any(k.endswith(".singular_values") for k in trained)
    assert any(bool((lightning[k] == 0).any()) for k in trained if k.endswith(".singular_values"))  # projected
    for key in trained:
        torch.testing.assert_close(state[key], lightning[key], rtol=1e-5, atol=1e-6, msg=key)
