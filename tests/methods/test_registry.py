"""The registry of methods (``sve.methods.registry``): what docs/extending.md promises (a method is one class and
one config, and every reader sees its facts with no other edit), the facts of the shipped methods, and that no
module of the package keeps a fact about a method by its name."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from types import SimpleNamespace

import pytest
import torch
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf
from torch import nn

import sve
from sve.methods import registry
from sve.methods.base import EnsembleMethod
from sve.methods.kinds import FittedAfterTraining, SampledMethod, SnapshotMethod
from tests.conftest import ROOT

# ----- a method defined here, registered as docs/extending.md says ----------------------------------------------


class TinySampled(FittedAfterTraining, SampledMethod):
    """Members are ``num_samples`` passes of one model, and a step after training reads the training data: the
    two kinds that the plan, the benchmark and sve.wrap must learn from the class, not by its name."""

    display_name = "Tiny (sampled)"
    trains = "the head"

    def __init__(self, backbone, ensemble_size: int, num_classes: int, num_samples: int = 3, **common):
        super().__init__(backbone, ensemble_size, num_classes, **common)
        self.num_samples = num_samples
        self.fitted_on = None
        self.adapt()

    def after_fit(self, datamodule) -> None:
        self.fitted_on = datamodule


OPTION = "tiny_sampled_test"


@pytest.fixture
def tiny_option():
    """The option's config, registered as a YAML file in the group would be (Hydra's ConfigStore is the config
    group's programmatic form), and taken out again after the test."""
    node = {
        "_target_": f"{__name__}.TinySampled",
        "name": OPTION,
        "num_samples": 3,
        "lr": None,
        "members_at_once": "all",
        "target_modules": None,
    }
    ConfigStore.instance().store(group="method", name=OPTION, node=node)
    yield OPTION
    ConfigStore.instance().repo["method"].pop(f"{OPTION}.yaml")
    registry.option_config.cache_clear()
    registry.info.cache_clear()


def test_a_method_defined_in_a_test_is_seen_by_every_reader(tiny_option, monkeypatch):
    from sve.bench import table5
    from sve.bench.settings import settings
    from sve.paper import plan_tables
    from sve.paper.display import METHOD_NAMES
    from sve.paper.report import Row

    assert tiny_option in registry.options()
    facts = registry.info(tiny_option)
    assert (facts.cls, facts.sampled, facts.num_samples, facts.members(4)) == (TinySampled, True, 3, 3)

    # The tables: the class's display name is the row label.
    assert METHOD_NAMES[tiny_option] == "Tiny (sampled)" == Row(tiny_option, 5, {}).label

    # The plan of a cost table: five members are five samples of one model, not five copies.
    spec = OmegaConf.create({"kind": "cost", "experiments": ["sst2"], "rows": [{"method": tiny_option, "members": 5}]})
    monkeypatch.setattr(plan_tables, "load_spec", lambda name, smoke=False: spec)
    [(label, overrides)] = plan_tables.table_runs("any")
    assert label == f"any sst2 {tiny_option} M=5"
    assert {"ensemble_size=1", "method.num_samples=5"} <= set(overrides) and "ensemble_size=5" not in overrides

    # The benchmark's Table 5 (tiny setting): its member count is the benchmark's M (2), not the option's 3,
    # and the method was put in its evaluation state with the training data it fits after training.
    setting = settings(tiny=True)["bert_base"]
    args = SimpleNamespace(tiny=True, layers=1, svd_cache=None, repeats=1, table5_methods=[tiny_option])
    prepare, fitted = table5.prepare, []

    def spy(method, builder):
        prepare(method, builder)
        fitted.append(getattr(method, "fitted_on", None) is not None)

    monkeypatch.setattr(table5, "prepare", spy)
    part = table5.table5_part(setting, args, torch.device("cpu"))
    assert part["methods"][tiny_option]["members"] == setting.ensemble_size == 2
    assert fitted == [False, True]  # single, then the tiny method, fitted on the benchmark's training data

    # sve.wrap: the option's defaults and class, the samples as members, the fit after training.
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    ensemble = sve.wrap(model, tiny_option, ensemble_size=1, example_input=x[:1])
    assert type(ensemble.method) is TinySampled and ensemble.method.num_samples == 3
    ensemble.finish_training([(x, y)], batch_size=8)
    assert ensemble.method.fitted_on is not None
    assert ensemble.eval()(x).shape == (3, 8, 3)


