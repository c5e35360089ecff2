"""results.json's format: records carry it, every file read is migrated to it, the old module names warn."""

import json
import subprocess
import sys

import pytest

import sve
from sve.runs.results import FORMAT, UnreadableFile, migrate, read_results, results_record
from tests.conftest import ROOT

OLD = {
    "method": "mc_dropout",
    "ensemble_size": 1,
    "seed": 0,
    "metrics": {"test/acc": 0.5},
    "method_report": {"num_samples": 10},
    "config": {
        "experiment_name": "exp",
        "optimizer": {"_target_": "sve.optim.warmup_schedule", "lr": 0.1},
        "callbacks": [{"_target_": "sve.curves.Curve"}, {"_target_": "torch.nn.Identity"}],
    },
}


def test_a_file_without_a_format_is_migrated_to_the_current_one():
    migrated = migrate(json.loads(json.dumps(OLD)))
    assert migrated["format"] == FORMAT == 1 and list(migrated)[0] == "format"
    assert migrated["experiment"] == "exp"  # from the config, where such files kept it
    assert migrated["num_members"] == 10  # a sampled method's samples
    assert migrate({**OLD, "method_report": {}, "ensemble_size": 4})["num_members"] == 4
    assert migrate({**OLD, "num_members": 7, "experiment": "own"})["num_members"] == 7
    assert migrate({**OLD, "experiment": "own"})["experiment"] == "own"
    config = migrated["config"]
    assert config["optimizer"] == {"_target_": "sve.training.optim.warmup_schedule", "lr": 0.1}
    assert [c["_target_"] for c in config["callbacks"]] == ["sve.training.curves.Curve", "torch.nn.Identity"]
    assert {k: migrated[k] for k in ("method", "ensemble_size", "seed", "metrics")} == {
        k: OLD[k] for k in ("method", "ensemble_size", "seed", "metrics")
    }


def test_a_current_file_reads_as_written_and_a_later_one_is_refused(tmp_path):
    current = results_record({"method": "sve", "experiment": None, "num_members": 2}, {"seed": 0}, "abc")
    assert list(current)[0] == "format" and current["format"] == FORMAT
    assert list(current)[-5:] == ["command", "git_commit", "versions", "numerics", "config"]
    path = tmp_path / "results.json"
    path.write_text(json.dumps(current))
    assert read_results(path) == current
    path.write_text(json.dumps({**current, "format": FORMAT + 1}))
    with pytest.raises(UnreadableFile, match=rf"{path}: format {FORMAT + 1}: written by a later version of sve"):
        read_results(path)


def test_every_committed_results_json_reads_in_the_current_format():
    files = sorted((ROOT / "results").rglob("results.json"))
    assert len(files) > 200
    for path in files:
        results = read_results(path)
        assert results["format"] == FORMAT and "experiment" in results and "num_members" in results, path
        targets = json.dumps(results.get("config"))
        assert not any(f'"_target_": "{old}.' in targets for old in sve.MOVED), path


def test_an_old_module_name_warns_once_and_gives_the_new_module():
    code = (
        "import sys, warnings; warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    import sve.writable as old\n"
        "    del sys.modules['sve.writable']\n"
        "    import sve.writable as again\n"
        "import sve.runs.writable as new\n"
        "assert old is new and again is new\n"
        "print([(w.category.__name__, str(w.message), w.filename) for w in caught])"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(
        [
            (
                "FutureWarning",
                "sve.writable is now sve.runs.writable; the old name goes "
                f"in sve {sve.MOVED_UNTIL}: import sve.runs.writable (or set _target_ to it)",
                "<string>",
            )
        ]
    )


def test_the_old_names_go_in_the_next_minor_release():
    major, minor = map(int, sve.__version__.split(".")[:2])
    assert sve.MOVED_UNTIL == f"{major}.{minor + 1}.0"
