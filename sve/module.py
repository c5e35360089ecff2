"""The one LightningModule: it knows only the method interface (member logits in the (M, B, C) layout)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytorch_lightning as pl
import torch
from torch import Tensor

from sve.members import check_member_logits, predictive
from sve.methods.base import EnsembleMethod
from sve.metrics import Accuracy, OODDetection, classification_metrics


class EnsembleModule(pl.LightningModule):
    """Trains with the mean member loss and evaluates the ensemble predictive.

    Args:
        method: an ``EnsembleMethod``.
        optimizer: partial optimiser, called with the parameter groups.
        scheduler: partial ``sve.optim.warmup_schedule`` (or None), called with the optimiser and the step
            count; stepped every optimiser step.
        aggregate: ``probs`` (mean of member softmaxes, Eq. 2) or ``logits`` (softmax of mean logits).
    """

    def __init__(
        self,
        method: EnsembleMethod,
        optimizer: Callable,
        scheduler: Callable | None = None,
        aggregate: str = "probs",
    ):
        super().__init__()
        predictive(torch.zeros(1, 1, 2), aggregate)  # validates the name early
        self.method = method
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.aggregate = aggregate
        self.val_metrics = classification_metrics().clone(prefix="val/")
        self.test_metrics = classification_metrics().clone(prefix="test/")
        self.member_accuracy = torch.nn.ModuleList(Accuracy() for _ in range(method.ensemble_size))
        self.ood_detection = OODDetection()
        self._saw_ood = False
        self.num_members: int | None = None  # set by the test loop
        self.test_results: dict[str, float] = {}

    def forward(self, batch: dict) -> Tensor:
        return self.method(batch)

    def training_step(self, batch: dict, batch_idx: int) -> Tensor:
        logits = check_member_logits(self.method(batch))
        loss = self.method.loss(logits, batch["labels"])
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["labels"].shape[0])
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        self.method.constrain_()

    def on_train_epoch_end(self) -> None:
        self.method.on_train_epoch_end(self)

    def _evaluate(self, batch: dict, metrics) -> Tensor:
        logits = check_member_logits(self.method(batch))
        probs = predictive(logits, self.aggregate)
        metrics.update(probs, batch["labels"])
        return logits

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._evaluate(batch, self.val_metrics)

    def on_validation_epoch_end(self) -> None:
        self.log_dict({k: v.float() for k, v in self.val_metrics.compute().items()}, prog_bar=True)
        self.val_metrics.reset()

    def on_test_epoch_start(self) -> None:
        self._test_start = time.perf_counter()

    def test_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        if dataloader_idx == 1:  # the OOD set: only the confidence score matters
            self._saw_ood = True
            self.ood_detection.update(predictive(self.method(batch), self.aggregate), in_distribution=False)
            return
        logits = self._evaluate(batch, self.test_metrics)
        self.num_members = logits.shape[0]  # members or samples that produced the predictive
        self.ood_detection.update(predictive(logits, self.aggregate), in_distribution=True)
        for member, metric in zip(logits, self.member_accuracy):  # only members the method produced
            metric.update(member.double().softmax(-1), batch["labels"])

    def on_test_epoch_end(self) -> None:
        results = {k: float(v) for k, v in self.test_metrics.compute().items()}
        members = [float(m.compute()) for m in self.member_accuracy if m.update_called]
        if members:
            results["test/member_acc"] = members
        if self._saw_ood:
            results.update({f"test/ood_{k}": float(v) for k, v in self.ood_detection.compute().items()})
        self.ood_detection.reset()
        results["test/seconds"] = time.perf_counter() - self._test_start
        self.log_dict({k: v for k, v in results.items() if isinstance(v, float)})
        self.test_results = results
        self.test_metrics.reset()
        for m in self.member_accuracy:
            m.reset()

    def configure_optimizers(self):
        # Methods may train at their own learning rate (Appendix C.3): method.lr overrides the recipe's.
        params = self.method.trainable_parameters()
        if not params:
            raise ValueError(f"{type(self.method).__name__} has no trainable parameters")
        extra = {"lr": self.method.lr} if self.method.lr is not None else {}
        optimizer = self.optimizer_factory(params, **extra)
        if self.scheduler_factory is None:
            return optimizer
        scheduler = self.scheduler_factory(
            optimizer, total_steps=int(self.trainer.estimated_stepping_batches), max_epochs=self.trainer.max_epochs
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
