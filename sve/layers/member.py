"""The member protocol shared by every layer that holds per-member parameters around a frozen base.

In the spirit of peft's tuner layers, one base class, ``MemberLayer``, gives the SV, SV-conv, LoRA,
BatchEnsemble and BLoB layers the same three ways of choosing what runs:

- **Member set.** A layer's members are its own per-member tensors (``ensemble_size`` of them), or a *bank*
  of stand-ins installed for a while with ``use_bank(lora_A=..., ...)``: posterior samples (BLoB, Laplace) or
  saved snapshots (checkpoint ensemble). Every per-member tensor is read through ``member_tensor(name)``, so
  a bank replaces the parameters without the layer's forward knowing.
- **Selection.** ``select(members)`` runs only the chosen members of the current set; a layer with a single
  member is shared by all rows and ignores the selection.
- **Layout.** With K > 1 selected members the input is K blocks stacked member-major along the leading
  dimension (``sve.members``). When the method has told the layer the number of rows of the member-major
  batch (``expect_rows``, part of what the layer runs now, as the selection is) and the leading dimension
  differs (a time-major input, position embeddings shared by the batch), the layer raises
  ``MemberLayoutError`` naming itself instead of splitting the wrong axis; a method finds such layers before
  it stacks its members (``EnsembleMethod.probe_member_layout``) and runs them one at a time, where the input
  may have any shape.

Owners that read ``.weight``/``.bias`` directly (timm's EVA qkv, ``nn.MultiheadAttention.out_proj``) get the
selected member's merged tensors, differentiable, in the base layer's layout; with several members selected
that is impossible and raises ``MemberLayoutError`` too. ``merge(m)`` folds member m into a plain layer.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager

import torch
from torch import Tensor, nn

from sve.errors import InputError
from sve.members import MemberLayoutError

try:  # Hugging Face's GPT-2 style layer stores its weight transposed: (in, out).
    from transformers.pytorch_utils import Conv1D
except ImportError:  # pragma: no cover - transformers is a hard dependency
    Conv1D = ()

# The layers whose selection, bank or rows are set now (inside ``select``, ``use_bank``, ``expect_rows``,
# ``running_as``): what a checkpointed block's recomputation must put back (sve.layers.recompute), found without
# walking the model.
# Ambient, not an argument (docs/architecture.md#global-state): its reader is the checkpoint's ``context_fn``,
# which PyTorch calls with no arguments at every checkpointed block; checkpointing is switched on when the
# backbone is loaded, before the method injects these layers, so there is no list to bind then; and walking the
# model at every block instead costs about 0.4 ms per walk of LLaMA-7B's 423 modules, 10-20 ms a forward over its
# 32 blocks (measured on a meta-device model). Weak, so a dropped layer is not kept alive.
_RUNNING: weakref.WeakSet = weakref.WeakSet()


def running_layers() -> list[MemberLayer]:
    return list(_RUNNING)


# Convolutions of 1, 2 and 3 dimensions (audio and sequence CNNs, image CNNs, volume and video CNNs), read the
# same way: the kernel as one (out, in * prod(kernel_size)) matrix. Index d - 1 is the d-dimensional one.
CONV_TYPES: tuple[type, ...] = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
ADAPTABLE_TYPES: tuple[type, ...] = (nn.Linear, *CONV_TYPES) + ((Conv1D,) if Conv1D else ())


def weight_matrix(layer: nn.Module) -> Tensor:
    """The weight as an (out, in') matrix, a view (gradients reach the parameter): (out, in) for nn.Linear
    and Hugging Face Conv1D (stored transposed), (out, in*k1*...*kd) for a convolution (PyTorch's kernel
    order)."""
    if isinstance(layer, nn.Linear):
        return layer.weight
    if Conv1D and isinstance(layer, Conv1D):
        return layer.weight.t()
    if isinstance(layer, CONV_TYPES):
        return layer.weight.flatten(1)
    raise TypeError(f"expected nn.Linear, nn.Conv1d/2d/3d or transformers Conv1D, got {type(layer).__name__}")


def member_padding(conv: nn.Module) -> tuple[int, ...] | str:
    """A convolution's zero padding per spatial axis, ``padding="same"`` and ``"valid"`` resolved as PyTorch
    pads. Where "same" pads one side more than the other (an even effective kernel size), which one number per
    axis cannot say, it stays the string ``"same"``: PyTorch's functional convolutions take it as the layer does
    (stride 1 only, as for the layer), grouped member convolutions included."""
    if not isinstance(conv.padding, str):
        return tuple(conv.padding)
    twice = conv._reversed_padding_repeated_twice  # (left, right) per axis, last axis first
    pairs = [(twice[i], twice[i + 1]) for i in range(0, len(twice), 2)][::-1]
    return "same" if any(left != right for left, right in pairs) else tuple(left for left, _ in pairs)


def check_layer(layer: nn.Module) -> None:
    """Rejects layers the adapters cannot read as one weight matrix."""
    if not isinstance(layer, ADAPTABLE_TYPES):
        raise TypeError(f"expected one of {[t.__name__ for t in ADAPTABLE_TYPES]}, got {type(layer).__name__}")
    if isinstance(layer, CONV_TYPES):
        reasons = [f"groups={layer.groups} (need 1)"] if layer.groups != 1 else []
        if layer.padding_mode != "zeros":
            reasons.append(f"padding_mode={layer.padding_mode!r} (need 'zeros')")
        if reasons:
            raise InputError(f"{type(layer).__name__} adapters cannot take this layer: {'; '.join(reasons)}")


class MemberLayer(nn.Module):
    """Base class; subclasses implement ``forward_members``, ``member_weight`` and ``member_bias``.

    Args:
        base: the pretrained layer whose geometry the members share (only its shape and kind are read here).
        ensemble_size: number of members M held as parameters.
    """

    def __init__(self, base: nn.Module, ensemble_size: int):
        super().__init__()
        check_layer(base)
        if not isinstance(ensemble_size, int) or ensemble_size < 1:
            raise InputError(f"ensemble_size must be a positive integer, got {ensemble_size!r}")
        self.ensemble_size = ensemble_size
        self.out_features, self.in_features = weight_matrix(base).shape
        # "conv": nn.Conv1d/2d/3d (``conv_dims`` spatial axes); "transposed": Hugging Face's Conv1D, a linear
        # stored (in, out).
        self.kind = (
            "conv" if isinstance(base, CONV_TYPES) else "transposed" if not isinstance(base, nn.Linear) else "linear"
        )
        if self.kind == "conv":
            self.in_channels, self.kernel_size = base.in_channels, base.kernel_size
            self.stride, self.padding, self.dilation = base.stride, member_padding(base), base.dilation
            self.conv_dims = len(base.kernel_size)
        self.module_name = type(self).__name__  # replaced by the injected path, for error messages
        self._selected: list[int] | None = None
        self._bank: dict[str, Tensor] | None = None
        self.rows: int | None = None  # rows of the member-major batch its input must have now (``expect_rows``)

    # ----- the member set and the selection -------------------------------------------------------------
    def num_members(self) -> int:
        """Size of the current member set: the bank's if one is installed, else ``ensemble_size``."""
        if self._bank:
            return next(iter(self._bank.values())).shape[0]
        return self.ensemble_size

    def member_tensor(self, name: str) -> Tensor:
        """The per-member tensor ``name`` (K, ...) of the current member set."""
        if self._bank is not None and name in self._bank:
            return self._bank[name]
        return getattr(self, name)

    def active_members(self) -> list[int]:
        if self._selected is None or self.num_members() == 1:
            return list(range(self.num_members()))
        return self._selected

    @contextmanager
    def select(self, members: int | Sequence[int]) -> Iterator[None]:
        """Runs only ``members`` (indices into the current member set) inside the context."""
        members = [members] if isinstance(members, int) else [int(m) for m in members]
        K = self.num_members()
        if K > 1 and (not members or any(not 0 <= m < K for m in members)):
            raise IndexError(f"{self.module_name}: members {members} out of range for {K} members")
        previous = self._selected
        self._run_as(members, self._bank, self.rows)
        try:
            yield
        finally:
            self._run_as(previous, self._bank, self.rows)

    @contextmanager
    def expect_rows(self, rows: int) -> Iterator[None]:
        """Inside: the input's leading dimension must be ``rows``, the member-major batch (K members x B examples)
        the method runs, whenever several members run (``check_layout``). The method says it, since the layer is
        called by its owner's forward with the input alone."""
        previous = self.rows
        self._run_as(self._selected, self._bank, int(rows))
        try:
            yield
        finally:
            self._run_as(self._selected, self._bank, previous)

    def _run_as(self, selected: list[int] | None, bank: dict[str, Tensor] | None, rows: int | None) -> None:
        self._selected, self._bank, self.rows = selected, bank, rows
        if selected is None and bank is None and rows is None:
            _RUNNING.discard(self)
        else:
            _RUNNING.add(self)

    def running(self) -> tuple[list[int] | None, dict[str, Tensor] | None, int | None]:
        """What runs now, (selection, bank, rows), for ``running_as`` (a checkpointed block's recomputation)."""
        return self._selected, self._bank, self.rows

    @contextmanager
    def running_as(self, state: tuple[list[int] | None, dict[str, Tensor] | None, int | None]) -> Iterator[None]:
        """Inside: the selection, bank and rows of ``state``, as ``running()`` noted them."""
        previous = self.running()
        self._run_as(*state)
        try:
            yield
        finally:
            self._run_as(*previous)

    @contextmanager
    def use_bank(self, **tensors: Tensor) -> Iterator[None]:
        """Replaces per-member tensors by stand-ins (K, ...) inside the context (samples, snapshots)."""
        sizes = {t.shape[0] for t in tensors.values()}
        if len(sizes) != 1:
            raise ValueError(f"{self.module_name}: bank tensors disagree on the member count: {sorted(sizes)}")
        for name, t in tensors.items():
            own = getattr(self, name)
            if t.shape[1:] != own.shape[1:]:
                raise ValueError(
                    f"{self.module_name}: bank '{name}' has shape {tuple(t.shape)}, members of "
                    f"'{name}' have {tuple(own.shape[1:])}"
                )
        previous = self._bank
        self._run_as(self._selected, dict(tensors), self.rows)
        try:
            yield
        finally:
            self._run_as(self._selected, previous, self.rows)

    def pick(self, name: str, members: list[int]) -> Tensor:
        """Rows ``members`` of a per-member tensor, without a copy when all members run."""
        t = self.member_tensor(name)
        return t if members == list(range(t.shape[0])) else t[members]

    # ----- forward ----------------------------------------------------------------------------------------
    def forward(self, x: Tensor) -> Tensor:
        members = self.active_members()
        if len(members) > 1:
            self.check_layout(x, len(members))
        return self.forward_members(x, members)

    def check_layout(self, x: Tensor, K: int) -> None:
        rows = self.rows
        if (rows is not None and x.shape[0] != rows) or x.shape[0] % K:
            expected = f"{rows} rows ({K} members x {rows // K} examples)" if rows else f"a multiple of {K}"
            raise MemberLayoutError(
                f"{self.module_name} got an input of shape {tuple(x.shape)} whose leading dimension is not the "
                f"member-major batch ({expected}): its owner does not call it batch-first (e.g. a time-major "
                "input or embeddings shared by the batch). Run the members one at a time "
                "(method.members_at_once=1)",
                module=self.module_name,
            )

    def forward_members(self, x: Tensor, members: list[int]) -> Tensor:  # pragma: no cover - abstract
        """Member k of ``members`` on block k of x (K blocks member-major; with K = 1 any shape)."""
        raise NotImplementedError

    def member_weight(self, member: int) -> Tensor:  # pragma: no cover - abstract
        """Member ``member``'s weight as an (out, in') matrix, differentiable."""
        raise NotImplementedError

    def member_bias(self, member: int) -> Tensor | None:  # pragma: no cover - abstract
        raise NotImplementedError

    # ----- what owners and exporters read ----------------------------------------------------------------
    def _only_member(self, what: str) -> int:
        members = self.active_members()
        if len(members) != 1:
            raise MemberLayoutError(
                f"{self.module_name}.{what} was read directly by its owner while {len(members)} members run "
                "batched; such owners need the members one at a time (method.members_at_once=1)",
                module=self.module_name,
            )
        return members[0]

    @property
    def weight(self) -> Tensor:
        """The selected member's merged weight in the base layer's layout and dtype."""
        W = self.member_weight(self._only_member("weight")).to(self.base_dtype)
        if self.kind == "conv":
            return W.reshape(self.out_features, self.in_channels, *self.kernel_size)
        return W.t() if self.kind == "transposed" else W

    @property
    def bias(self) -> Tensor | None:
        b = self.member_bias(self._only_member("bias"))
        return None if b is None else b.to(self.base_dtype)

    @property
    def base_dtype(self) -> torch.dtype:  # pragma: no cover - abstract
        raise NotImplementedError

    @torch.no_grad()
    def merge(self, member: int) -> nn.Module:
        """A plain layer computing member ``member`` of the current set (nn.Conv1d/2d/3d for a convolution, else
        nn.Linear, also for a Hugging Face Conv1D), for export or single-member inference."""
        if not 0 <= member < self.num_members():
            raise IndexError(f"member {member} out of range for {self.num_members()} members")
        return self.plain(self.member_weight(member), self.member_bias(member))

    @torch.no_grad()
    def plain(self, W: Tensor, b: Tensor | None) -> nn.Module:
        """A plain layer of this layer's geometry (as ``merge`` gives) with the weight ``W`` (out, in') and the
        bias ``b``: a member's, or the mean of the members' (``sve.api.export``)."""
        if self.kind == "conv":
            layer = CONV_TYPES[self.conv_dims - 1](
                self.in_channels,
                self.out_features,
                self.kernel_size,
                self.stride,
                self.padding,
                self.dilation,
                bias=b is not None,
            )
            layer.weight.copy_(W.reshape_as(layer.weight))
        else:
            layer = nn.Linear(self.in_features, self.out_features, bias=b is not None)
            layer.weight.copy_(W)
        if b is not None:
            layer.bias.copy_(b)
        return layer.to(device=W.device, dtype=self.base_dtype)


def member_layers(module: nn.Module) -> list[MemberLayer]:
    return [m for m in module.modules() if isinstance(m, MemberLayer)]


@contextmanager
def rows_times(module: nn.Module, factor: int) -> Iterator[None]:
    """Inside: each member layer of ``module`` that expects a member-major batch expects ``factor`` times its
    rows (a backbone whose batch grows on the way: ``choice_lm``'s C continuations of each stem)."""
    with ExitStack() as stack:
        for layer in member_layers(module):
            if layer.rows is not None:
                stack.enter_context(layer.expect_rows(layer.rows * factor))
        yield


__all__ = [
    "MemberLayer",
    "MemberLayoutError",
    "member_layers",
    "rows_times",
    "weight_matrix",
    "check_layer",
    "ADAPTABLE_TYPES",
    "CONV_TYPES",
]
