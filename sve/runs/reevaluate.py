"""A finished run evaluated again from its checkpoint, without training: what ``evaluate.py`` calls.

``python evaluate.py run_dir=<run dir> [dataset=<option>] [key=value ...] [name=...] [update_results=true]``
(``sve-eval <run dir> ...`` also takes the directory as its first argument)

``run_dir`` may also be an adapter directory (``<run dir>/adapter``, or one shared elsewhere): the model is then
rebuilt from the config recorded in its ``adapter_config.json``, checked against its base fingerprint, and
loaded from its safetensors (``sve.api.adapter_files``); the evaluation is written into that directory.

The model is rebuilt from the run's own config (results.json ``config``, else ``.hydra/config.yaml``), seeded as
in training, and loaded from ``checkpoints/final.ckpt``, which ``run`` writes after training and ``after_fit``
when the run keeps checkpoints (``callbacks=default``). Checkpoints are lean: the frozen part is rebuilt from
the config and checked against the checkpoint's fingerprints, so a config that no longer builds the same
model is an error naming the tensors, never a silently different model. A saved config that names what this
code no longer has (a ``_target_`` that does not import, a key its target does not take) is an ``InputError``
naming the key, its value and the valid keys, and the commit that trained the run (results.json
``git_commit``) to check out; so is an unreadable results.json, config.yaml or checkpoint, naming the file.

Every other argument overrides the run's config for the evaluation: ``dataset=<option>`` swaps in another
option of ``configs/dataset`` (with the same classes, e.g. ``cifar100_c`` for a CIFAR-100 run; the keys that
shape the model, its data module's ``model_keys``, keep the run's values: ``keep_own_values``), a dotted
``key=value`` changes one value (``dataset.corruptions=all`` adds the shift sets, ``dataset.root=...`` points
at the data), ``+key=value`` adds one and ``~key`` removes one. ``experiment`` and ``recipe`` cannot be swapped:
they decide the training. Options of one's own config folder are found as sve-train finds them:
``--config-dir <dir>`` (or ``hydra.searchpath=[file://<dir>]``) adds it to where ``dataset=<option>`` is looked up.

What a method's ``after_fit`` built (Bayes-LoRA's Laplace posterior, a checkpoint ensemble's snapshots) is
part of its state in ``final.ckpt``, so nothing is refitted: the evaluated model is the tested one.

Output (rank 0): ``evaluations/<name>.json`` in the run directory (``name`` defaults to the evaluated
dataset's name) holding ``sve.runs.evaluation``'s keys plus what was evaluated; predictions under
``evaluations/<name>/predictions/``. The training ``results.json`` is left as it is unless
``update_results=true``, which replaces its evaluation keys (``num_members``, ``metrics``, ``predictions``,
``reliability``, ``risk_coverage``, ``shift``) with the new ones, records ``evaluated_by``, and writes predictions
under ``predictions/``. On other data than the run's own (``changed_data``: a shift), ``test/ts_*`` keep the
run's temperature (``temperature_from`` says where T came from) and ``refit_temperature=true`` adds
``test/refit_ts_*`` with T refitted on the evaluated data's validation labels. With shift
sets (``dataset.corruptions=...``), ``evaluations/<name>/severity.png`` and ``.pdf``
(in the run directory with ``update_results=true``): accuracy, ECE and NLL against the severity.
"""

from __future__ import annotations

from pathlib import Path

import pytorch_lightning as pl
from hydra.errors import InstantiationException
from omegaconf import DictConfig, OmegaConf

