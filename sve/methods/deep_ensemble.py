"""Deep ensemble (Lakshminarayanan et al., 2017): M full fine-tunes with their own heads and seeds
(C.3: M = 4, lr 1e-4).

Two ways to run it, recorded in ``mode`` (and in results.json through ``report()``):

- ``in_memory``: M backbone copies live side by side and train jointly in one fit with the mean member loss
  (Eq. 6). Members share no tensor, so each copy's gradient is its own loss's gradient divided by M, which
  Adam's update ignores (up to its epsilon). What they do share is the trainer's gradient clipping, which
  clips the global norm over all members.
- ``sequential``: for when M copies (weights, gradients, two Adam moments each) do not fit on the device.
  Members are trained ``chunk_size`` at a time, one fit per round (``next_round``, called by ``run``), each
  round starting from the pretrained weights with a fresh optimiser and its own seed; finished members are
  kept on the CPU. At evaluation each chunk of members is loaded in turn and the logits are stacked, which
  costs one weight transfer per chunk and batch. Finished members are not part of the ``state_dict``.

``mode: auto`` picks ``in_memory`` when M copies plus their gradients and Adam moments take under half of
the free accelerator memory (always on the CPU), else ``sequential``. One exception: when the backbone
supplies a pretrained head (its own task, e.g. the CIFAR-10 ResNet on CIFAR-10), every member starts from
the same weights, and in memory every member sees the same batches, so the M members would be one model M
times (measured on mini Table 1: equal member accuracies, no disagreement). ``auto`` then trains them ``sequential``,
where each round draws its own data order; what differs between members is that order. Members trained in
one chunk share it, so this uses chunks of one, and an explicit ``in_memory`` (or ``chunk_size`` > 1) with a
pretrained head warns.
"""

from __future__ import annotations

import copy
import logging
import warnings

import torch
from torch import Tensor, nn

from sve.members import check_member_logits
from sve.methods.base import EnsembleMethod, count_parameters, mask_choices

log = logging.getLogger(__name__)
MODES = ("auto", "in_memory", "sequential")


def choose_mode(backbone: nn.Module, ensemble_size: int) -> str:
    """``in_memory`` if M copies with gradients and two Adam moments fit in half the free accelerator memory."""
    if not torch.cuda.is_available():
        return "in_memory"
    need = 4 * ensemble_size * sum(p.numel() * p.element_size() for p in backbone.parameters())
    free, _ = torch.cuda.mem_get_info()
    return "in_memory" if need < free / 2 else "sequential"


def cpu_state(module: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}


