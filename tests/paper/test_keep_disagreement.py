"""scripts/keep_disagreement.py: the members' mutual information is added to a committed predictive file only
when the file evaluated again is the same, array for array."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from sve.errors import InputError
from sve.runs.prediction_files import write_predictive

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from keep_disagreement import merge  # noqa: E402


def files(tmp_path, shift: float = 0.0):
    rng = np.random.default_rng(0)
    probs = torch.from_numpy(rng.dirichlet(np.ones(3), 30))
    labels, index = torch.from_numpy(rng.integers(0, 3, 30)), torch.arange(30)
    information = torch.from_numpy(rng.random(30))
    write_predictive(tmp_path / "committed.npz", "test", probs, labels, index)
    write_predictive(tmp_path / "again.npz", "test", probs + shift, labels, index, information)
    return tmp_path / "committed.npz", tmp_path / "again.npz", information


def test_the_disagreement_is_added_once_to_an_identical_file(tmp_path):
    committed, again, information = files(tmp_path)
    before = dict(np.load(committed))
    assert merge(committed, again) is True
    after = dict(np.load(committed))
    assert sorted(after) == sorted([*before, "mutual_information"])
    assert all(np.array_equal(before[k], after[k]) for k in before)
    np.testing.assert_array_equal(after["mutual_information"], information.numpy().astype(np.float32))
    assert merge(committed, again) is False  # already there: the target resumes


def test_float_noise_is_accepted_and_a_file_that_differs_is_refused_and_left_as_it_was(tmp_path):
    committed, again, _ = files(tmp_path, shift=1e-8)
    assert merge(committed, again) is True  # the last bits of an evaluation's floats
    committed, again, _ = files(tmp_path, shift=1e-3)
    before = committed.read_bytes()
    with pytest.raises(InputError, match=r"differs from .* in \[.*'probs'\]"):
        merge(committed, again)
    assert committed.read_bytes() == before
