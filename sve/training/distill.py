"""Ensemble distillation: one network trained to answer as a trained ensemble does (the paper's Sec. 6 future
work: "compressing implicit ensembles into a single network via knowledge distillation").

Two objectives, both on the teacher's member logits (M, B, C) for the same inputs:

- ``mean`` (ensemble distillation; Hinton, Vinyals & Dean, 2015): KL(p_bar || p_student), with p_bar the
  mean of the members' probabilities (the paper's Eq. 2 predictive). The student keeps the predictive and
  its calibration but has one member, so no disagreement signal: its mutual information is zero.
- ``dirichlet`` (Ensemble Distribution Distillation, EnD^2; Malinin, Mlodozeniec & Gales, ICLR 2020): the
  student's outputs are the log concentrations of a Dirichlet over the class probabilities, alpha =
  exp(z), fitted by maximum likelihood to the members' probability vectors: loss = -mean_m log Dir(p_m |
  alpha). Its mean alpha / alpha_0 is the predictive; the spread of the Dirichlet keeps the ensemble's
  disagreement, so the student still separates total, expected (aleatoric) and mutual-information
  (epistemic) uncertainty, in closed form (``dirichlet_uncertainty``), from one forward pass.

Members' probabilities are smoothed towards uniform by ``smoothing`` before the Dirichlet likelihood, as
EnD^2 does (central smoothing): a probability of exactly 0 has log-density -inf under any Dirichlet.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
from torch import Tensor

from sve.errors import InputError
from sve.members import to_device
from sve.metrics.scores import Prediction, entropy

OBJECTIVES = ("mean", "dirichlet")
MAX_LOG_ALPHA = 20.0  # exp(20) ~ 5e8: beyond it the Dirichlet is a point mass for every practical purpose


def check_objective(objective: str) -> str:
    if objective not in OBJECTIVES:
        raise InputError(f"objective={objective!r} is not valid; choose one of {list(OBJECTIVES)}")
    return objective


def teacher_probs(member_logits: Tensor) -> Tensor:
    """The teacher's predictive (B, C): the mean of its members' probabilities, in float32 at least."""
    return member_logits.float().softmax(-1).mean(0)


def mean_distillation_loss(student_logits: Tensor, member_logits: Tensor) -> Tensor:
    """KL(p_bar || softmax(student_logits)), averaged over the batch; student (B, C), teacher (M, B, C)."""
    target = teacher_probs(member_logits)
    log_student = student_logits.float().log_softmax(-1)
    return (torch.special.xlogy(target, target) - target * log_student).sum(-1).mean()


def log_concentrations(student_logits: Tensor) -> Tensor:
    """log alpha of the student's Dirichlet, clamped above so that alpha stays finite."""
    return student_logits.float().clamp(max=MAX_LOG_ALPHA)


def dirichlet_log_density(log_alpha: Tensor, probs: Tensor) -> Tensor:
    """log Dir(probs | alpha) for probs (..., B, C) on the simplex and log alpha (B, C)."""
    alpha = log_alpha.exp()
    norm = torch.lgamma(alpha.sum(-1)) - torch.lgamma(alpha).sum(-1)
    return norm + ((alpha - 1) * probs.log()).sum(-1)


def dirichlet_distillation_loss(student_logits: Tensor, member_logits: Tensor, smoothing: float = 1e-4) -> Tensor:
    """EnD^2's negative log-likelihood of the M members' (smoothed) probabilities under the student's Dirichlet,
    averaged over members and examples."""
    C = member_logits.shape[-1]
    probs = (1 - smoothing) * member_logits.float().softmax(-1) + smoothing / C  # (M, B, C), no exact zeros
    return -dirichlet_log_density(log_concentrations(student_logits), probs).mean()


def dirichlet_uncertainty(student_logits: Tensor) -> Prediction:
    """The Dirichlet student's prediction with its uncertainty in closed form (float64): predictive alpha / alpha_0;
    expected entropy E_Dir[H(p)] = sum_c (alpha_c / alpha_0) (psi(alpha_0 + 1) - psi(alpha_c + 1)); mutual
    information = H(alpha / alpha_0) - expected entropy (Malinin & Gales, 2018). ``member_probs`` holds the
    predictive as one member; ``disagreement`` is zero (there are no members to disagree)."""
    alpha = log_concentrations(student_logits).double().exp()
    alpha0 = alpha.sum(-1, keepdim=True)
    probs = alpha / alpha0
    expected = (probs * (torch.digamma(alpha0 + 1) - torch.digamma(alpha + 1))).sum(-1)
    total = entropy(probs)
    confidence, label = probs.max(-1)
    return Prediction(
        probs=probs,
        label=label,
        confidence=confidence,
        entropy=total,
        expected_entropy=expected,
        mutual_information=(total - expected).clamp_min(0),
        disagreement=torch.zeros_like(total),
        member_probs=probs.unsqueeze(0),
    )


def dirichlet_samples(student_logits: Tensor, samples: int, seed: int = 0) -> Tensor:
    """(S, B, C) log-probabilities of S draws from the student's Dirichlet: the student as an ensemble of its
    samples, in the member layout every evaluator here reads (its predictive is alpha / alpha_0 up to the
    Monte Carlo error of S draws). Seeded without touching the caller's random state."""
    alpha = log_concentrations(student_logits).double().exp()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        draws = torch.distributions.Dirichlet(alpha).sample((samples,))
    return draws.clamp_min(torch.finfo(torch.float64).tiny).log().to(student_logits.dtype)


def distillation_loss(objective: str, student_logits: Tensor, member_logits: Tensor, smoothing: float = 1e-4):
    if check_objective(objective) == "mean":
        return mean_distillation_loss(student_logits, member_logits)
    return dirichlet_distillation_loss(student_logits, member_logits, smoothing)


def student_logits_of(output: Tensor) -> Tensor:
    """A student's output as (B, C): a method's member logits (1, B, C) or plain logits (B, C)."""
    if output.dim() == 3:
        if output.shape[0] != 1:
            raise ValueError(f"a student has one member; got member logits of shape {tuple(output.shape)}")
        return output[0]
    return output


def distill(
    student: torch.nn.Module,
    teacher: Callable[[dict], Tensor],
    batches: Iterable[dict],
    objective: str,
    optimizer: torch.optim.Optimizer,
    epochs: int = 1,
    smoothing: float = 1e-4,
    progress: Callable[[int, float], None] | None = None,
    device: torch.device | None = None,
) -> list[float]:
    """Trains ``student`` on ``teacher``'s member logits (M, B, C) for every batch of ``batches`` (re-iterated
    each epoch), the teacher in evaluation mode and without gradients: the teacher answers the same
    (augmented) inputs the student sees. Batches are moved to ``device`` (where both models are) when given.
    Returns the mean loss of each epoch; ``progress(epoch, loss)``."""
    check_objective(objective)
    losses = []
    for epoch in range(epochs):
        total, count = 0.0, 0
        student.train()
        for batch in batches:
            batch = batch if device is None else to_device(batch, device)
            with torch.no_grad():
                member_logits = teacher(batch)
            loss = distillation_loss(objective, student_logits_of(student(batch)), member_logits, smoothing)
            if not math.isfinite(float(loss.detach())):
                raise FloatingPointError(f"distillation loss is {float(loss)} at epoch {epoch}")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total, count = total + float(loss.detach()), count + 1
        losses.append(total / max(count, 1))
        if progress is not None:
            progress(epoch, losses[-1])
    return losses