class DeepEnsemble(EnsembleMethod):
    """Args:
    mode: ``auto``, ``in_memory`` or ``sequential`` (see the module docstring).
    chunk_size: members trained (and evaluated) together in sequential mode.
    """

    train_backbone = True
    chunked_training = False  # its memory lever is the sequential mode's rounds (chunk_size)

    def __init__(self, backbone, ensemble_size: int, num_classes: int, mode: str = "auto", chunk_size: int = 1,
                 **common):
        super().__init__(backbone, ensemble_size, num_classes, **common)
        if mode not in MODES:
            raise ValueError(f"mode={mode!r} is not valid; choose one of {list(MODES)}")
        self.adapt()  # before copying: the copies inherit which parameters train
        M = self.ensemble_size
        same_start = self.head_pretrained  # every member starts from the same weights (docstring)
        if mode == "auto":
            self.mode = "sequential" if same_start else choose_mode(backbone, M)
            chunk_size = 1 if same_start else chunk_size
        else:
            self.mode = mode
        self.chunk_size = M if self.mode == "in_memory" else max(1, min(chunk_size, M))
        if same_start and self.chunk_size > 1:
            warnings.warn(f"DeepEnsemble: the head is {self.head_init}, so every member starts from the same "
                          f"weights, and the {self.chunk_size} members trained together (mode={self.mode}, "
                          f"chunk_size={self.chunk_size}) see the same batches: they stay identical. Use "
                          f"mode=sequential with chunk_size=1 (or mode=auto) for members of their own.",
                          stacklevel=2)  # fmt: skip
        if self.mode == "sequential":  # evaluation loads one chunk of stored members per pass
            k = self.members_at_once if isinstance(self.members_at_once, int) else self.chunk_size
            self.members_at_once = min(k, self.chunk_size)
        self.seed = torch.initial_seed()
        # Working copies: all M members in memory, or one chunk. Copy 0 is the backbone itself.
        self.members = nn.ModuleList([backbone] + [copy.deepcopy(backbone) for _ in range(self.chunk_size - 1)])
        self.initial = cpu_state(backbone) if self.mode == "sequential" else None
        self.store: list[dict[str, Tensor] | None] = [None] * M  # finished members (sequential mode)
        self.round = 0
        self.loaded = list(range(self.chunk_size))  # member held by each working copy
        self.finished = self.mode == "in_memory"
        log.info("DeepEnsemble: %d members, mode=%s, chunk_size=%d", M, self.mode, self.chunk_size)

    @property
    def rounds(self) -> int:
        return -(-self.ensemble_size // self.chunk_size)

    def active(self) -> list[int]:
        start = self.round * self.chunk_size
        return list(range(start, min(start + self.chunk_size, self.ensemble_size)))

    def next_round(self) -> bool:
        """Stores the members just trained; loads the initial weights for the next round, if any."""
        if self.mode == "in_memory":
            return False
        for copy_, member in zip(self.members, self.active()):
            self.store[member] = cpu_state(copy_)
        if self.round + 1 >= self.rounds:
            self.finished = True
            return False
        self.round += 1
        for copy_ in self.members:
            copy_.load_state_dict(self.initial)
        self.loaded = self.active()
        torch.manual_seed(self.seed + self.round)  # each round its own seed (data order, dropout)
        log.info("DeepEnsemble: training members %s (round %d of %d)", self.loaded, self.round + 1, self.rounds)
        return True

    def copies(self, members: list[int]) -> list[nn.Module]:
        """The working copies holding ``members``, loading finished members from the store if needed."""
        if self.mode == "in_memory":
            return [self.members[m] for m in members]
        if self.loaded[: len(members)] != members:
            for copy_, member in zip(self.members, members):
                copy_.load_state_dict(self.store[member])
            self.loaded = list(members)
        return list(self.members[: len(members)])

    def member_features(self, batch: dict, members: list[int]) -> Tensor:
        return torch.stack([copy_(batch) for copy_ in self.copies(members)])  # (K, B, D)

    def num_members(self) -> int:
        return len(self.active()) if self.training or not self.finished else self.ensemble_size

    def forward(self, batch: dict) -> Tensor:
        if self.training or not self.finished:  # training, or validation during a round
            members = self.active()
            return check_member_logits(mask_choices(self.member_logits(batch, members), batch), len(members))
        return super().forward(batch)

    def get_extra_state(self) -> dict:
        """Round state and finished members (sequential mode), so a checkpoint resumes the right round."""
        return {"round": self.round, "finished": self.finished, "loaded": self.loaded, "store": self.store}

    def set_extra_state(self, state: dict) -> None:
        self.round, self.finished = int(state["round"]), bool(state["finished"])
        self.loaded, self.store = list(state["loaded"]), list(state["store"])

    def parameter_counts(self) -> dict[str, int]:
        """All M members' parameters, whether they sit on the device or in the CPU store."""
        if not hasattr(self, "members"):  # adapt() logs before the copies exist
            return super().parameter_counts()
        total = self.ensemble_size * count_parameters(self.members[0]) + count_parameters(self.heads)
        trainable = self.ensemble_size * sum(p.numel() for p in self.members[0].parameters() if p.requires_grad)
        return {"trainable": trainable + count_parameters(self.heads), "total": total}

    def report(self) -> dict:
        return {**super().report(), "mode": self.mode, "chunk_size": self.chunk_size, "rounds": self.rounds}
