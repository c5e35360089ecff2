"""``sve-distill``: a trained ensemble run distilled into a one-member student, evaluated as every run is, with
its cost beside the teacher's; the student's adapter evaluates again to the same digits."""

import json
import shutil

import numpy as np
import pytest

from sve.cli.distill import distill as distill_run
from sve.errors import InputError
from sve.runs.reevaluate import evaluate_run
from sve.runs.results import FORMAT
from sve.runs.run import run
from tests.conftest import compose_cfg

TINY = ["backbone=tiny_vit", "dataset=synthetic_image", "callbacks=default", "dataset.num_test=21"]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    directory = tmp_path_factory.mktemp("teacher")
    run(compose_cfg(["method=sve", "ensemble_size=3", "trainer.max_epochs=3", *TINY], directory))
    return directory


def probs_of(npz) -> np.ndarray:
    logits = np.load(npz)["member_logits"].astype(np.float64)
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).mean(0)


@pytest.mark.parametrize("objective, members", [("mean", 1), ("dirichlet", 8)])
def test_a_run_is_distilled_and_evaluated_with_its_cost(teacher, tmp_path, objective, members):
    out = tmp_path / objective
    record = distill_run(
        [f"run_dir={teacher}", f"objective={objective}", "epochs=4", "lr=0.01", "samples=8", f"out={out}"]
    )
    saved = json.loads((out / "results.json").read_text())
    assert saved["num_members"] == members and saved["teacher_members"] == 3 and saved["objective"] == objective
    assert saved["losses"][-1] < saved["losses"][0]  # the student moved towards the teacher
    cost = saved["cost"]
    assert cost["student"]["trainable"] < cost["teacher"]["trainable"] and cost["speedup"] > 0
    assert 0 <= saved["metrics"]["test/acc"] <= 1 and record["metrics"] == saved["metrics"]
    if objective == "mean":  # the adapter is the student: evaluated again, the same digits
        again = evaluate_run(out / "adapter")
        assert again["metrics"]["test/nll"] == saved["metrics"]["test/nll"]


def kl(p: np.ndarray, q: np.ndarray) -> float:
    return float((p * (np.log(p) - np.log(q))).sum(-1).mean())


def test_distillation_brings_the_students_test_predictive_to_the_teachers(teacher, tmp_path):
    """On test inputs it never trained on: KL(teacher || student) after 6 epochs is below that of the same
    student left (practically) at its init (lr 1e-12)."""
    teacher_p = probs_of(teacher / "predictions" / "test.npz")
    gaps = {}
    for name, lr, epochs in (("init", "1e-12", 1), ("distilled", "0.01", 6)):
        distill_run([f"run_dir={teacher}", "objective=mean", f"epochs={epochs}", f"lr={lr}", f"out={tmp_path / name}"])
        gaps[name] = kl(teacher_p, probs_of(tmp_path / name / "predictions" / "test.npz"))
    assert gaps["distilled"] < 0.5 * gaps["init"], gaps


def test_bad_options_name_the_choices(teacher):
    with pytest.raises(InputError, match=r"objective='kl' is not valid"):
        distill_run([f"run_dir={teacher}", "objective=kl"])
    with pytest.raises(InputError, match=r"epochs='two' is not valid; expected an integer"):
        distill_run([str(teacher), "epochs=two"])  # the run directory as the first argument
    with pytest.raises(InputError, match=r"run's directory is required, first or as run_dir="):
        distill_run(["objective=mean", str(teacher)])
    with pytest.raises(InputError, match=r"student=lora_ensemble has 3 members"):
        distill_run([f"run_dir={teacher}", "student=lora_ensemble", "ensemble_size=3"])
    with pytest.raises(InputError, match=r"unlabeled=-5 is not valid; expected a number >= 0"):
        distill_run([str(teacher), "unlabeled=-5"])  # 0, the default, is valid


def test_a_distilled_student_is_never_overwritten(teacher, tmp_path):
    out = tmp_path / "student"
    distill_run([f"run_dir={teacher}", "objective=mean", "epochs=1", f"out={out}"])
    before = (out / "results.json").read_bytes()
    with pytest.raises(InputError, match=r"already holds a distilled student .*another out=<dir>, or delete"):
        distill_run([f"run_dir={teacher}", "objective=dirichlet", "epochs=1", f"out={out}"])
    assert (out / "results.json").read_bytes() == before


