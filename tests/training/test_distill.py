"""Ensemble distillation (``sve.training.distill``): a student trained on a fixed teacher's member logits
answers as the teacher does: the ``mean`` student matches the teacher's predictive, the ``dirichlet``
student (EnD^2) matches it too and keeps where the members disagree as mutual information. The closed forms
are checked against torch.distributions and Monte Carlo."""

import math

import pytest
import torch
from torch import nn

from sve.errors import InputError
from sve.metrics.scores import entropy, uncertainty
from sve.training.distill import (
    dirichlet_distillation_loss,
    dirichlet_log_density,
    dirichlet_samples,
    dirichlet_uncertainty,
    distill,
    mean_distillation_loss,
)

C, M = 3, 5


def toy_teacher(seed: int = 0):
    """M members over 2-D inputs: they agree for x_0 < 0 and disagree (member-specific maps) for x_0 > 0."""
    g = torch.Generator().manual_seed(seed)
    shared, own = torch.randn(2, C, generator=g) * 2, torch.randn(M, 2, C, generator=g) * 3

    def teacher(batch):
        x = batch["x"]
        spread = (x[:, :1] > 0).float()  # (B, 1)
        return x @ shared + spread * torch.einsum("bi,mic->mbc", x, own)  # (M, B, C)

    return teacher


def toy_inputs(n: int = 512, seed: int = 1):
    return torch.rand(n, 2, generator=torch.Generator().manual_seed(seed)) * 4 - 2


class Student(nn.Module):
    def __init__(self, width: int = 32):
        super().__init__()
        layers = [nn.Linear(2, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, C)]
        self.net = nn.Sequential(*layers)

    def forward(self, batch):
        return self.net(batch["x"])


def train_student(objective: str, steps: int):
    torch.manual_seed(0)
    model, teacher, x = Student(), toy_teacher(), toy_inputs()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = distill(model, teacher, [{"x": x}], objective, optimizer, epochs=steps)
    return model, teacher, x, losses


def test_mean_student_matches_the_teachers_predictive():
    model, teacher, x, losses = train_student("mean", steps=300)
    with torch.no_grad():
        target = teacher({"x": x}).softmax(-1).mean(0)
        got = model({"x": x}).softmax(-1)
    gap = (got - target).abs()
    # Tolerance: a 32-unit MLP after 300 full-batch Adam steps on a 2-D target with a kink at x_0 = 0.
    assert gap.mean() < 0.02 and gap.max() < 0.15, (float(gap.mean()), float(gap.max()))  # measured 0.005, 0.08
    assert losses[-1] < 0.1 * losses[0]


def test_dirichlet_student_keeps_the_predictive_and_the_disagreement():
    model, teacher, x, _ = train_student("dirichlet", steps=300)
    with torch.no_grad():
        members = teacher({"x": x})
        student = dirichlet_uncertainty(model({"x": x}))
    reference = uncertainty(members)
    gap = (student.probs - reference.probs).abs()
    assert gap.mean() < 0.05, float(gap.mean())
    agree, disagree = x[:, 0] < -0.2, x[:, 0] > 0.2  # away from the boundary the MLP must smooth over
    assert reference.mutual_information[agree].mean() < 1e-6 < reference.mutual_information[disagree].mean()
    # The student's epistemic part is small where the members agree and several times larger where they do not.
    mi_agree, mi_disagree = student.mutual_information[agree].mean(), student.mutual_information[disagree].mean()
    assert mi_disagree > 4 * mi_agree, (float(mi_agree), float(mi_disagree))
    corr = torch.corrcoef(torch.stack([student.mutual_information, reference.mutual_information]))[0, 1]
    assert corr > 0.7, float(corr)


def test_dirichlet_density_and_uncertainty_against_independent_references():
    torch.manual_seed(0)
    log_alpha = torch.randn(4, C).double()
    probs = torch.distributions.Dirichlet(log_alpha.exp()).sample((6,))  # (6, 4, C)
    expected = torch.distributions.Dirichlet(log_alpha.exp()).log_prob(probs)
    torch.testing.assert_close(dirichlet_log_density(log_alpha, probs), expected)
    closed = dirichlet_uncertainty(log_alpha)
    draws = dirichlet_samples(log_alpha, 200_000, seed=1).exp()  # (S, 4, C)
    torch.testing.assert_close(closed.probs, draws.mean(0), atol=3e-3, rtol=0)
    torch.testing.assert_close(closed.expected_entropy, entropy(draws).mean(0), atol=3e-3, rtol=0)
    torch.testing.assert_close(closed.entropy - closed.expected_entropy, closed.mutual_information)


def test_losses_are_zero_or_minimal_at_the_teacher():
    logits = torch.randn(M, 7, C)
    target = logits.softmax(-1).mean(0)
    assert float(mean_distillation_loss(target.log(), logits)) == pytest.approx(0.0, abs=1e-6)
    # A Dirichlet concentrated at the members' common prediction beats a flat one when the members agree.
    same = logits[:1].expand(M, -1, -1)
    sharp = (same[0].softmax(-1) * 1000).log()
    assert dirichlet_distillation_loss(sharp, same) < dirichlet_distillation_loss(torch.zeros(7, C), same)


def test_dirichlet_samples_are_seeded_and_leave_the_global_generator_alone():
    torch.manual_seed(5)
    before = torch.random.get_rng_state()
    a, b = dirichlet_samples(torch.zeros(2, C), 4, seed=3), dirichlet_samples(torch.zeros(2, C), 4, seed=3)
    assert torch.equal(a, b) and torch.equal(torch.random.get_rng_state(), before)
    assert torch.allclose(a.exp().sum(-1), torch.ones(4, 2), atol=1e-5) and not math.isnan(float(a.sum()))


def test_an_unknown_objective_names_the_choices():
    with pytest.raises(InputError, match=r"objective='kl' is not valid; choose one of \['mean', 'dirichlet'\]"):
        distill(nn.Linear(1, 1), lambda b: b, [], "kl", torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1))