def test_the_benchmark_prepares_a_method_by_its_kind_not_its_name(tiny_option):
    from sve.bench import table5

    calls = []

    class Builder:
        def datamodule(self):
            calls.append("datamodule")
            return "the training data"

    class Hooks:  # the hooks prepare calls, on a method that is not built (no backbone)
        ensemble_size = 3

        def on_train_epoch_end(self, module):
            calls.append("epoch end")

        def after_fit(self, data):
            calls.append(("after_fit", data))

    class Fitted(Hooks, FittedAfterTraining):
        pass

    table5.prepare(object.__new__(Fitted), Builder())
    assert calls == ["epoch end"] * 3 + ["datamodule", ("after_fit", "the training data")]
    calls[:] = []
    table5.prepare(Hooks(), Builder())
    assert calls == ["epoch end"] * 3 + [("after_fit", None)]


def test_an_unknown_option_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"method='sve_typo' is not valid; choose one of \[.*'sve', 'sve_lora'"):
        registry.info("sve_typo")


# ----- the shipped methods --------------------------------------------------------------------------------------


def every_method_class() -> list[type]:
    for module in pkgutil.iter_modules(importlib.import_module("sve.methods").__path__):
        importlib.import_module(f"sve.methods.{module.name}")
    return [c for c in registry.CLASSES.values() if c.__module__.startswith("sve.methods.")]


def test_every_shipped_option_has_its_facts():
    infos = [registry.info(o) for o in registry.options()]
    names = [i.display_name for i in infos]
    assert all(names) and len(set(names)) == len(names), names  # one label per row
    for i in infos:
        cfg = registry.option_config(i.option)
        assert i.trains, i.option
        # A sampled method's member count is its num_samples, and one model is trained: ensemble_size is 1.
        assert i.sampled == ("num_samples" in cfg), i.option
        assert not i.sampled or i.cls.fixed_ensemble_size == 1, i.option
        # A method that fits data after training has a step after training (the base's hook does nothing).
        assert not i.fits_after_training or i.cls.after_fit is not EnsembleMethod.after_fit, i.option
        # Members from epoch-end snapshots: a schedule with too few epochs is refused before training.
        assert not i.epoch_snapshots or i.cls.check_training is not EnsembleMethod.check_training, i.option
        # The facts are the kinds, the classes the rest of the package asks for.
        kinds = (i.sampled, i.fits_after_training, i.epoch_snapshots)
        assert kinds == tuple(issubclass(i.cls, k) for k in (SampledMethod, FittedAfterTraining, SnapshotMethod))


def test_every_method_class_is_registered_where_it_is_defined():
    classes = every_method_class()
    built = {registry.info(o).cls for o in registry.options()}
    assert built <= set(classes)
    for cls in built:  # (options sharing a class have labels of their own: the uniqueness test above)
        assert "display_name" in vars(cls), f"{cls.__name__} has its parent's row label"


def test_the_sampled_methods_are_those_whose_members_are_samples():
    sampled = {o for o in registry.options() if registry.info(o).sampled}
    # Every option whose class reports num_samples is sampled, mc_dropout_lora included (the plan and the
    # benchmark once listed the sampled methods by name and missed it).
    assert {"mc_dropout", "mc_dropout_lora", "blob", "bayes_lora_la", "bayes_lora_llla"} == sampled


# ----- no fact about a method kept by its name elsewhere ------------------------------------------------------

