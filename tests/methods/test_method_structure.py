"""Method behaviour as classes and hooks, not flags: the forward is one path, decided before it runs (no
try/except retry on the member layout); every class attribute of ``EnsembleMethod`` is a fact that says, where it
is declared, who reads it and why; the kinds of method are base classes (``sve.methods.kinds``); the member
layout's rows are the layers' own state, not a module global of ``sve/members.py``; and the hooks that replaced
two flags behave as the flags did."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest
import torch

from sve.errors import InputError
from sve.methods.base import EnsembleMethod
from tests.conftest import ROOT, compose_cfg, method_on

METHODS = ROOT / "sve" / "methods"
# The functions that run a method's members: none may catch an error and run again.
RUNNING = {"forward", "chunk_logits", "logits_in_passes", "member_features", "member_logits", "members_per_pass"}


def functions(path: Path) -> list[tuple[str, ast.FunctionDef]]:
    """(class name, function) for every method defined in a class of ``path``."""
    tree = ast.parse(path.read_text())
    return [
        (cls.name, node)
        for cls in ast.walk(tree)
        if isinstance(cls, ast.ClassDef)
        for node in cls.body
        if isinstance(node, ast.FunctionDef)
    ]


def test_the_member_passes_of_every_method_run_one_path_without_a_retry():
    running = [(path.name, cls, f) for path in sorted(METHODS.glob("*.py")) for cls, f in functions(path)]
    running = [(name, cls, f) for name, cls, f in running if f.name in RUNNING]
    assert ("base.py", "EnsembleMethod", "forward") in {(n, c, f.name) for n, c, f in running}
    retrying = [
        f"{name}: {cls}.{f.name}" for name, cls, f in running if any(isinstance(n, ast.Try) for n in ast.walk(f))
    ]
    assert not retrying, f"a member pass that catches and runs again (decide before running instead): {retrying}"


def test_the_member_layout_error_is_caught_only_by_the_probe_that_decides_the_layout():
    catching = []
    for path in sorted((ROOT / "sve").rglob("*.py")):
        top = [("", f) for f in ast.parse(path.read_text()).body if isinstance(f, ast.FunctionDef)]
        for cls, f in functions(path) + top:
            for handler in (n for n in ast.walk(f) if isinstance(n, ast.ExceptHandler) and n.type is not None):
                if "MemberLayoutError" in ast.unparse(handler.type):
                    catching.append(f"{path.relative_to(ROOT)}: {cls}.{f.name}")
    assert catching == ["sve/methods/base.py: EnsembleMethod.probe_member_layout"]


def class_attributes_with_comments() -> dict[str, str]:
    """{name: its comment} for every class-level assignment of ``EnsembleMethod``: the comment on its own line,
    or else the comment lines right above it ('' where there is none)."""
    source = (METHODS / "base.py").read_text()
    comments = {
        token.start[0]: token.string.lstrip("# ").strip()
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    }
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "EnsembleMethod")
    found = {}
    for node in cls.body:
        if not isinstance(node, (ast.Assign, ast.AnnAssign)):
            continue
        name = ast.unparse(node.target if isinstance(node, ast.AnnAssign) else node.targets[0])
        above, line = [], node.lineno - 1
        while line in comments:
            above.insert(0, comments[line])
            line -= 1
        found[name] = comments.get(node.lineno) or " ".join(above)
    return found


def test_every_class_attribute_of_the_method_base_is_a_fact_that_says_why():
    attributes = class_attributes_with_comments()
    assert {"display_name", "shared_head", "train_backbone", "layer_types"} <= set(attributes)
    silent = sorted(name for name, comment in attributes.items() if len(comment.split()) < 4)
    assert not silent, f"say, where it is declared, who reads each class attribute and why: {silent}"
    # Switches that are hooks now (training_chunks, check_sharding) or kinds (sve.methods.kinds).
    for gone in ("chunked_training", "shardable", "sampled", "fits_after_training", "epoch_snapshots"):
        assert not hasattr(EnsembleMethod, gone), gone
    flags = sorted(name for name, value in vars(EnsembleMethod).items() if isinstance(value, bool))
    assert set(flags) <= set(attributes), flags


def test_sve_members_keeps_no_row_state_at_module_level():
    tree = ast.parse((ROOT / "sve" / "members.py").read_text())
    assigned = [
        ast.unparse(t)
        for node in tree.body
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
    ]
    assert assigned == ["__all__"], assigned
    assert "ContextVar" not in (ROOT / "sve" / "members.py").read_text()


def tiny(option: list[str], ensemble_size: int = 3):
    from sve.runs.run import instantiate

    cfg = compose_cfg([*option, f"ensemble_size={ensemble_size}", "backbone=tiny_bert", "dataset=synthetic_text"])
    torch.manual_seed(0)
    method, datamodule = method_on(cfg, instantiate(cfg.backbone), ensemble_size)
    return method, next(iter(datamodule.train_dataloader()))


def test_a_method_that_fsdp_cannot_shard_refuses_in_its_hook():
    from sve.training.sharding import shard_method

    method, _ = tiny(["method=deep_ensemble_lora"])
    with pytest.raises(InputError, match="trainer=fsdp cannot shard DeepEnsembleLoRA: its trainable tensors hold"):
        method.check_sharding()
    with pytest.raises(InputError, match="cannot shard DeepEnsembleLoRA"):
        shard_method(method, mesh=None)  # before any sharding: the mesh is never read
    assert not getattr(method, "was_sharded", False)
    assert EnsembleMethod.check_sharding(method) is None  # the base refuses nothing


def test_the_rows_of_a_pass_are_each_layers_own_state_and_end_with_the_pass():
    from sve.layers.member import running_layers

    method, batch = tiny(["method=sve"])
    layers = method.member_layers()
    seen = []
    hooks = [layer.register_forward_pre_hook(lambda layer, _: seen.append(layer.rows)) for layer in layers]
    try:
        with torch.no_grad():
            method.member_features(batch, [0, 2])
    finally:
        for hook in hooks:
            hook.remove()
    B = batch["labels"].shape[0]
    assert seen == [2 * B] * len(layers)  # 2 members x B examples, told to every layer
    assert all(layer.rows is None for layer in layers) and not running_layers()
    with method.select([0, 1], rows=6):
        assert {layer.rows for layer in layers} == {6} and set(running_layers()) == set(layers)
        with method.expect_rows(12):
            assert {layer.rows for layer in layers} == {12}
        assert {layer.rows for layer in layers} == {6}
    assert all(layer.rows is None for layer in layers) and not running_layers()


def test_the_kinds_of_method_are_their_base_classes():
    from sve.methods.bayes_lora import BayesLoRALA, BayesLoRALLLA
    from sve.methods.blob import BLoB
    from sve.methods.checkpoint_ensemble import CheckpointEnsemble
    from sve.methods.kinds import FittedAfterTraining, SampledMethod, SnapshotMethod
    from sve.methods.mc_dropout import MCDropout, MCDropoutLoRA
    from sve.methods.sve import SVE

    sampled = (BLoB, MCDropout, MCDropoutLoRA, BayesLoRALA, BayesLoRALLLA)
    assert all(issubclass(c, SampledMethod) and c.fixed_ensemble_size == 1 and c.shared_head for c in sampled)
    assert {c for c in sampled if issubclass(c, FittedAfterTraining)} == {BayesLoRALA, BayesLoRALLLA}
    assert issubclass(CheckpointEnsemble, SnapshotMethod) and CheckpointEnsemble.shared_head
    assert not issubclass(SVE, (SampledMethod, SnapshotMethod, FittedAfterTraining))


def test_a_sampled_method_is_one_member_in_training_and_its_samples_at_evaluation():
    method, _ = tiny(["method=mc_dropout_lora", "method.num_samples=4"], ensemble_size=1)
    assert method.train().num_members() == 1 and method.eval().num_members() == 4
    method, _ = tiny(["method=bayes_lora_llla", "method.num_samples=4"], ensemble_size=1)
    assert method.eval().num_members() == 1  # the MAP model, until the posterior is fitted
