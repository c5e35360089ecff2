"""Table definitions of one setting share its keys through ``base:`` (``sve.paper.store.with_base``): a key the
definition sets replaces the base's, and so does a key of its ``smoke`` block within the base's."""

import re

import pytest

from sve.errors import InputError
from sve.paper.store import load_spec, table_names
from sve.paths import TABLES

ROW = "rows: [{method: sve, members: 4, overrides: [ensemble_size=4]}]\n"
TABLE = "kind: metrics\nexperiments: {exp: Exp}\nmetrics: [acc]\n" + ROW


def _write(folder, name, text):
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_definition_takes_its_base_s_keys_and_replaces_those_it_sets(tmp_path):
    _write(
        tmp_path,
        "bases/setting.yaml",
        "seeds: [0, 1, 2]\noverrides: [trainer=cpu]\nmetrics: [nll]\n"
        "smoke: {overrides: [backbone=tiny_vit], seeds: [0]}\n",
    )
    mine = _write(
        tmp_path,
        "mine.yaml",
        "base: bases/setting.yaml\nkind: metrics\nexperiments: {exp: Exp}\n" + ROW + "metrics: [acc, ece]\n"
        "smoke: {seeds: [5]}\n",
    )
    spec = load_spec(str(mine))
    assert list(spec.seeds) == [0, 1, 2] and list(spec.overrides) == ["trainer=cpu"]
    assert list(spec.metrics) == ["acc", "ece"] and "base" not in spec
    smoke = load_spec(str(mine), smoke=True)
    assert list(smoke.seeds) == [5] and list(smoke.overrides) == ["backbone=tiny_vit"]


def test_a_base_may_have_a_base_and_a_missing_or_circular_one_is_one_line(tmp_path):
    _write(tmp_path, "bases/outer.yaml", "seeds: [0]\noverrides: [trainer=cpu]\n")
    _write(tmp_path, "bases/inner.yaml", "base: outer.yaml\nseeds: [1]\n")
    mine = _write(tmp_path, "mine.yaml", "base: bases/inner.yaml\n" + TABLE)
    spec = load_spec(str(mine))
    assert list(spec.seeds) == [1] and list(spec.overrides) == ["trainer=cpu"]

    missing = _write(tmp_path, "missing.yaml", "base: bases/nope.yaml\nkind: metrics\n")
    with pytest.raises(InputError, match=r"missing.yaml: base: 'bases/nope.yaml' is not a file beside it"):
        load_spec(str(missing))
    _write(tmp_path, "bases/loop.yaml", "base: ../looped.yaml\n")
    looped = _write(tmp_path, "looped.yaml", "base: bases/loop.yaml\nkind: metrics\n")
    with pytest.raises(InputError, match="leads back to itself"):
        load_spec(str(looped))


def test_the_shipped_bases_are_no_tables_and_each_is_used():
    bases = sorted(p.name for p in (TABLES / "bases").glob("*.yaml"))
    assert bases and not any(name.startswith("bases") for name in table_names())
    texts = [(TABLES / f"{name}.yaml").read_text() for name in table_names()]
    used = {base for text in texts for base in re.findall(r"^base: (\S+)", text, re.M)}
    assert {f"bases/{name}" for name in bases} <= used, used
