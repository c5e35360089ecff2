"""Checkpoints that lose no work and resume exactly, holding only what training changed.

``LastCheckpoint`` writes ``<run dir>/checkpoints/last.ckpt`` at every epoch end, every ``every_n_steps``
optimiser steps, at the first step ``every_n_minutes`` after the last one written (a step of an LLM can take
half a minute: 200 steps were hours), and at the first step after a SIGTERM, before Lightning stops the run;
atomically (written beside it, then renamed), so a run killed at any moment leaves the previous complete
checkpoint. Besides Lightning's own state (trainable weights, optimiser, scheduler, loop
progress) it holds what exact resumption needs: the random states (torch, CUDA, numpy, Python), the data
position (epoch, global batches done, the order seed) and the wall time so far. When training is over, ``run``
writes ``final.ckpt`` beside it (``save_final``): the model as it is tested, for ``evaluate.py``.

Lean: frozen parameters (``requires_grad=False``: SVE's U and V, frozen backbones) are rebuilt from the
config, so the checkpoint keeps only trainable parameters, buffers and the methods' extra state, plus a
fingerprint (shape, dtype, SHA-256) of every frozen tensor; loading onto a model whose frozen part differs is
an error naming the tensors (``LeanCheckpointing``, mixed into the LightningModule).
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import time
import warnings
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Checkpoint

from sve.errors import InputError
from sve.layers.svd_cache import tensor_bytes

log = logging.getLogger(__name__)

FILENAME = "last.ckpt"
FINAL = "final.ckpt"


def random_states() -> dict:
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        # numpy's state as tensors and ints, so the checkpoint loads with weights_only=True. Its uint32 key is
        # stored as int64 (exactly): uint32 tensors do not survive the pickle round trip of DDP's
        # all_gather_object in torch 2.14 (the storage has no dtype when unpickled).
        "numpy": [
            (torch.from_numpy(v.astype(np.int64)) if isinstance(v, np.ndarray) else v) for v in np.random.get_state()
        ],
        "python": random.getstate(),
    }


def set_random_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    np.random.set_state(
        tuple(v.numpy().astype(np.uint32) if isinstance(v, torch.Tensor) else v for v in states["numpy"])
    )
    python = states["python"]
    random.setstate((python[0], tuple(python[1]), python[2]))


class LastCheckpoint(Checkpoint):
    """Writes ``dirpath/last.ckpt`` at every epoch end, every ``every_n_steps`` optimiser steps, every
    ``every_n_minutes`` of training (at the next step after), and at the next step after a SIGTERM.

    Args:
        dirpath: the run's checkpoint directory.
        every_n_steps: optimiser steps between mid-epoch checkpoints; null: not by steps.
        every_n_minutes: minutes of training between mid-epoch checkpoints; null: not by time.
    """

    def __init__(self, dirpath: str, every_n_steps: int | None = None, every_n_minutes: float | None = None):
        if every_n_steps is not None and (not isinstance(every_n_steps, int) or every_n_steps < 1):
            raise ValueError(
                f"callbacks.checkpoint.every_n_steps={every_n_steps!r} is not valid; "
                "expected a positive integer or null"
            )
        if every_n_minutes is not None and (
            isinstance(every_n_minutes, bool) or not isinstance(every_n_minutes, int | float) or every_n_minutes <= 0
        ):
            raise ValueError(
                f"callbacks.checkpoint.every_n_minutes={every_n_minutes!r} is not valid; "
                "expected a positive number or null"
            )
        self.dirpath = Path(dirpath)
        self.every_n_steps = every_n_steps
        self.every_n_minutes = every_n_minutes
        self.saved_at = time.perf_counter()  # when this attempt started or last wrote a checkpoint
        self.resumes_from: int | None = None  # the step the checkpoint on disk holds, once known to this run
        self.stop_pending = False  # SIGTERM came between two optimiser steps: stop at the next one
        self.started = time.perf_counter()
        self.previous_seconds = 0.0  # wall time of earlier attempts of this run (restored from the checkpoint)
        self.position: tuple[int, int] = (0, 0)
        self.pending_random_states: dict | None = None
        self.trainer: pl.Trainer | None = None
        self.saved_step = -1
        self.run_config: dict | None = None  # set by ``run``: a resume from this checkpoint compares its config

    @property
    def path(self) -> Path:
        return self.dirpath / FILENAME

    def elapsed(self) -> float:
        return self.previous_seconds + time.perf_counter() - self.started

    def setup(self, trainer, pl_module, stage: str) -> None:
        self.trainer = trainer

    # What Lightning stores under checkpoint["callbacks"]["LastCheckpoint"].
    def state_dict(self) -> dict:
        datamodule = self.trainer.datamodule if self.trainer is not None else None
        states = random_states()
        if torch.distributed.is_available() and torch.distributed.is_initialized():  # every rank has its own
            gathered = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(gathered, states)
            states = gathered
        else:
            states = [states]
        return {
            "position": self.position,
            "order_seed": getattr(datamodule, "order_seed", 0),
            "random_states": states,  # one per rank
            "elapsed_seconds": self.elapsed(),
            "run_config": self.run_config,
        }

    def load_state_dict(self, state: dict) -> None:
        # Lightning restores callbacks before it builds the dataloaders: the sampler starts where training was.
        self.previous_seconds = state["elapsed_seconds"]
        rank = self.trainer.global_rank if self.trainer is not None else 0
        states = state["random_states"]
        if len(states) != (self.trainer.world_size if self.trainer is not None else 1):
            warnings.warn(
                f"the checkpoint was written by {len(states)} process(es), this run has "
                f"{self.trainer.world_size}: training continues at the same global batch, but random "
                "numbers (dropout) differ from an uninterrupted run",
                stacklevel=2,
            )
        self.pending_random_states = states[rank % len(states)]
        datamodule = self.trainer.datamodule if self.trainer is not None else None
        if datamodule is not None:
            datamodule.order_seed = state["order_seed"]
            datamodule.resume_position = tuple(state["position"])
            # A strategy that restores after its setup (FSDP's ModelParallelStrategy) has built the training
            # loader already, when configure_optimizers asked for the step count: from the start of the data and
            # the first order seed. Lightning then builds it again at the start of fitting, from where training was.
            fit_loop = getattr(self.trainer, "fit_loop", None)
            if getattr(fit_loop, "_combined_loader", None) is not None:
                fit_loop._combined_loader = None

    def _apply_random_states(self) -> None:
        # At the first batch after resuming (or at the end of fitting when no batch is left), so whatever
        # Lightning did while restoring draws no number that the uninterrupted run would not have drawn.
        if self.pending_random_states is not None:
            set_random_states(self.pending_random_states)
            self.pending_random_states = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._apply_random_states()

    def on_fit_end(self, trainer, pl_module) -> None:
        self._apply_random_states()

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        self.resumes_from = int(checkpoint["global_step"])

    def on_train_start(self, trainer, pl_module) -> None:
        self.saved_at = time.perf_counter()  # minutes of training: not the build, the SVD or the probe before

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        # In global batches (optimiser steps), so the position means the same with any number of devices.
        self.position = (trainer.current_epoch, (batch_idx + 1) // trainer.accumulate_grad_batches)
        stepped = (batch_idx + 1) % trainer.accumulate_grad_batches == 0
        last_in_epoch = batch_idx + 1 >= trainer.num_training_batches  # the epoch-end checkpoint follows
        signals = trainer._signal_connector  # Lightning's record of SIGTERM (``trainer.received_sigterm``)
        if signals.received_sigterm and not stepped and not last_in_epoch:
            # A checkpoint holds whole optimiser steps: Lightning, which would stop after this batch, is told to
            # go on to the end of the step (seconds), and stops there, after the checkpoint.
            signals.received_sigterm, self.stop_pending = False, True
            return
        if not stepped or last_in_epoch or trainer.global_step == self.saved_step:
            return
        stopping = signals.received_sigterm or self.stop_pending
        due = (
            stopping
            or bool(self.every_n_steps and trainer.global_step % self.every_n_steps == 0)
            or bool(self.every_n_minutes and time.perf_counter() - self.saved_at >= 60 * self.every_n_minutes)
        )
        if (
            trainer.world_size > 1
        ):  # a checkpoint takes every rank: all write one when any rank's clock or signal says so
            due = trainer.strategy.reduce_boolean_decision(due, all=False)
        if due:
            self.save(trainer)
        if self.stop_pending:
            signals.received_sigterm, self.stop_pending = True, False

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        # Runs after the module's own epoch-end hook (Lightning calls Checkpoint callbacks last), so epoch-end
        # method state such as a checkpoint ensemble's snapshot is included.
        self.position = (trainer.current_epoch, -(-trainer.num_training_batches // trainer.accumulate_grad_batches))
        self.save(trainer)

    def save(self, trainer) -> None:
        for logger in trainer.loggers:  # the logs reach disk with the checkpoint: a resumed run continues them
            logger.save()
        save_atomically(trainer, self.path)
        self.saved_step = self.resumes_from = trainer.global_step
        self.saved_at = time.perf_counter()


def save_atomically(trainer, path: Path, weights_only: bool = False) -> None:
    """``trainer.save_checkpoint`` to a file beside ``path``, then renamed: never a half-written checkpoint.
    Every rank takes part; rank 0 writes."""
    tmp = path.with_name(f".{path.name}.tmp")
    trainer.save_checkpoint(tmp, weights_only=weights_only)
    if trainer.is_global_zero:
        os.replace(tmp, path)
    trainer.strategy.barrier(f"save {path.name}")


def save_final(trainer, dirpath: str | Path) -> Path:
    """``dirpath/final.ckpt``: the model as it is tested, after every round of training and ``after_fit``
    (a checkpoint ensemble's snapshots in use, a sequential deep ensemble's stored members), which
    ``last.ckpt`` (written at the last epoch end) is not. Weights and method state only (no optimiser),
    lean like every checkpoint here; ``evaluate.py`` loads it."""
    path = Path(dirpath) / FINAL
    path.parent.mkdir(parents=True, exist_ok=True)
    save_atomically(trainer, path, weights_only=True)
    return path


def sha256_of(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor_bytes(tensor)).hexdigest()


def frozen_fingerprint(module: torch.nn.Module) -> dict[str, list]:
    """(shape, dtype, identity) of every frozen parameter, by state-dict name. The identity is the SHA-256 of
    the bytes, except for a tensor that its layer computed from another (``factor_sources``: an SV layer's U
    and V^T come from an SVD of the pretrained weight): that one is named by its source. Its last bits depend
    on the machine's LAPACK and BLAS code paths (AVX2 against AVX-512, another MKL): a checkpoint made on one
    machine must still load on another that rebuilds the same factors from the same weight."""
    fingerprint = {}
    for prefix, owner in module.named_modules(remove_duplicate=False):
        sources = getattr(owner, "factor_sources", None) or {}
        for local, p in owner.named_parameters(recurse=False, remove_duplicate=False):
            if p.requires_grad:
                continue
            identity = f"computed from {sources[local]}" if local in sources else sha256_of(p)
            name = f"{prefix}.{local}" if prefix else local
            fingerprint[name] = [list(p.shape), str(p.dtype).removeprefix("torch."), identity]
    return fingerprint


class CheckpointMismatch(InputError):
    """The checkpoint's tensors are not the model's. ``detail`` says which; the message adds ``advice`` for a
    resumed run, and ``sve-eval`` replaces that advice with its own (an evaluation resumes nothing)."""

    def __init__(self, detail: str, advice: str):
        super().__init__(f"{detail}. {advice}")
        self.detail = detail


class LeanCheckpointing:
    """LightningModule mix-in: checkpoints without frozen parameters, checked against the model on load."""

    _fingerprint: tuple[frozenset, dict] | None = None

    def frozen_fingerprint(self) -> dict[str, list]:
        # Hashing a 7B backbone takes a while: once per set of frozen names (they do not change while frozen).
        frozen = frozenset(n for n, p in self.named_parameters(remove_duplicate=False) if not p.requires_grad)
        if self._fingerprint is None or self._fingerprint[0] != frozen:
            self._fingerprint = (frozen, frozen_fingerprint(self))
        return self._fingerprint[1]

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        fingerprint = self.frozen_fingerprint()
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k not in fingerprint}
        checkpoint["frozen_fingerprint"] = fingerprint

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        check_shapes(checkpoint["state_dict"], self.state_dict())
        saved = checkpoint.get("frozen_fingerprint")
        if saved is None:  # a full checkpoint (e.g. written by plain Lightning): nothing to rebuild
            return
        current = self.frozen_fingerprint()
        differ = sorted(n for n in set(saved) | set(current) if saved.get(n) != current.get(n))
        legacy = [n for n in differ if legacy_factor(saved.get(n), current.get(n))]
        if legacy:  # written before factors were named by their source: their bits may be another machine's
            params = dict(self.named_parameters(remove_duplicate=False))
            other_bits = [n for n in legacy if saved[n][2] != sha256_of(params[n])]
            if other_bits:
                log.warning(
                    "the checkpoint names SVD factors by their bytes (written before factors were named by "
                    "their source), and %d differ here, e.g. %s: the factors are rebuilt from this config's "
                    "weights; the other frozen tensors are checked byte for byte",
                    len(other_bits),
                    other_bits[0],
                )
            differ = [n for n in differ if n not in legacy]
        if differ:
            shown = ", ".join(
                f"{n} (checkpoint {saved.get(n, 'absent')[:2]}, model {current.get(n, 'absent')[:2]})"
                for n in differ[:3]
            )
            raise CheckpointMismatch(
                f"the checkpoint does not fit this model: {len(differ)} frozen tensor(s) differ, e.g. {shown}",
                "Frozen weights are not stored but rebuilt from the config: resume with the config the run started "
                "with (its .hydra/config.yaml: same backbone, method, seed)",
            )
        state = self.state_dict()
        checkpoint["state_dict"].update({k: state[k] for k in current})


def legacy_factor(saved: list | None, current: list | None) -> bool:
    """A factor this model names by its source (``factor_sources``) that an older checkpoint named by its bytes,
    with the same shape and dtype."""
    return (
        saved is not None
        and current is not None
        and saved[:2] == current[:2]
        and current[2].startswith("computed from ")
        and not saved[2].startswith("computed from ")
    )


def check_shapes(saved: dict, current: dict) -> None:
    """The checkpoint's tensors are this model's: same names, same shapes (another ensemble size, rank or
    head gives other shapes), in one line naming what differs."""
    differ = [
        f"{k} {list(v.shape)} (model {list(current[k].shape)})"
        for k, v in saved.items()
        if isinstance(v, torch.Tensor) and isinstance(current.get(k), torch.Tensor) and v.shape != current[k].shape
    ]
    unknown = [k for k in saved if k not in current]
    if differ or unknown:
        parts = ([f"{len(differ)} tensor(s) of another shape, e.g. {', '.join(differ[:3])}"] if differ else []) + (
            [f"{len(unknown)} tensor(s) this model does not have, e.g. {', '.join(unknown[:3])}"] if unknown else []
        )
        raise CheckpointMismatch(
            f"the checkpoint was written by another model: {'; '.join(parts)}",
            "Resume with the config the run started with (its run_config.yaml: ensemble_size, method, backbone)",
        )


def read_checkpoint(path: str | Path) -> dict:
    """Loads a checkpoint file safely (``weights_only``), or fails with what is wrong with the file."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"ckpt_path={path}: no such file")
    size = path.stat().st_size
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated zip, random bytes, pickles of arbitrary objects, ...
        reason = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        raise InputError(
            f"ckpt_path={path} ({size} bytes) is not a readable checkpoint of this framework ({reason}). It may be "
            "truncated, empty or another kind of file; checkpoints written here are complete (written, then "
            "renamed). Pass another ckpt_path, or delete the file to start the run afresh."
        ) from None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint or "loops" not in checkpoint:
        raise InputError(
            f"ckpt_path={path} is a torch file but not a Lightning training checkpoint (no state_dict and loop state)"
        )
    return checkpoint
