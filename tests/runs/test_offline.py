"""Without a network, a pretrained backbone that is not cached fails at once with one error naming the keys to
set, and not one connection is attempted after the Hub was found unreachable (no half minute of retries)."""

import socket

import pytest

from sve import offline
from sve.backbones import hf, timm_vit
from sve.errors import OfflineError, user_error


@pytest.fixture
def no_network(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    for module in (timm_vit, hf):
        monkeypatch.setattr(module, "hub_reachable", lambda timeout=5.0: False)
    attempts = []

    def refuse(self, address):
        attempts.append(address)
        raise OSError("no network in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    return attempts


def test_a_timm_download_fails_at_once_naming_the_keys(no_network):
    with pytest.raises(
        OfflineError,
        match=r"only the local cache was read.*backbone.checkpoint_path=.*"
        r"backbone.pretrained=false",
    ):
        timm_vit.TimmBackbone("vit_small_patch16_224.dino", ["qkv"], pretrained=True)
    assert no_network == []


def test_a_hugging_face_download_fails_at_once_naming_the_keys(no_network):
    with pytest.raises(
        OfflineError,
        match=r"could not load 'bert-base-uncased' \(the Hugging Face Hub did not "
        r"answer.*backbone.name_or_path to a local directory",
    ):
        hf.HFEncoderBackbone(["query"], name_or_path="bert-base-uncased", pretrained=True)
    assert no_network == []


def test_the_offline_variables_skip_the_check(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("the Hub was asked"))
    assert offline.hub_reachable() is False


def test_a_wrapped_user_error_is_still_one_line():
    """Hydra wraps what a constructor raises; the entry points print the user error inside."""
    from hydra.errors import InstantiationException

    inner = OfflineError("could not load 'x'")
    try:
        try:
            raise inner
        except OfflineError as err:
            raise InstantiationException("Error in call to target") from err
    except InstantiationException as wrapped:
        assert user_error(wrapped) is inner
    assert user_error(RuntimeError("a bug")) is None