# Where a method's name may stand in a list, a dict or a comparison outside sve/methods, and why. Keyed by
# (file, the top-level definition it is in, the name; "*" for any name). Everything else reads the registry.
ALLOWED = {
    # The benchmark's experiments: which methods it measures against which, as a table definition names its rows.
    ("sve/paths.py", "cache_text", "sve"): "the cache folder's name (<XDG_CACHE_HOME>/sve), not the method",
    ("sve/bench/markdown.py", "LABELS", "*"): "candidate labels of the ensemble benchmark",
    ("sve/bench/ensemble.py", "ensemble_part", "*"): "SVE against M dense copies and the batched baselines",
    ("sve/bench/ensemble.py", "full_depth_eval", "*"): "the same, at the full depth",
    ("sve/bench/ensemble.py", "targets", "*"): "the benchmark's targets name what they compare",
    ("sve/bench/table5.py", "TABLE5_DEFAULT", "*"): "Table 5's rows",
    ("sve/bench/table5.py", "VARIANTS", "*"): "SVE's settings measured beside its default",
    ("sve/bench/table5.py", "NOT_BY_DEFAULT", "*"): "a row left out by default, with the reason",
    ("sve/bench/table5.py", "latency_target", "*"): "SVE against LoRA-Ensemble at batch 1",
    ("sve/bench/table5.py", "table5_part", "sve"): "the same target, measured when both rows are",
    ("sve/bench/table5.py", "table5_part", "lora_ensemble"): "the same target, measured when both rows are",
    ("sve/bench/front.py", "FRONT", "*"): "the front's rows and their settings",
    ("sve/bench/layer_costs.py", "weight_steps", "*"): "one shared weight against LoRA-Ensemble's",
    ("sve/bench/table5.py", "table5_part", "deep_ensemble"): "its training memory is M x Single's, not measured",
    ("sve/bench/gpu_inference.py", "CANDIDATES", "*"): "the GPU check's inference paths and what they run",
    ("sve/bench/gpu_inference.py", "AGREEMENT", "*"): "which path each is held equal to",
    ("sve/bench/gpu_inference.py", "agreement", "*"): "the same references",
    # Costs are relative to the single model (Table 5).
    ("sve/bench/table5.py", "table5_part", "single"): "the reference of every cost",
    ("sve/bench/front.py", "pareto_front_part", "single"): "the reference of every cost",
    ("sve/paper/report.py", "cost_runs", "single"): "the reference of every cost",
    # Not a fact about a method.
    ("sve/runs/distillation.py", "OPTIONS", "svf"): "sve-distill's default student, a command-line default",
    ("sve/bench/counters.py", "reachable_tensors", "sve"): "the package named sve, not the method",
}


def named_methods(tree: ast.Module, names: set[str]):
    """(line, top-level definition, name) of each string equal to a method name that stands in a list, tuple,
    set or dict display or in a comparison, and of each prefix of one in ``startswith`` (``"bayes"``)."""
    for statement in tree.body:
        scope = getattr(statement, "name", None)
        if scope is None and isinstance(statement, (ast.Assign, ast.AnnAssign)):
            target = statement.targets[0] if isinstance(statement, ast.Assign) else statement.target
            scope = getattr(target, "id", None)
        for node in ast.walk(statement):
            values = []
            if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
                values = node.elts
            elif isinstance(node, ast.Dict):
                values = [*filter(None, node.keys), *node.values]
            elif isinstance(node, ast.Compare):
                values = [node.left, *node.comparators]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) in ("startswith", "endswith"):
                values = [
                    a
                    for a in node.args
                    if isinstance(a, ast.Constant)
                    and isinstance(a.value, str)
                    and any(n.startswith(a.value) and len(a.value) > 3 for n in names)
                ]
                yield from ((a.lineno, scope, a.value) for a in values)
                continue
            for v in values:
                if isinstance(v, ast.Constant) and v.value in names:
                    yield v.lineno, scope, v.value


def test_no_method_name_is_listed_outside_its_class_and_config():
    names = {p.stem for p in (ROOT / "sve" / "configs" / "method").glob("*.yaml")}
    found, used = [], set()
    for path in sorted((ROOT / "sve").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("sve/methods/"):  # the classes themselves
            continue
        for line, scope, name in named_methods(ast.parse(path.read_text()), names):
            key = next((k for k in ((rel, scope, name), (rel, scope, "*")) if k in ALLOWED), None)
            if key is None:
                found.append(f"{rel}:{line} ({scope}): {name!r}")
            used.add(key)
    assert not found, "method names kept outside the registry (read sve.methods.registry instead):\n" + "\n".join(found)
    assert not set(ALLOWED) - used, f"allowed but no longer there: {sorted(set(ALLOWED) - used)}"


def test_the_name_check_sees_the_patterns_it_guards_against():
    code = (
        'SAMPLED = ("mc_dropout", "blob")\n'
        'def f(n):\n    return n in ("x",) or n == "sve" or n.startswith("bayes")\n'
        'FACTS = {"svf": 1}\n'
    )
    found = {
        (scope, name)
        for _, scope, name in named_methods(ast.parse(code), {"mc_dropout", "blob", "sve", "svf", "bayes_lora_la"})
    }
    assert found == {("SAMPLED", "mc_dropout"), ("SAMPLED", "blob"), ("f", "sve"), ("f", "bayes"), ("FACTS", "svf")}
