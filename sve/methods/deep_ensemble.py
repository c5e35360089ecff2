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
  The heads are one (M, C, D) tensor that every round's optimiser holds whole: rows of members not in the
  round get zero gradients, but AdamW's decoupled weight decay still shrinks them each step. So each
  finished member's head rows are stored with it and put back when a round starts and when the last ends,
  and each round's members start from their heads as drawn at construction: every member is its round's
  result, as if it had been trained alone.

``mode: auto`` picks ``in_memory`` when M copies plus their gradients and Adam moments take under half of
the free accelerator memory (always on the CPU), else ``sequential``. One exception: when the backbone
supplies a pretrained head (its own task, e.g. the CIFAR-10 ResNet on CIFAR-10), every member starts from
the same weights, and in memory every member sees the same batches, so the M members would be one model M
times (measured on mini Table 1: equal member accuracies, no disagreement). ``auto`` then trains them ``sequential``,
where each round draws its own data order; what differs between members is that order. Members trained in
one chunk share it, so this uses chunks of one, and an explicit ``in_memory`` (or ``chunk_size`` > 1) with a
pretrained head warns.

``DeepEnsembleLoRA`` (``method=deep_ensemble_lora``) is the deep ensemble as Yang et al. (2024) ran it on
LLaMA-2-7B (Table 3's Deep Ensemble row): each member is a LoRA fine-tune, an adapter and a head on the shared
frozen backbone, and members are independent runs with their own seeds. The backbone is held once: every
target layer is a ``LoRALayer`` with one adapter per member, and a round trains its members' adapters and
heads only (``select``). A member's trainable tensors are stored on the CPU when its round ends, never a copy
of the backbone; the next round's members are drawn afresh from that round's seed (LoRA A as nn.Linear's
init, B = 0, a random head or the pretrained one) before they train. Members that are not training still sit
in the optimiser, with zero gradients, where AdamW's weight decay moves them a little, so the stored tensors
are put back when a round starts and when the last one ends: each member is its round's result. ``auto``
trains round by round (``sequential``): in memory, the members would be LoRA-Ensemble's, trained jointly on
the same batches.
"""

from __future__ import annotations

import copy
import logging
import warnings

import torch
from torch import Tensor, nn
from torch._subclasses.fake_tensor import is_fake

from sve.distributed import load_state
from sve.errors import InputError
from sve.layers.lora import LoRALayer
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


def whole(tensor: Tensor) -> Tensor:
    """A sharded tensor gathered whole (collective), on the CPU; any other tensor as it is."""
    return tensor.full_tensor().cpu() if hasattr(tensor, "full_tensor") else tensor


class DeepEnsemble(EnsembleMethod):
    """Args:
    mode: ``auto``, ``in_memory`` or ``sequential`` (see the module docstring).
    chunk_size: members trained (and evaluated) together in sequential mode.
    """

    display_name = "Deep Ensemble"
    trains = "M copies of the whole backbone, each with its head"

    train_backbone = True

    def __init__(
        self, backbone, ensemble_size: int, num_classes: int, mode: str = "auto", chunk_size: int = 1, **common
    ):
        super().__init__(backbone, ensemble_size, num_classes, **common)
        if mode not in MODES:
            raise InputError(f"mode={mode!r} is not valid; choose one of {list(MODES)}")
        self.adapt()  # before copying: the copies inherit which parameters train
        M = self.ensemble_size
        self.mode, self.chunk_size = self.plan(mode, chunk_size)
        self.seed = torch.initial_seed()
        self.hold_members()
        self.store: list[dict[str, Tensor] | None] = [None] * M  # finished members (sequential mode)
        self.head_rows: list[tuple[Tensor, Tensor] | None] = [None] * M  # their heads (full fine-tune)
        self.round = 0
        self.loaded = list(range(self.chunk_size))  # member held by each working copy
        self.finished = self.mode == "in_memory"
        log.info("%s: %d members, mode=%s, chunk_size=%d", type(self).__name__, M, self.mode, self.chunk_size)

    def training_chunks(self, members_at_once: int | str | None = None) -> None:
        """Never split: the memory lever of a deep ensemble is the sequential mode's rounds (``chunk_size``)."""
        return None

    def plan(self, mode: str, chunk_size: int) -> tuple[str, int]:
        """(mode, chunk_size) as run: ``auto`` resolved, chunks within 1..M (module docstring)."""
        M = self.ensemble_size
        same_start = self.head_pretrained  # every member starts from the same weights (docstring)
        if mode == "auto":
            mode = "sequential" if same_start else choose_mode(self.backbone, M)
            chunk_size = 1 if same_start else chunk_size
        chunk_size = M if mode == "in_memory" else max(1, min(chunk_size, M))
        if same_start and chunk_size > 1:
            warnings.warn(
                f"DeepEnsemble: the head is {self.head_init}, so every member starts from the same "
                f"weights, and the {chunk_size} members trained together (mode={mode}, "
                f"chunk_size={chunk_size}) see the same batches: they stay identical. Use "
                f"mode=sequential with chunk_size=1 (or mode=auto) for members of their own.",
                stacklevel=3,
            )
        if mode == "sequential":  # evaluation loads one chunk of stored members per pass
            k = self.members_at_once if isinstance(self.members_at_once, int) else chunk_size
            self.members_at_once = min(k, chunk_size)
        return mode, chunk_size

    def hold_members(self) -> None:
        """Working copies: all M members in memory, or one chunk. Copy 0 is the backbone itself."""
        backbone = self.backbone
        self.members = nn.ModuleList([backbone] + [copy_module(backbone) for _ in range(self.chunk_size - 1)])
        self.initial = cpu_state(backbone) if self.mode == "sequential" else None
        self.initial_heads = cpu_state(self.heads) if self.mode == "sequential" else None  # before sharding

    @property
    def rounds(self) -> int:
        return -(-self.ensemble_size // self.chunk_size)

    def active(self) -> list[int]:
        start = self.round * self.chunk_size
        return list(range(start, min(start + self.chunk_size, self.ensemble_size)))

    def next_round(self) -> bool:
        """Stores the members just trained; starts the next round's, if any."""
        if self.mode == "in_memory" or self.finished:
            return False
        for slot, member in enumerate(self.active()):
            self.store[member] = self.member_state(slot, member)
        self.keep_head_rows(self.active())
        if self.round + 1 >= self.rounds:
            self.finished = True
            self.end_rounds()
            return False
        self.round += 1
        torch.manual_seed(self.seed + self.round)  # each round its own seed (data order, dropout, fresh draws)
        self.start_round()
        log.info(
            "%s: training members %s (round %d of %d)", type(self).__name__, self.active(), self.round + 1, self.rounds
        )
        return True

    def member_state(self, slot: int, member: int) -> dict[str, Tensor]:
        """What the store keeps of ``member``, trained in working copy ``slot``: the copy's whole state."""
        return cpu_state(self.members[slot])

    def start_round(self) -> None:
        """The working copies back to the initial weights, for this round's members (under ``trainer=fsdp``
        the whole initial weights are cut to this rank's shards: ``load_state``)."""
        for copy_ in self.members:
            load_state(copy_, self.initial)
        self.put_back_heads(starting=self.active())
        self.loaded = self.active()

    def own_heads(self) -> bool:
        """One head per member (a shared head is trained by every round, so it has no rows to keep)."""
        return self.heads.weight.shape[0] == self.ensemble_size

    @torch.no_grad()
    def keep_head_rows(self, members: list[int]) -> None:
        """The just-trained members' head rows, whole and on the CPU (gathering is a collective: every rank)."""
        if not self.own_heads() or self.initial_heads is None:  # DeepEnsembleLoRA stores heads with adapters
            return
        weight, bias = whole(self.heads.weight.detach()), whole(self.heads.bias.detach())
        for m in members:
            self.head_rows[m] = (weight[m].to("cpu", copy=True), bias[m].to("cpu", copy=True))

    @torch.no_grad()
    def put_back_heads(self, starting: list[int] = ()) -> None:
        """Finished members' head rows as stored, ``starting`` members' as drawn at construction (docstring)."""
        if not self.own_heads() or self.initial_heads is None:
            return
        weight, bias = (whole(t.detach()).to("cpu", copy=True) for t in (self.heads.weight, self.heads.bias))
        for m in starting:
            weight[m], bias[m] = self.initial_heads["weight"][m], self.initial_heads["bias"][m]
        for m, rows in enumerate(self.head_rows):
            if rows is not None:
                weight[m], bias[m] = rows
        load_state(self.heads, {"weight": weight, "bias": bias})

    def unshard_state(self) -> None:
        """Called on every rank when a sharded method is made whole after training (``unshard_method``): the
        stored members (this rank's shards, as they were when stored) become whole tensors too."""
        self.store = [None if state is None else {k: whole(v) for k, v in state.items()} for state in self.store]

    def end_rounds(self) -> None:
        """Puts the heads back as stored after the last round (members load from the store when evaluated)."""
        self.put_back_heads()

    def copies(self, members: list[int]) -> list[nn.Module]:
        """The working copies holding ``members``, loading finished members from the store if needed."""
        if self.mode == "in_memory":
            return [self.members[m] for m in members]
        if self.loaded[: len(members)] != members:
            for copy_, member in zip(self.members, members):
                load_state(copy_, self.store[member])
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
        return {
            "round": self.round,
            "finished": self.finished,
            "loaded": self.loaded,
            "store": self.store,
            "head_rows": self.head_rows,
        }

    def set_extra_state(self, state: dict) -> None:
        self.round, self.finished = int(state["round"]), bool(state["finished"])
        self.loaded, self.store = list(state["loaded"]), list(state["store"])
        self.head_rows = list(state.get("head_rows", [None] * self.ensemble_size))  # older checkpoints: none

    def parameter_counts(self) -> dict[str, int]:
        """All M members' parameters, whether they sit on the device or in the CPU store."""
        if not hasattr(self, "members"):  # adapt() logs before the copies exist
            return super().parameter_counts()
        total = self.ensemble_size * count_parameters(self.members[0]) + count_parameters(self.heads)
        trainable = self.ensemble_size * sum(p.numel() for p in self.members[0].parameters() if p.requires_grad)
        return {"trainable": trainable + count_parameters(self.heads), "total": total}

    def report(self) -> dict:
        return {**super().report(), "mode": self.mode, "chunk_size": self.chunk_size, "rounds": self.rounds}


class DeepEnsembleLoRA(DeepEnsemble):
    """Args:
    rank, alpha, dropout: every member's LoRA adapter (Yang et al.: 8, 16, LoRA dropout 0.1).
    mode: ``auto`` (= ``sequential``: one run per member), ``sequential`` or ``in_memory`` (jointly trained).
    chunk_size: members trained together per round in sequential mode.
    """

    display_name = "Deep Ensemble (LoRA)"
    trains = "one LoRA adapter and one head per member, round by round"

    train_backbone = False  # the members are adapters on the one frozen backbone

    def __init__(
        self,
        backbone,
        ensemble_size: int,
        num_classes: int,
        rank: int = 8,
        alpha: float = 16.0,
        dropout: float = 0.1,
        mode: str = "auto",
        chunk_size: int = 1,
        **common,
    ):
        if not 0 <= dropout < 1:
            raise InputError(f"method.dropout={dropout} is not valid: the LoRA dropout must be in [0, 1)")
        self.rank, self.alpha, self.dropout = rank, alpha, float(dropout)  # read by make_layer, in adapt()
        super().__init__(backbone, ensemble_size, num_classes, mode=mode, chunk_size=chunk_size, **common)

    def make_layer(self, layer: nn.Module) -> LoRALayer:
        return LoRALayer(layer, self.ensemble_size, self.rank, self.alpha, self.dropout)

    def check_sharding(self) -> None:
        """Rows of (M, ...) tensors are its members: FSDP would split them over ranks. The adapters are ~1% of
        the backbone, so trainer=gpu or ddp holds them; sharding is for full fine-tunes."""
        raise InputError(
            f"trainer=fsdp cannot shard {type(self).__name__}: its trainable tensors hold one row "
            "per member and it reads them member by member; it trains ~1% of the backbone, so use "
            "trainer=gpu or trainer=ddp"
        )

    def lora_layers(self) -> list[LoRALayer]:
        return [m for m in self.modules() if isinstance(m, LoRALayer)]

    def plan(self, mode: str, chunk_size: int) -> tuple[str, int]:
        """``auto`` is ``sequential``; members differ by their adapters' draws even from a pretrained head."""
        mode = "sequential" if mode == "auto" else mode
        return mode, self.ensemble_size if mode == "in_memory" else max(1, min(chunk_size, self.ensemble_size))

    def hold_members(self) -> None:
        """Nothing to copy: every member's adapter lives in the layers, its head in the heads (stored with the
        adapter: ``member_state``)."""
        self.initial_heads = None
        with torch.no_grad():  # the pretrained head (if any), which every round's members start from
            self.head_start = (
                (self.heads.weight[0].clone(), self.heads.bias[0].clone()) if self.head_pretrained else None
            )

    def trained(self) -> dict[str, nn.Parameter]:
        """The trainable tensors, each (M, ...): row m is member m's."""
        params = {n: p for n, p in self.named_parameters() if p.requires_grad}
        wrong = [n for n, p in params.items() if p.shape[0] != self.ensemble_size]
        if wrong:  # pragma: no cover - every adapter and head has one row per member
            raise RuntimeError(f"DeepEnsembleLoRA: trainable tensors without one row per member: {wrong[:4]}")
        return params

    def member_state(self, slot: int, member: int) -> dict[str, Tensor]:
        """Member ``member``'s rows of the trainable tensors: its adapter and head, never the backbone."""
        return {n: p[member].detach().to("cpu", copy=True) for n, p in self.trained().items()}

    @torch.no_grad()
    def put_back(self) -> None:
        """The finished members' rows as they were stored (weight decay moved them during later rounds)."""
        params = self.trained()
        for member, state in enumerate(self.store):
            for name, row in (state or {}).items():
                params[name][member].copy_(row)

    @torch.no_grad()
    def start_round(self) -> None:
        """This round's members drawn afresh from the round's seed (set by ``next_round``)."""
        self.put_back()
        members = self.active()
        for layer in self.lora_layers():
            layer.reset(members)
        for m in members:
            if self.head_start is not None:
                weight, bias = self.head_start
            else:  # nn.Linear's init, as MemberHeads draws every head
                fresh = nn.Linear(self.heads.weight.shape[2], self.heads.weight.shape[1])
                weight, bias = fresh.weight, fresh.bias
            self.heads.weight[m].copy_(weight)
            self.heads.bias[m].copy_(bias)
        self.loaded = members

    def end_rounds(self) -> None:
        self.put_back()

    def member_features(self, batch: dict, members: list[int]) -> Tensor:
        return EnsembleMethod.member_features(self, batch, members)  # the one backbone, members selected

    def parameter_counts(self) -> dict[str, int]:
        return EnsembleMethod.parameter_counts(self)  # the backbone once, M adapters and heads

    def report(self) -> dict:
        return {**super().report(), "rank": self.rank, "alpha": self.alpha, "dropout": self.dropout}


def copy_module(module: nn.Module) -> nn.Module:
    """``copy.deepcopy`` of a member's backbone. On fake tensors (a memory plan, ``sve.runs.plan``) each tensor is
    cloned beforehand into deepcopy's memo: ``Tensor.__deepcopy__`` reads a fake tensor's data pointer, which
    torch 2.14 calls undefined behaviour, and planning Table 2's deep ensemble (M = 8) died of a corrupted heap."""
    if not any(is_fake(t) for t in [*module.parameters(), *module.buffers()]):
        return copy.deepcopy(module)
    with torch.no_grad():
        memo = {id(p): nn.Parameter(p.clone(), requires_grad=p.requires_grad) for p in module.parameters()}
        memo.update({id(b): b.clone() for b in module.buffers()})
    return copy.deepcopy(module, memo)
