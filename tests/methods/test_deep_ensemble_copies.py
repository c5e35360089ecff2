"""The deep ensemble's working copies of a backbone: plain deep copies, also on a memory plan's fake tensors."""

import warnings

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode, is_fake

from sve.methods.deep_ensemble import copy_module


def test_a_backbone_on_fake_tensors_is_copied_without_reading_their_data_pointers():
    # Tensor.__deepcopy__ reads a fake tensor's data pointer (a warning in torch 2.14, "undefined behaviour"):
    # planning Table 2's deep ensemble, M = 8, died of a corrupted heap.
    with FakeTensorMode(allow_non_fake_inputs=True) as fake:
        module = nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4))
        for layer in module:
            for name, p in list(layer.named_parameters(recurse=False)):
                layer._parameters[name] = nn.Parameter(fake.from_tensor(p.detach()), requires_grad=p.requires_grad)
            for name, b in list(layer.named_buffers(recurse=False)):
                layer._buffers[name] = fake.from_tensor(b)
        module[1].bias.requires_grad_(False)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            copied = copy_module(module)
        pairs = [*zip(module.parameters(), copied.parameters()), *zip(module.buffers(), copied.buffers())]
        assert len(pairs) == 7 and all(is_fake(b) and b is not a and b.shape == a.shape for a, b in pairs)
        assert [p.requires_grad for p in copied.parameters()] == [True, True, True, False]
        assert copied(torch.zeros(3, 6)).shape == (3, 4)  # a working module, not only tensors


def test_a_real_backbone_is_deep_copied_to_equal_independent_tensors():
    module = nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4))
    copied = copy_module(module)
    for a, b in zip(module.state_dict().values(), copied.state_dict().values()):
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