def test_a_teacher_trained_on_a_gpu_is_distilled_on_the_cpu_when_told(teacher, tmp_path):
    copy = tmp_path / "teacher"
    shutil.copytree(teacher, copy)
    saved = json.loads((copy / "results.json").read_text())
    saved["config"]["trainer"].update(accelerator="gpu", devices=1)
    (copy / "results.json").write_text(json.dumps(saved))
    # The teacher only predicts (loaded wherever it was trained); the student's trainer is what needs a GPU.
    with pytest.raises(InputError, match="no CUDA GPU here.*trainer.accelerator=cpu trainer.devices=1"):
        distill_run([f"run_dir={copy}", "epochs=1", f"out={tmp_path / 'refused'}"])
    assert not (tmp_path / "refused").exists()
    record = distill_run(
        [f"run_dir={copy}", "epochs=1", "trainer.accelerator=cpu", "trainer.devices=1", f"out={tmp_path / 'student'}"]
    )
    assert 0 <= record["metrics"]["test/acc"] <= 1


def test_a_student_written_to_its_run_directory_is_a_cell_of_the_distillation_table(teacher, tmp_path):
    from sve.paper.store import load_runs, run_dir

    out = run_dir(tmp_path, "exp", "distilled_mean", 1, 0)
    distill_run([f"run_dir={teacher}", "objective=mean", "epochs=1", f"out={out}", "+experiment_name=exp"])
    (found,) = load_runs(tmp_path)
    assert (found.experiment, found.method, found.members, found.seed) == ("exp", "distilled_mean", 1, 0)
    saved = json.loads((out / "results.json").read_text())
    assert (saved["format"], saved["experiment"]) == (FORMAT, "exp")  # the current format, as written
    assert found.metric("speedup") == saved["cost"]["speedup"] > 0  # the table's cost column reads it
    assert found.metric("nll") == saved["metrics"]["test/nll"] and found.metric("nonsense") is None


