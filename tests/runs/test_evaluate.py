"""evaluate.py: a trained run evaluated again from checkpoints/final.ckpt gives the numbers of its results.json,
on its own data or with overrides, writing beside the training results and never over them unless asked."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from sve.errors import InputError
from sve.runs.reevaluate import evaluate_run
from sve.runs.results import FORMAT
from sve.runs.run import run
from tests.conftest import ROOT, compose_cfg

TINY = ["backbone=tiny_vit", "dataset=synthetic_image", "callbacks=default", "dataset.num_test=21"]
TIMING = {"test/seconds"}


@pytest.fixture(scope="module")
def sve_run(tmp_path_factory):
    """One trained SVE run (M=2) for the tests below; each gets a copy of its directory."""
    directory = tmp_path_factory.mktemp("sve_run")
    return directory, run(compose_cfg(["method=sve", "ensemble_size=2", *TINY], directory))


@pytest.fixture
def trained(sve_run, tmp_path):
    shutil.copytree(sve_run[0], tmp_path, dirs_exist_ok=True)
    return tmp_path, sve_run[1]


def same_metrics(trained: dict, evaluated: dict, rel: float = 0.0) -> None:
    assert set(trained) == set(evaluated)
    for key in set(trained) - TIMING:
        assert evaluated[key] == pytest.approx(trained[key], rel=rel, abs=0), key


@pytest.mark.parametrize(
    "method, extra",
    [
        ("sve", ["ensemble_size=2"]),
        ("mc_dropout", ["method.num_samples=3"]),  # sampled members: each set's pass is seeded
        ("checkpoint_ensemble", ["ensemble_size=2", "trainer.max_epochs=2"]),  # snapshots in use after after_fit
        ("deep_ensemble", ["ensemble_size=2", "method.mode=sequential"]),  # the last round's members stored
        ("bayes_lora_llla", ["method.marglik_steps=3"]),  # the posterior comes with the checkpoint
    ],
)
def test_evaluate_gives_the_training_metrics(method, extra, tmp_path):
    trained = run(compose_cfg([f"method={method}", *extra, *TINY], tmp_path))
    before = (tmp_path / "results.json").read_bytes()
    evaluated = evaluate_run(tmp_path)
    # Every method's state comes with the checkpoint (a posterior too): the same numbers to the last digit.
    same_metrics(trained["metrics"], evaluated["metrics"], rel=0)
    assert evaluated["num_members"] == trained["num_members"]
    assert (tmp_path / "results.json").read_bytes() == before  # the training results stay as they were
    written = json.loads((tmp_path / "evaluations" / "synthetic_image.json").read_text())
    assert written["metrics"] == evaluated["metrics"]
    again = np.load(tmp_path / written["predictions"]["test"])
    assert written["predictions"]["test"] == "evaluations/synthetic_image/predictions/test.npz"
    first = np.load(tmp_path / "predictions" / "test.npz")
    np.testing.assert_array_equal(again["member_logits"], first["member_logits"])
    # The run's adapter directory, moved away from its run, evaluates to the same digits.
    shared = tmp_path.parent / f"{tmp_path.name}_adapter"
    shutil.copytree(tmp_path / "adapter", shared)
    from_adapter = evaluate_run(shared)
    same_metrics(trained["metrics"], from_adapter["metrics"], rel=0)
    assert (shared / "evaluations" / "synthetic_image.json").is_file()


def test_a_text_backbone_with_attention_dropout_evaluates_to_the_training_digits(tmp_path):
    # BERT's attention has dropout, so exact draws run it unfused (sve.layers.draws); a model evaluated
    # again in a fresh process must run the same kernels as the one evaluated right after training, or the
    # two differ in rounding (by 1e-7 when the switch happens only when fitting starts).
    overrides = ["method=sve", "ensemble_size=2", "backbone=tiny_bert", "dataset=synthetic_text", "callbacks=default"]
    trained = run(compose_cfg(overrides, tmp_path))
    config = json.loads((tmp_path / "results.json").read_text())["config"]
    assert config["backbone"]["config"].get("attention_probs_dropout_prob", 0.1) > 0  # BERT's default: 0.1
    evaluated = evaluate_run(tmp_path)
    same_metrics(trained["metrics"], evaluated["metrics"], rel=0)
    again = np.load(tmp_path / "evaluations" / "synthetic_text" / "predictions" / "test.npz")
    first = np.load(tmp_path / "predictions" / "test.npz")
    np.testing.assert_array_equal(again["member_logits"], first["member_logits"])


def test_an_adapter_on_another_base_is_refused(trained):
    run_dir, _ = trained
    config = json.loads((run_dir / "adapter" / "adapter_config.json").read_text())
    config["base_fingerprint"] = "0" * 64
    (run_dir / "adapter" / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="trained on another base model"):
        evaluate_run(run_dir / "adapter")


def test_training_and_evaluation_write_records_of_one_format(trained):
    tmp_path, _ = trained
    evaluate_run(tmp_path, name="again")
    for path in (tmp_path / "results.json", tmp_path / "evaluations" / "again.json"):
        record = json.loads(path.read_text())
        assert list(record)[0] == "format" and record["format"] == FORMAT, path
        assert list(record)[-5:] == ["command", "git_commit", "versions", "numerics", "config"], path


def test_evaluate_with_overrides_adds_shift_and_updates_results_when_asked(trained):
    tmp_path, trained = trained
    assert "shift" not in trained
    evaluated = evaluate_run(tmp_path, ["dataset.corruptions=[contrast]", "dataset.severities=[2,4]"], name="shift")
    assert list(evaluated["shift"]["by_severity"]) == ["0", "2", "4"]
    assert evaluated["shift"]["by_severity"]["0"]["acc"] == trained["metrics"]["test/acc"]
    assert (tmp_path / "evaluations" / "shift" / "predictions" / "shift" / "contrast" / "4.npz").exists()
    assert "shift" not in json.loads((tmp_path / "results.json").read_text())
    # The metrics against the severity, drawn beside the evaluation's predictions (sve.metrics.plots).
    figures = tmp_path / "evaluations" / "shift"
    assert (figures / "severity.png").stat().st_size and (figures / "severity.pdf").stat().st_size
    assert not (tmp_path / "severity.png").exists()

    evaluate_run(tmp_path, ["dataset.corruptions=[contrast]", "dataset.severities=[2,4]"], update_results=True)
    updated = json.loads((tmp_path / "results.json").read_text())
    assert updated["shift"] == evaluated["shift"] and updated["method"] == "sve"  # training keys kept
    assert updated["evaluated_by"]["overrides"] == ["dataset.corruptions=[contrast]", "dataset.severities=[2,4]"]
    assert updated["predictions"]["shift/contrast/2"] == "predictions/shift/contrast/2.npz"
    assert updated["metrics"]["test/aurc"] == evaluated["metrics"]["test/aurc"] == trained["metrics"]["test/aurc"]
    assert updated["risk_coverage"] == evaluated["risk_coverage"]
    assert (tmp_path / "severity.png").is_file()  # update_results=true: into the run directory
    # Metrics of other data are never filed as the run's own: results.json keeps its trained dataset keys.
    with pytest.raises(InputError, match=r"update_results=true .* other data: dataset\.noise=3\.0 \(trained with"):
        evaluate_run(tmp_path, ["dataset.noise=3.0"], update_results=True)
    assert json.loads((tmp_path / "results.json").read_text()) == updated


def test_evaluate_on_another_dataset_option(trained):
    tmp_path, _ = trained
    # Another option of configs/dataset (composed afresh: the run's num_test=21 is gone), here the same
    # generator with noisier images.
    evaluated = evaluate_run(tmp_path, ["dataset=synthetic_image", "dataset.noise=3.0"], name="noisier")
    assert evaluated["metrics"]["test/examples"] == 16  # the option's 32 test images, 2 debug batches of 8
    assert evaluated["config"]["dataset"]["noise"] == 3.0 and evaluated["config"]["dataset"]["num_test"] == 32
    assert (tmp_path / "evaluations" / "noisier.json").exists()


def test_evaluate_errors_say_what_to_change(trained):
    tmp_path, _ = trained
    with pytest.raises(InputError, match="dataset.colour: not a key of the run's config"):
        evaluate_run(tmp_path, ["dataset.colour=red"])
    with pytest.raises(InputError, match="experiment=... cannot be changed"):
        evaluate_run(tmp_path, ["experiment=sst2_bert"])
    with pytest.raises(InputError, match="has 3 classes; the run was trained on synthetic_image with 4"):
        evaluate_run(tmp_path, ["dataset.num_classes=3"])
    with pytest.raises(InputError, match="frozen tensor"):  # another random backbone: not the trained model
        evaluate_run(tmp_path, ["seed=5"])
    bare = tmp_path / "bare"
    run(compose_cfg(["method=sve", *TINY, "callbacks=none"], bare))
    with pytest.raises(InputError, match="callbacks=none cannot be evaluated again"):
        evaluate_run(bare)


def test_evaluating_with_another_model_or_a_bad_value_is_one_line_naming_it(trained):
    tmp_path, _ = trained
    # Another member count builds another model: refused naming the override and the trained value, with no
    # advice to "resume" (an evaluation resumes nothing).
    with pytest.raises(InputError, match=r"the overrides change the model: ensemble_size=3 \(trained with 2\)") as err:
        evaluate_run(tmp_path, ["ensemble_size=3"])
    assert "Resume" not in str(err.value)
    # Another method or backbone is refused before the model is built.
    with pytest.raises(InputError, match="method=single cannot be changed when evaluating.*trained with method=sve"):
        evaluate_run(tmp_path, ["method=single"])
    with pytest.raises(InputError, match="backbone=tiny_bert cannot be changed.*trained with backbone=tiny_vit"):
        evaluate_run(tmp_path, ["backbone=tiny_bert"])
    # Values are checked as in training (unchecked, they are raw ValueErrors from int()).
    with pytest.raises(InputError, match="ensemble_size='four' is not valid; expected a positive integer"):
        evaluate_run(tmp_path, ["ensemble_size=four"])
    with pytest.raises(InputError, match="seed='abc' is not valid; expected an integer"):
        evaluate_run(tmp_path, ["seed=abc"])
    assert not (tmp_path / "evaluations").exists()


def test_evaluating_on_data_with_other_class_names_is_refused(tmp_path):
    # Trained on cat/dog; a car/truck tree has as many classes, and would be evaluated as if label 0 were "cat".
    from tests.data.test_generic_data import image_tree

    trained = image_tree(tmp_path / "pets", {"train": {"cat": 4, "dog": 4}, "test": {"cat": 2, "dog": 2}})
    other = image_tree(tmp_path / "cars", {"train": {"car": 2, "truck": 2}, "test": {"car": 2, "truck": 2}})
    same = image_tree(tmp_path / "more_pets", {"train": {"cat": 2, "dog": 2}, "test": {"cat": 3, "dog": 3}})
    run_dir = tmp_path / "run"
    run(
        compose_cfg(
            [
                "dataset=image_folder",
                f"dataset.root={trained}",
                "callbacks=default",
                "ensemble_size=2",
                "dataset.batch_size=4",
            ],
            run_dir,
        )
    )
    for directory in (run_dir, run_dir / "adapter"):
        with pytest.raises(
            InputError,
            match=r"its classes \['car', 'truck'\] are not the classes the run was "
            r"trained with on image_folder \['cat', 'dog'\]",
        ):
            evaluate_run(directory, [f"dataset.root={other}"], name="cars")
    assert evaluate_run(run_dir, [f"dataset.root={same}"], name="more")["metrics"]["test/examples"] == 6
    assert not (run_dir / "evaluations" / "cars.json").exists()


def test_a_run_trained_on_a_gpu_evaluates_on_the_cpu_when_told(trained):
    tmp_path, results = trained
    saved = json.loads((tmp_path / "results.json").read_text())
    saved["config"]["trainer"].update(accelerator="gpu", devices=2)
    (tmp_path / "results.json").write_text(json.dumps(saved))
    with pytest.raises(InputError, match="no CUDA GPU here.*trainer.accelerator=cpu trainer.devices=1"):
        evaluate_run(tmp_path)
    told = evaluate_run(tmp_path, ["trainer.accelerator=cpu", "trainer.devices=1"])
    same_metrics(results["metrics"], told["metrics"])


def test_evaluate_py_command_line(trained):
    tmp_path, trained = trained
    done = subprocess.run(
        [sys.executable, "evaluate.py", f"run_dir={tmp_path}", "name=cli"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"acc {100 * trained['metrics']['test/acc']:.2f}%" in done.stdout
    same_metrics(trained["metrics"], json.loads((tmp_path / "evaluations" / "cli.json").read_text())["metrics"])
    # The directory as the first argument, as people type it (and as sve-train's messages write it).
    done = subprocess.run(
        [sys.executable, "evaluate.py", str(tmp_path), "trainer.colour=red"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].startswith("error: trainer.colour")
    done = subprocess.run(
        [sys.executable, "evaluate.py", "name=x", "dataset=cifar10"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and "error: no run directory among the arguments" in done.stderr


def test_a_shift_evaluation_keeps_the_runs_temperature_and_refits_only_when_asked(trained):
    from sve.members import log_predictive
    from sve.metrics.calibration import fit_temperature
    from sve.runs.prediction_files import read_predictions

    tmp_path, trained = trained
    own_t = trained["metrics"]["test/temperature"]
    # Other data (noisier images): its validation labels are not the deployed model's to calibrate on.
    shifted = evaluate_run(tmp_path, ["dataset=synthetic_image", "dataset.noise=3.0"], name="noisier")
    assert shifted["metrics"]["test/temperature"] == own_t
    assert shifted["temperature_from"] == "run (in-distribution validation)"
    assert not any(k.startswith("test/refit_") for k in shifted["metrics"]) and "refit_temperature_from" not in shifted

    refit = evaluate_run(tmp_path, ["dataset=synthetic_image", "dataset.noise=3.0"], "refit", refit_temperature=True)
    assert {k: refit["metrics"][k] for k in shifted["metrics"] if "ts_" in k} == {
        k: v for k, v in shifted["metrics"].items() if "ts_" in k
    }  # ts_* still the run's T
    val = read_predictions(tmp_path / refit["predictions"]["val"])
    logits, labels = torch.from_numpy(val["member_logits"]), torch.from_numpy(val["labels"])
    refitted = fit_temperature(log_predictive(logits, refit["aggregate"]), labels)
    assert refit["metrics"]["test/refit_temperature"] == pytest.approx(refitted, rel=1e-6)
    assert abs(refitted - own_t) > 0.05  # the shifted set's labels move T: the refit is a different number
    assert refit["refit_temperature_from"] == "refit on synthetic_image (validation labels of the evaluated data)"
    assert {"test/refit_ts_acc", "test/refit_ts_ece", "test/refit_ts_nll"} <= set(refit["metrics"])
