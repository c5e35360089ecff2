"""KFAC curvature of LoRA factors, as a laplace-torch backend (used by ``bayes_lora_la``).

Where laplace-torch did not fit: its KFAC backends (curvlinops, ASDL, BackPACK) find Kronecker factors for
``nn.Linear``/``nn.Conv2d`` *modules*; our LoRA factors are raw (M, r, in) / (M, out, r) parameters inside
``LoRALayer``, applied to token sequences. This backend computes their factors itself and hands laplace-torch
a ``Kron`` in its conventions, so posterior, marginal likelihood, prior-precision optimisation and sampling
are laplace-torch's own (``KronLaplace``).

For one LoRA layer, h = x A^T and d = (alpha/r) h B^T. With the exact GGN of the softmax cross-entropy,
written as a sum of C outer products (diag(p) - p p^T = sum_c v_c v_c^T, v_c = sqrt(p_c)(e_c - p)), and the
"expand" treatment of the T token positions (Eschenhagen et al., 2023):

    A:  G = sum_{c,n,t} g_h g_h^T (r x r),       X = (1/N) sum_n (1/T) sum_t x x^T (in x in)
    B:  G = sum_{c,n,t} g_d g_d^T (out x out),   X = (1/N) sum_n (1/T) sum_t s^2 h h^T (r x r)

with g the backpropagated v_c. laplace-torch sums these factors over batches, each separately.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from laplace import KronLaplace
from laplace.curvature import CurvatureInterface
from laplace.utils.matrix import Kron

from sve.layers.lora import LoRALayer


class LoRAKFAC(CurvatureInterface):
    """laplace-torch backend; the model must take the batch dict and return (B, C) logits."""

    def _layers(self) -> list[tuple[LoRALayer, str]]:
        owner = {}
        for module in self.model.modules():
            if isinstance(module, LoRALayer):
                owner[id(module.lora_A)] = (module, "A")
                owner[id(module.lora_B)] = (module, "B")
        missing = [tuple(p.shape) for p in self.params if id(p) not in owner]
        if missing:
            raise ValueError(f"LoRAKFAC handles LoRA factors only; freeze the other parameters (shapes {missing})")
        return [owner[id(p)] for p in self.params]

    def kron(self, x, y, N: int, **kwargs):
        params = self._layers()
        layers = list(dict.fromkeys(layer for layer, _ in params))
        for layer in layers:
            if layer.kind == "conv" or layer.ensemble_size != 1:
                raise NotImplementedError("LoRAKFAC supports single-member linear LoRA layers")
            layer.record = []
        try:
            logits = self.model(x)  # (B, C)
        finally:
            records = {layer: layer.record[0] for layer in layers}
            for layer in layers:
                layer.record = None
        loss = F.cross_entropy(logits, y, reduction="sum")
        B = logits.shape[0]
        p = logits.detach().softmax(-1)
        acts = [t for layer in layers for t in records[layer][1:]]  # h, d of every layer
        G = {layer: [0, 0] for layer in layers}
        for c in range(p.shape[1]):
            v = p[:, c : c + 1].sqrt() * (F.one_hot(torch.full_like(y, c), p.shape[1]) - p)  # (B, C)
            grads = torch.autograd.grad(logits, acts, grad_outputs=v.to(logits.dtype), retain_graph=True)
            for i, layer in enumerate(layers):
                g_h, g_d = grads[2 * i][0], grads[2 * i + 1][0]  # (B*T, r), (B*T, out)
                G[layer][0] = G[layer][0] + g_h.T @ g_h
                G[layer][1] = G[layer][1] + g_d.T @ g_d
        kfacs = []
        for layer, which in params:
            xs, h, _ = records[layer]
            rows = xs.shape[1]  # B*T
            per_row = 1.0 / (N * rows / B)  # (1/N) * (1/T)
            if which == "A":
                inp = xs[0].detach()
                kfacs.append([G[layer][0], per_row * inp.T @ inp])
            else:
                inp = layer.scaling * h[0].detach()
                kfacs.append([G[layer][1], per_row * inp.T @ inp])
        return loss.detach(), Kron([[f.detach() for f in F_] for F_ in kfacs])


class LoRAKronLaplace(KronLaplace):
    """KronLaplace whose factors follow the LoRA factors' (M=1, rows, cols) shapes instead of laplace-torch's
    guess from a parameter's number of dimensions (it would read a 3-d tensor as a convolution kernel)."""

    _key = ("all", "kron_lora")  # laplace.Laplace() picks classes by _key; keep ("all", "kron") for KronLaplace

    def _init_H(self) -> None:
        self.H = Kron(
            [
                [
                    torch.zeros(p.shape[-2], p.shape[-2], device=self._device, dtype=self._dtype),
                    torch.zeros(p.shape[-1], p.shape[-1], device=self._device, dtype=self._dtype),
                ]
                for p in self.params
            ]
        )
