"""Safe starts: ``wrap`` warns when every member would start from one head that transformers' ``from_pretrained``
initialised anew (a classifier loaded from an encoder's checkpoint), and not for a head that was in the
checkpoint, a model built from its config, fresh heads or ``head_is_new=False``; ``head_is_new=True`` gives every
member its own head."""

import warnings

import pytest
import torch
from transformers import AutoModelForSequenceClassification, BertConfig, BertModel

import sve

torch.set_num_threads(1)
NEW_HEAD = "newly initialised"


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    """A tiny BERT encoder's checkpoint: no classifier in it."""
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=40,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
    )
    path = tmp_path_factory.mktemp("encoder")
    BertModel(config).save_pretrained(path)
    return path


def loaded(path):
    return AutoModelForSequenceClassification.from_pretrained(path, num_labels=2)


def warnings_of(model, **kwargs) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ensemble = sve.wrap(model, "sve", ensemble_size=4, **kwargs)
    return ensemble, [str(w.message) for w in caught if NEW_HEAD in str(w.message)]


def test_a_classifier_loaded_with_a_new_head_is_warned_about(encoder):
    ensemble, found = warnings_of(loaded(encoder))
    assert len(found) == 1 and "'classifier'" in found[0] and "num_classes=2" in found[0]
    heads = ensemble.method.heads.weight
    assert all(torch.equal(heads[0], heads[m]) for m in range(4))  # what it warns about: one start for all


def test_no_warning_where_the_members_do_not_share_a_new_head(encoder, tmp_path):
    assert warnings_of(loaded(encoder), num_classes=2)[1] == []  # fresh heads
    assert warnings_of(loaded(encoder), head_is_new=False)[1] == []  # the user says it was trained
    trained = loaded(encoder)
    trained.save_pretrained(tmp_path)  # the classifier is now in the checkpoint
    assert warnings_of(AutoModelForSequenceClassification.from_pretrained(tmp_path))[1] == []
    built = AutoModelForSequenceClassification.from_config(trained.config)  # no checkpoint: nothing to tell
    assert warnings_of(built)[1] == []
    with warnings.catch_warnings(record=True) as caught:  # one member: nothing to tell apart
        warnings.simplefilter("always")
        sve.wrap(loaded(encoder), "svf")
    assert not [w for w in caught if NEW_HEAD in str(w.message)]


def test_head_is_new_gives_every_member_its_own_head(encoder):
    ensemble, found = warnings_of(loaded(encoder), head_is_new=True)
    assert found == []
    heads = ensemble.method.heads.weight
    assert heads.shape == (4, 2, 16) and not torch.equal(heads[0], heads[1])
    assert ensemble.config["num_classes"] == 2 and not ensemble.config["keep_head"]