from sve.api import adapter_files
from sve.errors import InputError
from sve.runs.eval_config import (
    adapter_run_config,
    apply_overrides,
    check_overridden_values,
    check_same_data,
    check_same_model,
    check_targets,
    mismatch_cause,
    rebuild_hint,
    same_data,
    saved_config,
)
from sve.runs.evaluation import IN_DISTRIBUTION, evaluate
from sve.runs.prediction_files import PREDICTIONS
from sve.runs.results import git_commit, read_results, results_record, write_json
from sve.runs.run import (
    build,
    instantiate,
    make_trainer,
    prediction_options,
    run_severity_figure,
    run_shifted_figure,
)
from sve.runs.rundir import claim
from sve.runs.validate import check_accelerator
from sve.runs.writable import check_writable
from sve.training.checkpoint import FINAL, CheckpointMismatch, read_checkpoint
from sve.training.loops import stopped_by_sigterm

EVALUATIONS = "evaluations"
EVALUATION_KEYS = (
    "num_members",
    "metrics",
    "predictions",
    "reliability",
    "risk_coverage",
    "conformal",
    "shift",
    "shifted",
)
OPTIONS = {"run_dir": None, "name": None, "ckpt_path": None, "update_results": "false", "refit_temperature": "false"}
# A run trained on a GPU, evaluated where there is none: the keys that keep the rest of its trainer (trainer=cpu
# would replace all of it).
ON_THE_CPU = (
    "evaluate on the CPU with trainer.accelerator=cpu trainer.devices=1 (and trainer.strategy=auto for a "
    "DDP or FSDP run)"
)


def trained_class_names(run_dir: Path, adapter: bool) -> list | None:
    """The class names the run was trained with (results.json or adapter_config.json ``class_names``), where
    its data named them (image_folder, text_table); None otherwise."""
    if adapter:
        return adapter_files.read_config(run_dir).get("class_names")
    results = run_dir / "results.json"
    return read_results(results).get("class_names") if results.exists() else None


def check_same_classes(datamodule, trained_names: list | None, trained_dataset: str) -> None:
    """Label i of the evaluated data must be the class the run learned as label i: folders (or labels) with other
    names but as many of them gave metrics of a head scored against classes it never saw."""
    names = datamodule.class_names()
    if trained_names is None or names is None:
        return
    if [str(n) for n in names] != [str(n) for n in trained_names]:
        raise InputError(
            f"{datamodule.what}: its classes {list(names)} are not the classes the run was trained "
            f"with on {trained_dataset} {list(trained_names)} (label i must be the same class in both, "
            "in this order); evaluate on data with the trained classes"
        )


def rebuilt(cfg: DictConfig, run_dir: Path):
    """``build(cfg)``; an ``InputError`` when the config no longer builds with this code (a required argument
    that the saved config lacks, a target gone), as ``check_targets`` cannot see every such case."""
    try:
        return build(cfg)
    except InstantiationException as err:
        text = str(err)
        if not any(
            s in text
            for s in (
                "unexpected keyword argument",
                "required positional argument",
                "required keyword-only argument",
                "Error locating target",
                "Error loading",
            )
        ):
            raise
        first = " ".join(text.split())[:300]
        raise InputError(
            f"run_dir={run_dir}: the run's config does not build with this code ({first}); {rebuild_hint(run_dir)}"
        ) from None


def model_directory(run_dir: Path) -> Path:
    """The run's final checkpoint where it kept one, else its adapter/ (what a committed run keeps)."""
    adapter = run_dir / "adapter"
    if not (run_dir / "checkpoints" / FINAL).is_file() and (adapter / adapter_files.CONFIG).is_file():
        return adapter
    return run_dir