def load_script():
    """scripts/mini_distill.py as a module (scripts/ is no package)."""
    import importlib.util

    from tests.conftest import ROOT

    spec = importlib.util.spec_from_file_location("mini_distill", ROOT / "scripts" / "mini_distill.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_the_mini_distillation_plan_finds_teachers_by_checkpoint_or_adapter(tmp_path):
    from omegaconf import OmegaConf

    from sve.paper.store import run_dir

    script = load_script()
    spec = OmegaConf.create({"experiments": {"a": "A"}, "seeds": [0, 1, 2]})
    (run_dir(tmp_path, "a", "sve", 4, 0) / "checkpoints").mkdir(parents=True)
    (run_dir(tmp_path, "a", "sve", 4, 0) / "checkpoints" / "final.ckpt").write_bytes(b"")
    (run_dir(tmp_path, "a", "sve", 4, 1) / "adapter").mkdir(parents=True)
    (run_dir(tmp_path, "a", "sve", 4, 1) / "adapter" / "adapter_config.json").write_text("{}")
    done = run_dir(tmp_path, "a", "distilled_mean", 1, 1)
    done.mkdir(parents=True)
    (done / "results.json").write_text("{}")
    todo, missing = script.plan(tmp_path, spec)
    assert [(s.relative_to(tmp_path).as_posix(), o, d.relative_to(tmp_path).as_posix()) for s, o, d in todo] == [
        ("runs/a/sve_m4/seed0", "mean", "runs/a/distilled_mean_m1/seed0"),
        ("runs/a/sve_m4/seed0", "dirichlet", "runs/a/distilled_dirichlet_m32/seed0"),
        ("runs/a/sve_m4/seed1/adapter", "dirichlet", "runs/a/distilled_dirichlet_m32/seed1"),
    ]
    assert missing == [run_dir(tmp_path, "a", "sve", 4, 2)]  # neither checkpoint nor adapter
    retrained = tmp_path / "teachers" / "a" / "sve_m4" / "seed2" / "checkpoints"
    retrained.mkdir(parents=True)
    (retrained / "final.ckpt").write_bytes(b"")
    assert ("teachers/a/sve_m4/seed2", "mean", "runs/a/distilled_mean_m1/seed2") in [
        (s.relative_to(tmp_path).as_posix(), o, d.relative_to(tmp_path).as_posix())
        for s, o, d in script.plan(tmp_path, spec)[0]
    ]
    retrained.joinpath("final.ckpt").unlink()
    assert [t.relative_to(tmp_path).as_posix() for t, _, _ in script.plan(tmp_path, spec, ["a"])[0]][:1] == [
        "runs/a/sve_m4/seed0"
    ]
    with pytest.raises(InputError, match=r"--experiments b: not in the mini distillation table; choose from a"):
        script.plan(tmp_path, spec, ["b"])
    assert script.student_lr(tmp_path, "a") == []  # no tuning record: the student method's default
    (tmp_path / "runs" / "a" / "svf_m1").mkdir(parents=True)
    (tmp_path / "runs" / "a" / "svf_m1" / "tuned.json").write_text('{"key": "method.lr", "value": "0.003"}')
    assert script.student_lr(tmp_path, "a") == ["lr=0.003"]


def test_a_teacher_whose_state_was_left_behind_is_trained_again_to_the_same_digits(tmp_path):
    """What a committed run keeps (results.json, no checkpoint) is enough to distill it: ``--retrain-teachers``
    trains it again from the command results.json records, and the copy's test metrics are the run's digits."""
    import shutil
    import subprocess
    import sys

    from sve.paper.store import run_dir
    from tests.conftest import ROOT

    script = load_script()
    teacher = run_dir(tmp_path, "exp", "sve", 2, 0)
    overrides = ["method=sve", "ensemble_size=2", "trainer.max_epochs=1", "+experiment_name=exp", *TINY]
    subprocess.run(
        [sys.executable, "-m", "sve.cli.train", *overrides, f"hydra.run.dir={teacher}"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    assert script.recorded_overrides(json.loads((teacher / "results.json").read_text())) == overrides
    shutil.rmtree(teacher / "checkpoints")
    shutil.rmtree(teacher / "adapter")  # as a committed run of before adapters were kept
    assert script.teacher_state(tmp_path, teacher) is None
    # As in a fresh clone of a store whose teacher was trained again before: the copy's records (results.json)
    # are committed, its checkpoint is not. The copy is trained again, not skipped as finished.
    copy = tmp_path / "teachers" / "exp" / "sve_m2" / "seed0"
    copy.mkdir(parents=True)
    shutil.copy(teacher / "results.json", copy / "results.json")
    assert script.retrain_teacher(tmp_path, teacher) == copy
    assert script.teacher_state(tmp_path, teacher) == copy  # the student reads the retrained checkpoint
    assert json.loads((copy / "reproduced.json").read_text())["differ"] == {}
    committed = json.loads((teacher / "results.json").read_text())["metrics"]
    changed = {**committed, "test/nll": 0.5, "test/seconds": 1.0}  # timings are no digits of the run
    assert script.differing_metrics(committed, changed) == {"test/nll": [committed["test/nll"], 0.5]}


def test_unlabeled_inputs_are_the_training_splits_next_ones_and_bounded(teacher, tmp_path, monkeypatch):
    """``unlabeled=8`` on a 16-input subset of the 64: the student trains on 24 inputs, the 16 labelled first
    (the very subset a run takes) and 8 others, recorded; more than the split can spare is refused by name."""
    from sve.data.checks import subset_indices

    seen = {}

    def spy(student, teacher_method, batches, *args, **kwargs):
        dataset = batches.dataset.dataset  # Keyed(Subset(full split, indices))
        seen["indices"] = list(dataset.indices)
        return [0.0]

    monkeypatch.setattr("sve.runs.distillation.distill", spy)
    record = distill_run(
        [f"run_dir={teacher}", "epochs=1", "unlabeled=8", "+dataset.train_size=16", f"out={tmp_path / 'u'}"]
    )
    assert record["inputs"] == {"labelled": 16, "unlabeled": 8}
    labelled = subset_indices(64, 16, 0)
    assert seen["indices"][:16] == labelled and len(set(seen["indices"])) == 24
    assert not set(seen["indices"][16:]) & set(labelled)
    with pytest.raises(InputError, match=r"unlabeled=49: the training split has 48 inputs beyond the 16"):
        distill_run([f"run_dir={teacher}", "unlabeled=49", "+dataset.train_size=16", f"out={tmp_path / 'v'}"])
    with pytest.raises(InputError, match=r"unlabeled=1: the training split has 0 inputs beyond the 64"):
        distill_run([f"run_dir={teacher}", "unlabeled=1", f"out={tmp_path / 'w'}"])
    with pytest.raises(InputError, match=r"unlabeled='some' is not valid; expected an integer"):
        distill_run([f"run_dir={teacher}", "unlabeled=some"])


def test_a_dirichlet_student_of_one_member_is_refused(tmp_path):
    # A Dirichlet fitted to one member's probabilities has no spread to learn: refused, not built without a word.
    single = tmp_path / "single"
    run(compose_cfg(["method=single", "trainer.max_epochs=1", *TINY], single))
    with pytest.raises(
        InputError,
        match=rf"objective=dirichlet .* needs at least 2; run_dir={single} "
        r"\(method=single\) predicts with 1 member\(s\); use objective=mean",
    ):
        distill_run([f"run_dir={single}", "objective=dirichlet", "epochs=1", f"out={tmp_path / 'student'}"])
    assert not (tmp_path / "student").exists()
