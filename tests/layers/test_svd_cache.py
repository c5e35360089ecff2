"""The on-disk SVD cache (sve.layers.svd_cache): a hit gives the very factors a miss computed, and a broken or
foreign entry is found, reported and recomputed."""

import pytest
import torch
from torch import nn

from sve.layers import SVLinear
from sve.layers.sv_linear import decompose
from sve.layers.svd_cache import SVDCache, weight_key
from sve.runs.run import build, instantiate
from tests.conftest import compose_cfg


def _layer(seed=0, shape=(24, 16)):
    torch.manual_seed(seed)
    return nn.Linear(shape[1], shape[0])


def _entries(cache: SVDCache) -> list:
    return sorted(cache.directory.rglob("*.pt"))


def test_miss_then_hit_gives_the_same_factors(tmp_path):
    cache = SVDCache(tmp_path)
    layer = _layer()
    first = decompose(layer, cache=cache)
    assert cache.stats["misses"] == 1 and cache.stats["hits"] == 0 and len(_entries(cache)) == 1
    second = decompose(layer, cache=SVDCache(tmp_path))  # a later run: a fresh cache object, same directory
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    again = SVDCache(tmp_path)
    decompose(layer, cache=again)
    assert again.stats["hits"] == 1 and again.stats["misses"] == 0
    assert not list(tmp_path.rglob("*.tmp"))  # atomic writes leave no temporary behind
    reference = decompose(layer)  # no cache at all
    for a, b in zip(first, reference):
        assert torch.equal(a, b)


def test_key_covers_the_weight_and_the_svd_settings(tmp_path):
    W = _layer().weight.detach()
    keys = {
        weight_key(W, torch.float64, torch.float32),
        weight_key(W, torch.float32, torch.float32),
        weight_key(W, torch.float64, torch.bfloat16),
        weight_key(W.clone().reshape(16, 24), torch.float64, torch.float32),
        weight_key(W + 1e-6, torch.float64, torch.float32),
    }
    assert len(keys) == 5
    assert weight_key(W.clone(), torch.float64, torch.float32) in keys  # same bytes, same key
    cache = SVDCache(tmp_path)
    decompose(_layer(), cache=cache)
    decompose(_layer(), factor_dtype=torch.bfloat16, cache=cache)
    decompose(_layer(seed=1), cache=cache)
    assert cache.stats["misses"] == 3 and len(_entries(cache)) == 3


def _check_recomputed(tmp_path, layer, expected):
    cache = SVDCache(tmp_path)
    with pytest.warns(UserWarning, match="discarded and recomputed") as record:
        got = decompose(layer, cache=cache)
    assert cache.stats == {**cache.stats, "hits": 0, "misses": 1, "corrupt": 1}
    for a, b in zip(got, expected):
        assert torch.equal(a, b)
    fixed = SVDCache(tmp_path)
    decompose(layer, cache=fixed)  # the entry was replaced by a good one
    assert fixed.stats["hits"] == 1 and fixed.stats["corrupt"] == 0
    return str(record[0].message)


def test_truncated_entry_is_recomputed(tmp_path):
    layer = _layer()
    expected = decompose(layer, cache=SVDCache(tmp_path))
    (path,) = _entries(SVDCache(tmp_path))
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert "cannot be read" in _check_recomputed(tmp_path, layer, expected)


def test_entry_under_the_wrong_key_is_recomputed(tmp_path):
    a, b = _layer(seed=0), _layer(seed=1)
    expected = decompose(a, cache=SVDCache(tmp_path))
    decompose(b, cache=SVDCache(tmp_path))
    key_a = weight_key(a.weight.detach(), torch.float64, torch.float32)
    path_a = SVDCache(tmp_path).path(key_a)
    path_b = next(p for p in _entries(SVDCache(tmp_path)) if p != path_a)
    path_a.write_bytes(path_b.read_bytes())  # b's factors filed under a's name
    assert "another key" in _check_recomputed(tmp_path, a, expected)


