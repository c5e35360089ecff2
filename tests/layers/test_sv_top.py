"""Top-r SVE (``sve.layers.sv_top``): the split W = W_res + U_r diag(s_r) V_r^T is exact, a member computes
W_res x + U_r diag(s_m) V_r^T x + b_m, and only the top r values per member train. (Merge, select, the
inference paths and equality to the base at init are the method registry's generated checks.)"""

import pytest
import torch
from torch import nn

from sve.layers.sv_top import SVTopConv2d, SVTopLinear


def test_the_split_is_exact_and_members_compute_residual_plus_their_rank_r_term():
    torch.manual_seed(0)
    base = nn.Linear(12, 9)
    layer = SVTopLinear.from_linear_top(base, rank=3, ensemble_size=2, sigma_init=0.1)
    assert layer.U.shape == (9, 3) and layer.Vh.shape == (3, 12) and layer.singular_values.shape == (2, 3)
    split = layer.residual.double() + (layer.U.double() * layer.pretrained_singular_values.double()) @ layer.Vh.double()
    torch.testing.assert_close(split, base.weight.double(), atol=1e-6, rtol=0)
    # the residual carries exactly the directions below the top 3
    s = torch.linalg.svdvals(base.weight.double())
    torch.testing.assert_close(torch.linalg.svdvals(layer.residual.double())[:6], s[3:], atol=1e-5, rtol=0)
    x = torch.randn(5, 12)
    layer.eval()
    with torch.no_grad(), layer.select([1]):
        got = layer(x)
    s1, b1 = layer.singular_values[1].double(), layer.biases[1].double()
    expected = x.double() @ (layer.residual.double() + (layer.U.double() * s1) @ layer.Vh.double()).t() + b1
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=0)


def test_a_rank_above_the_layers_keeps_every_direction_and_a_bad_rank_is_named():
    base = nn.Linear(4, 6)
    layer = SVTopLinear.from_linear_top(base, rank=50, ensemble_size=1)
    assert layer.rank == 4 and float(layer.residual.abs().max()) < 1e-5
    with pytest.raises(ValueError, match=r"method.top_rank=0 is not valid; expected a positive integer"):
        SVTopLinear.from_linear_top(base, rank=0, ensemble_size=1)


def test_conv_members_match_the_merged_kernel():
    torch.manual_seed(1)
    conv = nn.Conv2d(3, 5, 3, padding=1)
    layer = SVTopConv2d.from_conv_top(conv, rank=2, ensemble_size=3, sigma_init=0.2).eval()
    x = torch.randn(3 * 2, 3, 7, 7)  # 3 members x 2 images, member-major
    with torch.no_grad():
        batched = layer(x).reshape(3, 2, 5, 7, 7)
        for m in range(3):
            torch.testing.assert_close(batched[m], layer.merge(m)(x.reshape(3, 2, 3, 7, 7)[m]), atol=1e-5, rtol=1e-5)
