"""The package: ``import sve`` names its map and version and loads no torch; its public names load on use."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

import sve
from tests.conftest import ROOT


def test_import_sve_is_light_and_names_its_map():
    code = "import sys, sve; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr[-2000:]
    assert "Package map" in sve.__doc__ and "``methods``" in sve.__doc__


def test_version_is_the_installed_distribution_s():
    assert sve.__version__ == importlib.metadata.version("singular-value-ensembles")


def test_public_names_load_on_first_use():
    from sve.methods.sve import SVE

    assert sve.SVE is SVE and {"SVE", "EnsembleModule", "run", "InputError"} <= set(sve.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        sve.nope  # noqa: B018


def test_the_test_tree_mirrors_the_package():
    # tests/<subpackage>/ holds the tests of sve/<subpackage>/; the package-wide ones (imports, lint, install,
    # paths, the README) stay at the top.
    tests = ROOT / "tests"
    folders = {p.name for p in tests.iterdir() if p.is_dir() and p.name != "__pycache__"}
    subpackages = {p.name for p in (ROOT / "sve").iterdir() if (p / "__init__.py").exists()}
    assert folders <= subpackages, folders - subpackages
    assert all((tests / name / "__init__.py").exists() for name in folders)
    top = sorted(p.name for p in tests.glob("test_*.py"))
    assert len(top) <= 8, f"{top}: a test of one subpackage belongs in tests/<subpackage>/"


def test_the_public_surface_is_what_the_architecture_page_lists():
    import re

    import sve

    page = (ROOT / "docs" / "architecture.md").read_text()
    paragraph = page[page.index("`import sve` loads no torch") : page.index("are imported on first use")]
    listed = set(re.findall(r"`([A-Za-z_]\w*)`", paragraph)) - {"import"}
    assert sorted(dir(sve)) == sorted(listed)  # no import machinery (MOVED, _MovedModules) in tab completion
    for name in listed - {"__version__"}:
        assert getattr(sve, name) is not None, name
    from sve.methods import _EXPORTS as method_classes

    assert set(method_classes) - {"MemberHeads"} <= listed  # every method class, nothing kept back
    assert sve.SVConv2d is sve.SVConv  # the old name still resolves