def test_altered_factors_fail_the_checksum(tmp_path):
    layer = _layer()
    expected = decompose(layer, cache=SVDCache(tmp_path))
    (path,) = _entries(SVDCache(tmp_path))
    entry = torch.load(path, weights_only=True)
    entry["U"][0, 0] += 1.0
    torch.save(entry, path)
    assert "checksum" in _check_recomputed(tmp_path, layer, expected)


def test_unwritable_cache_warns_and_still_decomposes(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    cache = SVDCache(blocker / "svd")
    with pytest.warns(UserWarning, match="cannot be written"):
        U, s, Vh = decompose(_layer(), cache=cache)
    assert U.shape == (24, 16) and cache.stats["misses"] == 1


def test_sv_layer_from_cached_factors_equals_a_fresh_one(tmp_path):
    layer = _layer()
    SVLinear.from_linear(layer, ensemble_size=2, cache=SVDCache(tmp_path))
    torch.manual_seed(3)
    cached = SVLinear.from_linear(layer, ensemble_size=2, sigma_init=0.1, cache=SVDCache(tmp_path))
    torch.manual_seed(3)
    fresh = SVLinear.from_linear(layer, ensemble_size=2, sigma_init=0.1)
    for (name, a), (_, b) in zip(cached.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b), name


def test_a_second_run_on_the_same_backbone_reads_every_layer_and_records_it(tmp_path):
    overrides = ["method=sve", "backbone=tiny_bert", "dataset=synthetic_text", f"method.svd_cache={tmp_path}"]
    cfg = compose_cfg(overrides, tmp_path / "run1")
    torch.manual_seed(0)
    _, _, first, _ = build(cfg)
    n = len(first.wrapped)
    assert first.report()["svd_cache"]["misses"] == n and first.report()["svd_cache"]["hits"] == 0
    torch.manual_seed(0)  # the same random backbone, as a second seed or method of a sweep would load
    _, _, second, _ = build(compose_cfg([*overrides, "ensemble_size=3"], tmp_path / "run2"))
    facts = second.report()["svd_cache"]
    assert facts["hits"] == n and facts["misses"] == 0 and facts["dir"] == str(tmp_path)
    assert facts["read_seconds"] >= 0 and first.report()["svd_cache"]["compute_seconds"] > 0


def test_null_svd_cache_turns_it_off(tmp_path):
    cfg = compose_cfg(["method=svf", "backbone=tiny_bert", "dataset=synthetic_text", "method.svd_cache=null"])
    backbone = instantiate(cfg.backbone)
    method = instantiate(cfg.method, backbone=backbone, ensemble_size=1, num_classes=2)
    assert method.svd_cache is None and "svd_cache" not in method.report()


def test_the_log_says_where_the_cache_is_and_what_it_holds(tmp_path, caplog):
    cfg = compose_cfg(["method=sve", "backbone=tiny_bert", "dataset=synthetic_text", f"method.svd_cache={tmp_path}"])
    torch.manual_seed(0)
    with caplog.at_level("INFO", logger="sve.methods.sve"):
        _, _, method, _ = build(cfg)
    held = sum(p.stat().st_size for p in tmp_path.rglob("*.pt"))
    assert method.svd_cache.stats["bytes_written"] == held > 0  # an empty cache: all of it is this run's
    message = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("SVD of"))
    mib = f"{held / 2**20:.1f} MiB"
    assert f"cache {tmp_path}" in message and f"wrote {mib}, the cache now holds {mib} in " in message
    assert f"in {len(method.wrapped)} entries" in message
    # An entry holds U and V in the factor dtype (float32 here), s in the SVD's (float64), and about 4 kB besides
    # (torch.save's archive, the key, the checksum): the size docs/benchmark.md states.
    factors = sum(
        (4 * (layer.out_features + layer.in_features) + 8) * min(layer.out_features, layer.in_features)
        for layer in method.sv_layers()
    )
    assert factors < held < factors + 5000 * len(method.wrapped)
