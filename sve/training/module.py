"""The one LightningModule: it knows only the method interface (member logits in the (M, B, C) layout)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import Tensor

from sve.errors import InputError, TrainingDiverged
from sve.layers.draws import seeded_draws, unfuse_attention_dropout
from sve.members import check_member_logits, predictive
from sve.methods.base import EnsembleMethod
from sve.metrics.scores import classification_metrics
from sve.training.checkpoint import LeanCheckpointing

log = logging.getLogger(__name__)


@dataclass
class Predictions:
    """One evaluation set's member logits (M, N, C) float32, labels (N,) and dataset positions (N,)."""

    member_logits: Tensor
    labels: Tensor
    index: Tensor


class EnsembleModule(LeanCheckpointing, pl.LightningModule):
    """Trains with the mean member loss, validates the ensemble predictive, and at test collects the member
    logits of one evaluation set (``predictions``), which ``sve.runs.evaluation`` saves and scores.

    A non-finite training loss stops the run with an error naming the step and the last finite loss (decided
    alike on every rank); checkpoints hold only trainable state (``sve.training.checkpoint.LeanCheckpointing``).

    Args:
        method: an ``EnsembleMethod``.
        optimizer: partial optimiser, called with the parameter groups.
        scheduler: partial ``sve.training.optim.warmup_schedule`` (or None), called with the optimiser and the step
            count; stepped every optimiser step.
        aggregate: ``probs`` (mean of member softmaxes, Eq. 2) or ``logits`` (softmax of mean logits).
        draw_seed: seeds the random numbers drawn in evaluation, batch by batch (``draws``), and with
            ``exact_draws`` those of training, step by step.
        exact_draws: training draws that are the same on any number of devices (``sve.layers.draws``).
    """

    def __init__(
        self,
        method: EnsembleMethod,
        optimizer: Callable,
        scheduler: Callable | None = None,
        aggregate: str = "probs",
        draw_seed: int = 0,
        exact_draws: bool = True,
    ):
        super().__init__()
        predictive(torch.zeros(1, 1, 2), aggregate)  # validates the name early
        self.method = method
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.aggregate = aggregate
        self.val_metrics = classification_metrics().clone(prefix="val/")
        self.predictions: Predictions | None = None  # of the last evaluation set (trainer.test)
        self.last_finite_loss: tuple[int, float] | None = None  # (step, loss)
        self.draw_seed = draw_seed  # seeds the training and evaluation draws: the run's seed
        self.exact_draws = exact_draws
        if exact_draws:
            # Here, not when fitting starts: every process that builds this model runs the same attention
            # kernels, so a run evaluated right after training and one evaluated again from its checkpoint
            # (evaluate.py) agree to the last digit. Fused and unfused attention differ in rounding.
            changed = unfuse_attention_dropout(method.backbone)
            if changed:
                log.info("exact_draws: attention with dropout runs unfused (%s)", ", ".join(changed[:4]))

    def forward(self, batch: dict) -> Tensor:
        return self.method(batch)

    def configure_model(self) -> None:
        """Under ``trainer=fsdp`` (Lightning's ModelParallelStrategy gives the device mesh): shards the
        method, block by block (``sve.training.sharding``). Any other strategy leaves the model as it is."""
        if self.device_mesh is not None:
            from sve.training.sharding import shard_method

            self.frozen_fingerprint()  # of the whole frozen tensors, kept for every checkpoint: before sharding
            shard_method(self.method, self.device_mesh["data_parallel"])

    def training_step(self, batch: dict, batch_idx: int) -> Tensor:
        scale = batch.pop("loss_scale", 1.0)  # this micro-batch's share of the global batch (sve.data.sampling)
        B = batch["labels"].shape[0]
        rows = batch.pop("rows", (0, B))  # its place in the global batch (all of it, without the sampler)
        # A tuple of ints hashes alike in every process (strings do not); -1 keeps it apart from ``draws``'.
        seed = hash((self.draw_seed, -1, self.global_step)) % 2**63
        chunks = self.method.training_chunks()
        if chunks is not None:
            loss = self.chunked_step(batch, chunks, seed, rows, scale)
        else:
            with seeded_draws(seed, rows, B) if self.exact_draws else nullcontext():
                logits = check_member_logits(self.method(batch))
                loss = self.method.loss(logits, batch["labels"])
        self.check_finite(loss, batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=B)
        return loss * scale

    def chunked_step(self, batch: dict, chunks: list[list[int]], seed: int, rows, scale: float) -> Tensor:
        """``members_at_once: k`` in training: each chunk's forward and backward in turn, so one chunk's
        activations are alive at a time, with the gradients of all members at once. Each chunk draws from the
        step's seed what all members would (``sve.layers.draws``).

        Lightning zeroes the gradients between a training step and its backward, so the chunks before the
        last keep theirs aside, and the loss returned brings them back: for each parameter with kept
        gradient g, (p * g).sum() minus its own value, which adds 0 to the loss and exactly g to p's
        gradient in Lightning's backward. Everything Lightning does around that backward (accumulation,
        clipping, float16 scaling, DDP's gradient reduction, which then covers the earlier chunks' members
        too) applies to all chunks alike."""
        M, labels = sum(len(c) for c in chunks), batch["labels"]
        params = [p for p in self.method.trainable_parameters() if p.numel()]
        before = [p.grad for p in params]  # accumulated micro-batches (or the last step's, about to be zeroed)
        for p in params:
            p.grad = None
        trainer = self._trainer  # None in a plain PyTorch loop
        scaler = getattr(trainer.precision_plugin, "scaler", None) if trainer is not None else None
        earlier = []
        for i, members in enumerate(chunks):
            draws = seeded_draws(seed, rows, labels.shape[0], (members, M)) if self.exact_draws else nullcontext()
            with draws:
                part = self.method.loss(self.method.chunk_logits(batch, members), labels, ensemble_size=M)
            if i == len(chunks) - 1:
                break
            (scaler.scale(part) if scaler is not None else part).backward()  # this chunk's graph is freed
            earlier.append(part.detach())
        kept = [(p, p.grad if scaler is None else p.grad / scaler.get_scale()) for p in params if p.grad is not None]
        for p, grad in zip(params, before):
            p.grad = grad
        restore = [(p * g).sum() for p, g in kept]
        restore = sum(t - t.detach() for t in restore) if restore else 0.0
        return part + restore + (torch.stack(earlier).sum() if earlier else 0.0)

    def check_finite(self, loss: Tensor, batch: dict | None = None) -> None:
        """Stops at the first non-finite loss (on any rank, so all ranks stop together): the data's fault when
        the batch itself holds NaN or inf, else divergence."""
        finite = bool(torch.isfinite(loss.detach()).all())
        if self.trainer.world_size > 1:
            finite = self.trainer.strategy.reduce_boolean_decision(finite, all=True)
        if finite:
            self.last_finite_loss = (self.global_step, float(loss.detach()))
            return
        bad_inputs = {
            k: int((~torch.isfinite(v)).sum())
            for k, v in (batch or {}).items()
            if isinstance(v, Tensor) and v.is_floating_point() and not bool(torch.isfinite(v).all())
        }
        if bad_inputs:
            raise InputError(
                f"the training batch of step {self.global_step} (epoch {self.current_epoch}) holds "
                "non-finite input values ("
                f"{', '.join(f'{k}: {n} NaN or inf' for k, n in bad_inputs.items())}"
                "); the data must be finite (check the dataset files and any preprocessing)"
            )
        raise TrainingDiverged(
            f"training diverged: non-finite loss ({float(loss.detach()):.6g} on rank {self.global_rank}) at step "
            f"{self.global_step} (epoch {self.current_epoch}) with learning rate {self.learning_rates()}; last "
            f"finite loss: {self.last_loss()}. Nothing was written to results.json; try a smaller optimizer.lr or "
            "method.lr"
        )

    def last_loss(self) -> str:
        return "none" if self.last_finite_loss is None else "{1:.6g} at step {0}".format(*self.last_finite_loss)

    def learning_rates(self) -> str:
        """The optimiser's learning rate(s) as the schedule has set them at this step, and the configured ones
        (``initial_lr``, where a schedule scales from) when they differ: a run that diverged at the end of a
        cosine schedule has rate 0 there, and it is the configured rate that the user has to lower."""
        try:
            groups = self.trainer.optimizers[0].param_groups
        except (AttributeError, IndexError, RuntimeError):
            return "unknown"
        show = lambda rates: ", ".join(f"{r:.3g}" for r in sorted(set(rates)))  # noqa: E731
        scheduled, configured = show(g["lr"] for g in groups), show(g.get("initial_lr", g["lr"]) for g in groups)
        if scheduled == configured:
            return scheduled
        return f"{scheduled} (scheduled at this step; configured {configured})"

    def optimizer_step(self, *args, **kwargs) -> None:
        super().optimizer_step(*args, **kwargs)
        # Right after the step, before any callback's on_train_batch_end: a checkpoint written there holds the
        # projected state (SVE's s >= 0), so a resumed run continues from exactly what this one trains on.
        self.method.constrain_()
        self.check_finite_parameters()

    def check_finite_parameters(self) -> None:
        """A step can leave the loss finite and the weights not (an overflowing update, the last step of a
        run): stop here, naming the step, rather than after training with non-finite test metrics. One fused
        norm per step over the trainable tensors (about 1% of the backbone for SVE)."""
        # Under trainer=fsdp each rank checks its own slice (the decision is reduced over ranks below).
        params = [p.to_local() if hasattr(p, "to_local") else p for p in self.method.trainable_parameters()]
        params = [p for p in params if p.numel()]
        finite = not params or bool(
            torch.isfinite(torch.stack([p.detach().abs().amax().float() for p in params])).all()
        )
        if self.trainer.world_size > 1:
            finite = self.trainer.strategy.reduce_boolean_decision(finite, all=True)
        if not finite:
            bad = [
                n
                for n, p in self.method.named_parameters()
                if p.requires_grad and not torch.isfinite(p.to_local() if hasattr(p, "to_local") else p).all()
            ]
            raise TrainingDiverged(
                f"training diverged: {len(bad)} trainable tensor(s) became non-finite in the optimiser step "
                f"{self.global_step} (epoch {self.current_epoch}) with learning rate {self.learning_rates()}, e.g. "
                f"{bad[:3]}; last finite loss: {self.last_loss()}. Nothing was written to results.json; try a "
                "smaller optimizer.lr or method.lr"
            )

    def on_train_epoch_end(self) -> None:
        self.method.on_train_epoch_end(self)

    @contextmanager
    def draws(self, index: Tensor | None) -> Iterator[None]:
        """Random numbers drawn while evaluating a batch (dropout, posterior samples) come from a generator
        seeded by the run's seed and the batch's examples, and the global random state is left as it was: the
        predictive is the same on any number of processes (the batches are, ``sve.data.sampling``) and
        evaluating never shifts the numbers that training draws next."""
        if index is None or not len(index):
            yield
            return
        with seeded_draws(hash((self.draw_seed, int(index[0]), len(index))) % 2**63):
            yield

    def val_predictive(self, batch: dict) -> tuple[Tensor, Tensor]:
        """The ensemble's predictive (N, C) and labels (N,) of one validation batch, padding rows dropped:
        what validation scores, here and in the learning curve (``sve.training.curves``)."""
        batch = dict(batch)
        valid = batch.pop("valid", None)
        with self.draws(batch.pop("index", None)):
            logits = check_member_logits(self.method(batch))
        labels = batch["labels"]
        if valid is not None:
            logits, labels = logits[:, valid], labels[valid]
        return predictive(logits, self.aggregate), labels

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        probs, labels = self.val_predictive(batch)
        if labels.numel():
            self.val_metrics.update(probs, labels)

    def on_validation_epoch_end(self) -> None:
        metrics = {k: v.float() for k, v in self.val_metrics.compute().items()}
        self.val_metrics.reset()
        bad = [k for k, v in metrics.items() if not bool(torch.isfinite(v).all())]
        if bad and not self.trainer.sanity_checking:  # weights huge but finite: the logits overflow
            raise TrainingDiverged(
                f"training diverged: non-finite validation metrics {bad} after optimiser step {self.global_step} "
                f"(epoch {self.current_epoch}) with learning rate {self.learning_rates()}; last finite loss: "
                f"{self.last_loss()}. Nothing was written to results.json; try a smaller optimizer.lr or method.lr"
            )
        self.log_dict(metrics, prog_bar=True)

    # ----- test: one evaluation set per trainer.test call (sve.runs.evaluation scores it) -----------------------------
    def on_test_epoch_start(self) -> None:
        self._collected: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []
        self.predictions: Predictions | None = None

    def test_step(self, batch: dict, batch_idx: int) -> None:
        valid = batch.pop("valid", torch.ones_like(batch["labels"], dtype=torch.bool))
        index = batch.pop("index", torch.arange(batch["labels"].shape[0]))
        with self.draws(index):
            logits = check_member_logits(self.method(batch))
        if self._collected and logits.shape[0] != self._collected[0][0].shape[0]:
            raise RuntimeError(
                f"{type(self.method).__name__} returned {logits.shape[0]} members in one test batch "
                f"and {self._collected[0][0].shape[0]} in another"
            )
        # float32 holds bf16 and float16 logits exactly; kept on the device until the gather
        self._collected.append(
            (logits.detach().float(), batch["labels"], valid.to(logits.device), index.to(logits.device))
        )

    def on_test_epoch_end(self) -> None:
        """Gathers every process's share; each example once (no DDP padding), in dataset order."""
        if not self._collected:
            raise RuntimeError("no test batch ran (trainer.limit_test_batches=0?): nothing to evaluate")
        logits, labels, valid, index = zip(*self._collected)
        logits = torch.cat(logits, dim=1)  # (M, n, C): this process's n examples, padding included
        labels, valid, index = torch.cat(labels), torch.cat(valid).to(torch.uint8), torch.cat(index)
        if self.trainer.world_size > 1:  # padded to the longest rank's share (all_gather needs equal shapes)
            most = int(self.all_gather(torch.tensor([labels.shape[0]], device=logits.device)).max())
            pad = most - labels.shape[0]
            logits, labels, valid, index = (
                F.pad(t, (0, 0, 0, pad)) if t.dim() == 3 else F.pad(t, (0, pad)) for t in (logits, labels, valid, index)
            )
            logits, labels, valid, index = (self.all_gather(t) for t in (logits, labels, valid, index))
            logits = logits.permute(1, 0, 2, 3).flatten(1, 2)  # (W, M, n, C) -> (M, W*n, C)
            labels, valid, index = labels.flatten(), valid.flatten(), index.flatten()
        valid = valid.bool()
        order = index[valid].argsort()
        self.predictions = Predictions(
            logits[:, valid][:, order].cpu(), labels[valid][order].cpu(), index[valid][order].cpu()
        )
        self._collected = []

    def configure_optimizers(self):
        # Methods may train at their own learning rate (Appendix C.3): method.lr overrides the recipe's.
        groups = self.method.parameter_groups()
        if not any(group["params"] for group in groups):
            raise ValueError(f"{type(self.method).__name__} has no trainable parameters")
        extra = {"lr": self.method.lr} if self.method.lr is not None else {}
        optimizer = self.optimizer_factory(groups, **extra)  # a group naming its own lr keeps it
        if self.scheduler_factory is None:
            return optimizer
        scheduler = self.scheduler_factory(
            optimizer, total_steps=int(self.trainer.estimated_stepping_batches), max_epochs=self.trainer.max_epochs
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
