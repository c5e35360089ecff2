"""The package works from wherever it is installed, and writes only where it is run.

A wheel built from this checkout, installed (not editable) into a fresh virtual environment, runs
``sve-train`` and ``sve-sweep`` in an empty directory and writes only under it; the configs come from inside
the wheel. And with one editable install, a sweep started in another directory writes into that directory,
never into the checkout the package was installed from.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.conftest import ROOT


def files_under(path: Path) -> set[Path]:
    return {p for p in path.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory):
    """A venv (seeing the packages of the interpreter running the tests, so nothing is downloaded) with the wheel
    of this checkout."""
    root = tmp_path_factory.mktemp("wheel")
    # Built from a copy: setuptools builds in the source tree (build/, *.egg-info), which must stay untouched.
    source = root / "source"
    shutil.copytree(
        ROOT,
        source,
        symlinks=True,
        ignore=shutil.ignore_patterns(
            ".git", "results", "build", "dist", "*.egg-info", "__pycache__", "outputs", "multirun"
        ),
    )
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(root / "dist"),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    wheel = next((root / "dist").glob("singular_value_ensembles-*.whl"))
    venv.EnvBuilder(with_pip=False).create(root / "venv")
    python = root / "venv" / "bin" / "python"
    # The packages of the interpreter running the tests, not those of its base interpreter (which
    # system_site_packages would give): in a venv the dependencies are installed there. Listed as plain paths,
    # after the venv's own site-packages, so the wheel's sve wins over an editable one and its .pth files are
    # not run.
    site_packages = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]
    Path(site_packages, "tests-interpreter.pth").write_text("\n".join(ours) + "\n")
    # --ignore-installed: the sve that the venv sees through that .pth file (an editable install, or a checkout's
    # egg-info on PYTHONPATH) has the wheel's version, and pip would keep it instead of installing the wheel.
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--ignore-installed",
            "--no-build-isolation",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    return root, python


def run_in(directory: Path, command: list[str], env_path: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SVE_RESULTS")}
    if env_path is not None:
        env["PATH"] = f"{env_path}{os.pathsep}{env['PATH']}"
    return subprocess.run(command, cwd=directory, env=env, capture_output=True, text=True, timeout=900)


def test_a_wheel_installed_elsewhere_runs_and_writes_only_where_it_is_run(wheel_env, tmp_path):
    root, python = wheel_env
    code = "import sve, sve.paths; print(sve.__file__); print(sve.paths.CONFIGS)"
    where = run_in(tmp_path, [str(python), "-c", code])
    module, configs = where.stdout.split()
    assert Path(module).is_relative_to(root / "venv") and Path(configs).is_relative_to(root / "venv"), where.stdout
    assert (Path(configs) / "train.yaml").exists() and (Path(configs) / "paper" / "table2.csv").exists()
    before = files_under(ROOT / "results")
    bin_dir = python.parent
    train = run_in(tmp_path, [str(bin_dir / "sve-train"), "trainer=debug", "hydra.run.dir=outputs/debug"], bin_dir)
    assert train.returncode == 0, train.stderr[-3000:]
    assert (tmp_path / "outputs" / "debug" / "results.json").exists()
    sweep = run_in(tmp_path, [str(bin_dir / "sve-sweep"), "table2", "--smoke"], bin_dir)
    assert sweep.returncode == 0, (sweep.stdout + sweep.stderr)[-3000:]
    assert (tmp_path / "results" / "smoke" / "tables" / "table2.md").exists()
    assert list((tmp_path / "results" / "smoke" / "runs").rglob("results.json"))
    assert files_under(ROOT / "results") == before  # nothing written into the checkout


def test_a_sweep_in_another_directory_writes_there_with_the_editable_install(tmp_path):
    # The checkout's own package (editable, or this checkout on the path), started from elsewhere.
    before = files_under(ROOT / "results")
    done = run_in(tmp_path, [sys.executable, "-m", "sve.cli.sweep", "table6", "--smoke"])
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert list((tmp_path / "results" / "smoke" / "runs").rglob("results.json"))
    assert (tmp_path / "results" / "smoke" / "tables" / "table6.md").exists()
    assert files_under(ROOT / "results") == before
