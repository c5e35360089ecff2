"""Collapsed members (sve.metrics.collapse): a member whose answer does not depend on the input is named, whatever
constant its logits carry and whatever options some examples lack."""

import torch

from sve.metrics.collapse import collapsed_members


def test_a_member_that_answers_the_same_whatever_the_input_is_named_as_collapsed():
    # Four members on 50 examples of 3 classes: 0 learned, 1 collapsed (its logits vary by 1e-5, as one SVE member
    # of four on MPNet-base did: 7e-5), 2 is 0's logits plus 7 (the same answers: not collapsed), 3 barely
    # learned (0.01 of spread; runs from random weights have 0.04: still an answer per input).
    g = torch.Generator().manual_seed(0)
    learned = torch.randn(50, 3, generator=g) * 2
    collapsed = torch.tensor([0.3, -0.1, 0.2]) + 1e-5 * torch.randn(50, 3, generator=g)
    weak = 0.01 * torch.randn(50, 3, generator=g)
    logits = torch.stack([learned, collapsed, learned + 7.0, weak])
    assert collapsed_members(logits) == [1]
    # Options an example does not have (-inf, as ARC's padded answers) are left out, not turned into NaN, and
    # do not make a collapsed member look input-dependent.
    padded = logits.clone()
    padded[:, ::2, 2] = float("-inf")
    assert collapsed_members(padded) == [1]
    no_common_class = logits.clone()
    for c in range(3):  # every class missing from a third of the examples: no class to centre on
        no_common_class[:, c::3, c] = float("-inf")
    assert collapsed_members(no_common_class) == []  # log-probabilities, whose normaliser moves with the options
    assert collapsed_members(logits[:, :1]) == []  # one example shows no spread of anything
