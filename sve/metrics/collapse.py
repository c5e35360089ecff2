"""Collapsed members: those whose output hardly depends on the input, and the warning that names them."""

from __future__ import annotations

import torch

# A member whose class logits (centred per example) vary across the test set by less than this (standard
# deviation) gives one answer whatever the input: it collapsed in training. Seen on MPNet-base with SVE at a rate
# tuned on a smaller model: one member of four at 7e-5, the other three at 1.3-1.6; members of runs that
# barely learn (SST-2 from random weights) stay above 0.04.
COLLAPSED_BELOW = 1e-3


def collapsed_members(member_logits: torch.Tensor) -> list[int]:
    """The members (indices into the first axis of (M, N, C) logits) whose every class logit, centred on each
    example, has a standard deviation across the N examples below ``COLLAPSED_BELOW``. Centred on the mean of
    the classes every example has, so a constant added to a member's logits changes nothing, and neither do
    options some examples lack (-inf: ARC's questions with fewer answers), which are left out of their class's
    deviation. One example cannot show it: none is returned. One member at a time in float64, so the check
    needs a member's logits twice over, not the whole ensemble's (ImageNet-size test sets)."""
    if member_logits.shape[1] < 2:
        return []
    common = torch.isfinite(member_logits).all(dim=1).all(dim=0)  # (C,): the classes of every example
    collapsed = []
    for m, logits in enumerate(member_logits):
        logits = logits.double()  # (N, C)
        finite = torch.isfinite(logits)
        if common.any():
            centred = logits - logits[:, common].mean(-1, keepdim=True)
        else:  # no class shared by all examples: log-probabilities (their normaliser moves with the options)
            centred = torch.log_softmax(logits, dim=-1)
        centred = torch.where(finite, centred, torch.nan)
        std = (centred - centred.nanmean(0)).square().nanmean(0).sqrt()  # (C,); a class seen once: 0
        if float(std.nan_to_num(0.0).max()) < COLLAPSED_BELOW:
            collapsed.append(m)
    return collapsed


def collapse_warning(collapsed: list[int], members: int, examples: str, learning_rate: str) -> str:
    """What to tell the user about ``collapsed`` members (of ``members``) found on ``examples`` (e.g. "test
    example"); ``learning_rate`` names the setting to lower (``method.lr`` for a run)."""
    return (
        f"member(s) {collapsed} of {members} give nearly the same output for every {examples} (their centred "
        f"logits vary by less than {COLLAPSED_BELOW}), and the ensemble averages them in: most often they "
        f"collapsed in training, which a lower learning rate ({learning_rate}) usually avoids; a tiny or random "
        "backbone whose features hardly depend on the input does the same"
    )
