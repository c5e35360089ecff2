"""Verdicts that change with the bootstrap's seed (sve.paper.seed_stability): measured at each seed, matched to
today's verdicts by their point estimate, and marked in the README's tables."""

from omegaconf import OmegaConf

from sve.paper import seed_stability
from sve.paper.claims import HELD, STRICT, UNRESOLVED, Verdict
from sve.paper.claims_text import multiplicity_markdown, to_markdown
from sve.paper.evidence import Difference


def verdict(name: str, point: float, word: str, p: float) -> Verdict:
    d = Difference(point, point - 0.5, point + 0.5, True, p)
    return Verdict("s", name, "NLL", "", word == HELD, word == UNRESOLVED, word, [d], kind=STRICT)


def judged():
    claim = OmegaConf.create({"title": "T", "paper": "p"})
    return [(claim, [verdict("a", 1.0, HELD, 0.001), verdict("b", 2.0, HELD, 0.01), verdict("c", 3.0, HELD, 0.04)])]


def test_a_verdict_that_some_seed_decides_otherwise_is_borderline_and_a_changed_run_is_not_matched():
    found = judged()
    a, b, c = found[0][1]
    now = seed_stability.decisions(found)
    assert now["T | s | a | NLL"] == {"point": 1.0, "verdict": HELD, "holm": HELD}
    assert now["T | s | c | NLL"]["holm"] == HELD  # Holm: 0.001 <= 0.05 / 3, 0.01 <= 0.05 / 2, 0.04 <= 0.05 / 1
    record = {
        "seeds": [0, 1, 2],
        "verdicts": {
            "T | s | a | NLL": {"point": 1.0, "verdict": [HELD] * 3, "holm": [HELD] * 3},
            "T | s | b | NLL": {"point": 2.0, "verdict": [HELD, UNRESOLVED, HELD], "holm": [HELD, UNRESOLVED, HELD]},
            "T | s | c | NLL": {"point": 3.5, "verdict": [HELD] * 3, "holm": [HELD] * 3},
        },
    }
    notes = seed_stability.notes(record, found)
    assert id(a) not in notes["verdict"] and id(a) not in notes["holm"]
    assert notes["verdict"][id(b)] == "borderline: 2 of 3 bootstrap seeds give it" == notes["holm"][id(b)]
    assert notes["verdict"][id(c)] == seed_stability.NOT_MEASURED
    assert seed_stability.notes(None, found) is None
    assert "Bootstrap seeds" not in multiplicity_markdown(found, seed_notes=None)
    table = to_markdown(found, seed_notes=notes)
    assert "held (borderline: 2 of 3 bootstrap seeds give it)" in table
    headline = multiplicity_markdown(found, seed_notes=notes)
    assert "1 of the 3 headline verdicts (with Holm) change with the bootstrap's seed" in headline
    assert "1 were not measured" in headline


def test_measure_judges_at_every_seed_with_the_other_settings_kept(monkeypatch):
    seen = []

    def fake_judge(claims, runs):
        seen.append(OmegaConf.to_container(claims.bootstrap))
        word = HELD if claims.bootstrap.seed != 1 else UNRESOLVED
        return [(OmegaConf.create({"title": "T"}), [verdict("a", 1.0, word, 0.001 if word == HELD else 0.2)])]

    monkeypatch.setattr(seed_stability, "judge", fake_judge)
    claims = OmegaConf.create({"bootstrap": {"replicates": 2000, "level": 0.95, "seed": 0}})
    record = seed_stability.measure(claims, [], seeds=(0, 1, 2))
    assert [s["seed"] for s in seen] == [0, 1, 2] and all(s["replicates"] == 2000 for s in seen)
    assert record["verdicts"]["T | s | a | NLL"]["verdict"] == [HELD, UNRESOLVED, HELD]
    assert record["replicates"] == 2000 and record["seeds"] == [0, 1, 2]