def load_run(run_dir: str | Path, overrides: list[str] = (), ckpt_path: str | Path | None = None, trainer: bool = True):
    """(config, checkpoint path, module, datamodule) of a trained run (or adapter directory) rebuilt from its
    config with ``overrides`` and loaded with its trained state; the datamodule is set up (every data file
    read and checked). What ``evaluate_run`` and ``sve-distill`` start from; ``trainer=False`` for a caller
    that builds no Lightning trainer from this config (the teacher of ``sve-distill``)."""
    run_dir = Path(run_dir).expanduser()
    adapter = (run_dir / adapter_files.CONFIG).is_file()  # an adapter directory (a run's, or one shared)
    trained = adapter_run_config(run_dir) if adapter else saved_config(run_dir)
    check_same_model(trained, list(overrides))
    cfg = apply_overrides(trained, list(overrides))
    check_overridden_values(cfg, trained)
    check_targets(cfg, trained, run_dir)
    if trainer:
        check_accelerator(cfg, instead=ON_THE_CPU)
    path = run_dir if adapter else Path(ckpt_path).expanduser() if ckpt_path else run_dir / "checkpoints" / FINAL
    if not adapter and not path.is_file():
        raise InputError(
            f"{path} not found. Runs write checkpoints/{FINAL} after training when they keep checkpoints "
            "(callbacks=default); a run trained with callbacks=none cannot be evaluated again. ckpt_path=<file> "
            "evaluates another checkpoint (e.g. checkpoints/last.ckpt: the model at its last epoch end, before "
            "after_fit and before a sequential deep ensemble's last round was stored)"
        )
    checkpoint = None if adapter else read_checkpoint(path)
    pl.seed_everything(int(cfg.seed), workers=True)  # as in training: random backbones rebuild the same
    backbone, datamodule, method, module = rebuilt(cfg, run_dir)
    if cfg.dataset != trained.dataset:
        trained_classes = instantiate(trained.dataset).num_classes
        if trained_classes != datamodule.num_classes:
            raise InputError(
                f"dataset {cfg.dataset.name} has {datamodule.num_classes} classes; the run was "
                f"trained on {trained.dataset.name} with {trained_classes}"
            )
    check_same_classes(datamodule, trained_class_names(run_dir, adapter), trained.dataset.name)
    datamodule.setup()  # every data file is read and checked before the model runs
    if adapter:  # the base as the config builds it, checked against the adapter's fingerprint
        adapter_files.check_fingerprint(adapter_files.read_config(run_dir), method.base_fingerprint, run_dir)
        adapter_files.load_trained_state(method, run_dir)
    else:
        try:
            module.on_load_checkpoint(checkpoint)  # the frozen part: checked against the fingerprints, then filled in
        except CheckpointMismatch as err:
            raise InputError(
                f"{path} does not fit the model rebuilt for this evaluation: {err.detail}; "
                f"{mismatch_cause(cfg, trained, run_dir)}"
            ) from None
        module.load_state_dict(checkpoint["state_dict"])
    return cfg, path, module, datamodule


def evaluate_run(
    run_dir: str | Path,
    overrides: list[str] = (),
    name: str | None = None,
    ckpt_path: str | Path | None = None,
    update_results: bool = False,
    refit_temperature: bool = False,
) -> dict:
    """Evaluates a trained run again; returns the record written to ``evaluations/<name>.json``. On other data
    than the run's own (a shift), ``test/ts_*`` keep the run's temperature (``run_temperature``);
    ``refit_temperature`` adds ``test/refit_ts_*`` of one refitted on the evaluated data's validation labels."""
    run_dir = Path(run_dir).expanduser()
    adapter = (run_dir / adapter_files.CONFIG).is_file()
    trained = adapter_run_config(run_dir) if adapter else saved_config(run_dir)
    check_writable(run_dir, "run_dir", hint="copy the run directory somewhere writable and pass run_dir=<the copy>")
    with claim(run_dir):
        cfg, path, module, datamodule = load_run(run_dir, overrides, ckpt_path)
        if update_results:
            check_same_data(cfg, trained)
        name = name or str(cfg.dataset.name)
        trainer = make_trainer(cfg, logger=False, callbacks=[])
        datamodule.distribute(trainer.world_size, trainer.global_rank)
        datamodule.order_seed = int(cfg.seed)
        save_to = PREDICTIONS if update_results else f"{EVALUATIONS}/{name}/{PREDICTIONS}"
        temperature = {"refit_on": str(cfg.dataset.name) if refit_temperature else None}
        if not same_data(cfg, trained):  # a shift: its labels are not the deployed model's to calibrate on
            run_t = run_temperature(run_dir, adapter)
            temperature.update(temperature=run_t, temperature_from=IN_DISTRIBUTION if run_t else None)
        with stopped_by_sigterm(f"evaluation of {run_dir}"):
            evaluation = evaluate(
                trainer,
                module,
                datamodule,
                run_dir,
                int(cfg.seed),
                save_to=save_to,
                **prediction_options(cfg),
                **temperature,
            )
        record = results_record(
            {
                "name": name,
                "method": cfg.method.name,
                "dataset": cfg.dataset.name,
                "trained_on": trained.dataset.name,
                "checkpoint": str(path),
                "overrides": list(overrides),
                "aggregate": cfg.aggregate,
                **evaluation,
            },
            OmegaConf.to_container(cfg, resolve=True),
            git_commit(),
        )
        if trainer.is_global_zero:
            write_json(run_dir / EVALUATIONS / f"{name}.json", record)
            if update_results:
                merge_into_results(run_dir / "results.json", record)
            figure_dir = run_dir if update_results else run_dir / EVALUATIONS / name
            figures = run_severity_figure(record, figure_dir) + run_shifted_figure(record, figure_dir)
            print(summary(record, run_dir, update_results, figures))
    return record


