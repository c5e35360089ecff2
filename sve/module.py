"""The one LightningModule: it knows only the method interface (member logits in the (M, B, C) layout)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import pytorch_lightning as pl
import torch
from torch import Tensor

from sve.checkpoint import LeanCheckpointing
from sve.members import check_member_logits, predictive
from sve.methods.base import EnsembleMethod
from sve.metrics import Accuracy, OODDetection, classification_metrics


class EnsembleModule(LeanCheckpointing, pl.LightningModule):
    """Trains with the mean member loss and evaluates the ensemble predictive.

    A non-finite training loss stops the run with an error naming the step and the last finite loss (decided
    alike on every rank); checkpoints hold only trainable state (``sve.checkpoint.LeanCheckpointing``).

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
        self.last_finite_loss: tuple[int, float] | None = None  # (step, loss)

    def forward(self, batch: dict) -> Tensor:
        return self.method(batch)

    def training_step(self, batch: dict, batch_idx: int) -> Tensor:
        scale = batch.pop("loss_scale", 1.0)  # this micro-batch's share of the global batch (sve.data.sampling)
        logits = check_member_logits(self.method(batch))
        loss = self.method.loss(logits, batch["labels"])
        self.check_finite(loss)
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["labels"].shape[0])
        return loss * scale

    def check_finite(self, loss: Tensor) -> None:
        """Stops at the first non-finite loss (on any rank, so all ranks stop together)."""
        finite = bool(torch.isfinite(loss.detach()).all())
        if self.trainer.world_size > 1:
            finite = self.trainer.strategy.reduce_boolean_decision(finite, all=True)
        if not finite:
            last = "none" if self.last_finite_loss is None else "{1:.6g} at step {0}".format(*self.last_finite_loss)
            raise FloatingPointError(
                f"training diverged: non-finite loss ({float(loss.detach()):.6g} on rank {self.global_rank}) at step "
                f"{self.global_step} (epoch {self.current_epoch}); last finite loss: {last}. Nothing was written "
                "to results.json; try a smaller optimizer.lr or method.lr"
            )
        self.last_finite_loss = (self.global_step, float(loss.detach()))

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        self.method.constrain_()

    def on_train_epoch_end(self) -> None:
        self.method.on_train_epoch_end(self)

    def _evaluate(self, batch: dict, metrics) -> tuple[Tensor, Tensor]:
        """Member logits (M, B', C) and labels of the batch's real examples (not the DDP padding)."""
        valid = batch.pop("valid", None)
        logits = check_member_logits(self.method(batch))
        labels = batch["labels"]
        if valid is not None:
            logits, labels = logits[:, valid], labels[valid]
        if labels.numel():
            metrics.update(predictive(logits, self.aggregate), labels)
        return logits, labels

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._evaluate(batch, self.val_metrics)

    def on_validation_epoch_end(self) -> None:
        self.log_dict({k: v.float() for k, v in self.val_metrics.compute().items()}, prog_bar=True)
        self.val_metrics.reset()

    def on_test_epoch_start(self) -> None:
        self._test_start = time.perf_counter()
        self.test_examples = torch.zeros((), dtype=torch.long, device=self.device)

    def test_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        if dataloader_idx == 1:  # the OOD set: only the confidence score matters
            self._saw_ood = True
            valid = batch.pop("valid", None)
            probs = predictive(self.method(batch), self.aggregate)
            self.ood_detection.update(probs if valid is None else probs[valid], in_distribution=False)
            return
        logits, labels = self._evaluate(batch, self.test_metrics)
        self.num_members = logits.shape[0]  # members or samples that produced the predictive
        self.test_examples += labels.numel()
        if not labels.numel():
            return
        self.ood_detection.update(predictive(logits, self.aggregate), in_distribution=True)
        for member, metric in zip(logits, self.member_accuracy):  # only members the method produced
            metric.update(member.double().softmax(-1), labels)

    def on_test_epoch_end(self) -> None:
        results = {k: float(v) for k, v in self.test_metrics.compute().items()}
        members = [float(m.compute()) for m in self.member_accuracy if m.update_called]
        if members:
            results["test/member_acc"] = members
        if self._saw_ood:
            results.update({f"test/ood_{k}": float(v) for k, v in self.ood_detection.compute().items()})
        self.ood_detection.reset()
        results["test/examples"] = int(self.trainer.strategy.reduce(self.test_examples, reduce_op="sum"))
        results["test/seconds"] = time.perf_counter() - self._test_start
        bad = [k for k, v in results.items() if not all(map(math.isfinite, v if isinstance(v, list) else [v]))]
        if bad:
            raise FloatingPointError(f"non-finite test metrics {bad}: {({k: results[k] for k in bad})}; "
                                     "results.json is not written")  # fmt: skip
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
