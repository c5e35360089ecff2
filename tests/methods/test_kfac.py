"""The LoRA KFAC backend (sve.methods.kfac) against the exact GGN: for one example of one token, the
Kronecker factors of each LoRA factor are exact, so their product must equal J^T (diag(p) - p p^T) J."""

import pytest
import torch
from torch import nn
from torch.func import functional_call

from sve.layers import LoRALayer
from sve.methods.kfac import LoRAKFAC


class Net(nn.Module):
    """A LoRA layer between a nonlinearity and a frozen head: the GGN of A and B goes through both."""

    def __init__(self):
        super().__init__()
        self.lora = LoRALayer(nn.Linear(5, 4), rank=2, alpha=4.0)
        nn.init.normal_(self.lora.lora_B)  # B = 0 would zero A's Jacobian
        self.head = nn.Linear(4, 3).requires_grad_(False)

    def forward(self, batch: dict) -> torch.Tensor:
        return self.head(torch.tanh(self.lora(batch["x"])))


def exact_ggn(net: Net, batch: dict, name: str) -> torch.Tensor:
    """J^T Lambda J of the logits with respect to one parameter, (P, P), from autograd's full Jacobian."""
    theta = getattr(net.lora, name)
    logits = net(batch)[0]
    p = logits.softmax(-1)
    jac = torch.autograd.functional.jacobian(lambda t: functional_call(net, {f"lora.{name}": t}, (batch,))[0], theta)
    J = jac.reshape(logits.shape[0], -1)  # (C, P), the parameter flattened row-major as laplace-torch does
    return J.T @ (torch.diag(p) - torch.outer(p, p)) @ J


@pytest.mark.parametrize("seed", [0, 1])
def test_lora_kfac_is_the_exact_ggn_for_one_example_of_one_token(seed):
    torch.manual_seed(seed)
    net = Net().double()
    batch = {"x": torch.randn(1, 5, dtype=torch.float64)}
    _, kron = LoRAKFAC(net, "classification").kron(batch, torch.tensor([1]), N=1)
    for (G, X), name in zip(kron.kfacs, ("lora_A", "lora_B")):
        exact = exact_ggn(net, batch, name)
        assert exact.abs().max() > 1e-3  # a real curvature, not 0 == 0
        torch.testing.assert_close(torch.kron(G, X), exact, atol=1e-10, rtol=1e-8)