def run_temperature(run_dir: Path, adapter: bool) -> float | None:
    """The temperature the run fitted on its own (in-distribution) validation split: results.json's
    ``test/temperature`` (the run's, or, for ``<run dir>/adapter``, its run's), else an adapter's recorded
    calibration (``Ensemble.calibrate``); None when neither records one."""
    results = (run_dir.parent if adapter else run_dir) / "results.json"
    if results.is_file():
        found = read_results(results).get("metrics", {}).get("test/temperature")
        if found is not None:
            return float(found)
    if adapter:
        return (adapter_files.read_config(run_dir).get("calibration") or {}).get("temperature")
    return None


# Dataset keys that leave the run's own splits as they were: where the files are, how they are batched and
# read, and the shifted and OOD sets evaluated beside the clean test split.
def merge_into_results(path: Path, record: dict) -> None:
    """results.json with its evaluation keys replaced by ``record``'s (asked for with update_results=true)."""
    results = read_results(path) if path.exists() else {}
    for key in EVALUATION_KEYS:
        results.pop(key, None)
        if key in record:
            results[key] = record[key]
    results["evaluated_by"] = {k: record[k] for k in ("name", "checkpoint", "overrides", "command", "git_commit")}
    write_json(path, results)


def summary(record: dict, run_dir: Path, update_results: bool, figures: list[Path] = ()) -> str:
    m = record["metrics"]
    lines = [
        f"evaluated {record['method']} (trained on {record['trained_on']}) on {record['dataset']}: "
        f"{record['num_members']} members, acc {100 * m['test/acc']:.2f}%, ece {100 * m['test/ece']:.2f}%, "
        f"nll {m['test/nll']:.4f}"
    ]
    if "shift" in record:
        by_severity = record["shift"]["by_severity"]
        lines.append(
            "shift, acc by severity: " + ", ".join(f"{s}: {100 * v['acc']:.2f}%" for s, v in by_severity.items())
        )
    for name, m in ((record.get("shifted") or {}).get("sets") or {}).items():
        lines.append(
            f"{name}: acc {100 * m['acc']:.2f}%, ece {100 * m['ece']:.2f}%, nll {m['nll']:.4f}, "
            f"mutual information {m['mutual_information']:.4f}, disagreement {m['disagreement']:.4f}"
        )
    lines.append(
        f"written: {run_dir / EVALUATIONS / (record['name'] + '.json')}"
        + (" and results.json (update_results=true)" if update_results else "")
        + "".join(f", {path}" for path in figures)
    )
    return "\n".join(lines)
