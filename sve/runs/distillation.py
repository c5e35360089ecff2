"""``sve-distill run_dir=<trained ensemble run> [objective=mean|dirichlet] [student=svf] [key=value ...]``: one
network trained to answer as a trained ensemble does, then evaluated as every run is (the run directory may
also come first without ``run_dir=``).

The teacher is the run's trained model (rebuilt and loaded as ``sve-eval`` does). The student is the same
backbone with a one-member method (``student``: an option of ``configs/method``, ``svf`` by default; any
method with one member works, e.g. ``single_lora``), built from the teacher's config, trained with a plain
loop (``sve.training.distill.distill``) on the teacher's member logits for the training inputs, both seeing
the same augmented batches. The objectives are those of ``sve.training.distill``: ``mean`` (KL to the
members' mean probabilities) and ``dirichlet`` (EnD^2: the student's logits are the log concentrations of a
Dirichlet fitted to the members' probabilities).

Evaluation runs the standard evaluator on the student: the ``mean`` student as its one member; the
``dirichlet`` student as ``samples`` draws from its Dirichlet (in the member layout, as MC dropout's
samples), so its mutual information and OOD scores come out of the same code as every ensemble's. The
closed-form uncertainty of the Dirichlet is in ``sve.training.distill.dirichlet_uncertainty``.

Options (beside ``key=value`` overrides of the student's config, e.g. ``method.lr=1e-3``): ``epochs`` (default:
the teacher's ``trainer.max_epochs``), ``lr`` (default: the student method's ``lr``, else the recipe's),
``samples`` (32), ``smoothing`` (1e-4), ``out`` (default ``<run_dir>/distilled/<objective>_<student>``),
``unlabeled`` (0): that many more inputs of the training split, beyond the run's subset (``dataset.train_size``),
on which the student also learns the teacher's answers. Their labels are never read (the objectives use the
teacher's logits only), so they stand for unlabeled data; they are the next ones of the same seeded
permutation that chose the subset, so they never include a labelled input, and the validation and test
splits are separate splits.

Output in ``out``: ``results.json`` (the evaluator's metrics, the objective, the loss per epoch, the teacher's
run, and the cost of each: parameters and milliseconds per test batch, measured in one process), the
student's ``adapter/`` and its predictions.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytorch_lightning as pl
import torch
from omegaconf import OmegaConf
from torch import Tensor, nn

from sve.api.adapter_files import ADAPTER, write_adapter
from sve.errors import InputError
from sve.members import to_device
from sve.runs.eval_config import apply_overrides
from sve.runs.evaluation import evaluate
from sve.runs.reevaluate import ON_THE_CPU, load_run
from sve.runs.results import git_commit, results_record, write_json
from sve.runs.run import build, make_trainer, prediction_options, run_config
from sve.runs.validate import check_accelerator
from sve.training.distill import dirichlet_samples, distill
from sve.training.loops import stopped_by_sigterm

log = logging.getLogger(__name__)

OPTIONS = {
    "run_dir": None,
    "objective": "mean",
    "student": "svf",
    "epochs": None,
    "lr": None,
    "samples": "32",
    "smoothing": "1e-4",
    "out": None,
    "unlabeled": "0",
}
COST_BATCHES = 8  # test batches timed for the inference cost of teacher and student


class DirichletStudent(nn.Module):
    """The student method read as a Dirichlet: in training its logits (log alpha), in evaluation ``samples``
    draws from Dir(alpha) as member log-probabilities (S, B, C). Everything else is the method's."""

    def __init__(self, method: nn.Module, samples: int, seed: int):
        super().__init__()
        self.method, self.samples, self.seed, self.calls = method, samples, seed, 0

    def forward(self, batch: dict) -> Tensor:
        logits = self.method(batch)
        if self.training:
            return logits
        self.calls += 1  # every batch its own draws, the same on every evaluation of the same loader order
        return dirichlet_samples(logits[0], self.samples, seed=self.seed * 1_000_003 + self.calls)

    def num_members(self) -> int:
        return 1 if self.training else self.samples

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("method"), name)


def with_unlabeled(data, count: int) -> dict[str, int]:
    """Adds ``count`` training inputs beyond the data module's training subset to its training split (after
    ``setup``): the subset is the first ``train_size`` of a seeded permutation (``seeded_order``), these are
    the next ``count``. Returns the counts. An ``InputError`` when the split has fewer inputs to spare."""
    from torch.utils.data import Subset

    from sve.data.checks import seeded_order

    full = data.load_splits()["train"]
    size, n = data.sizes["train"], len(full)
    spare = 0 if size is None else max(n - size, 0)
    if count > spare:
        raise InputError(
            f"unlabeled={count}: the training split has {spare} inputs beyond the {min(size or n, n)} "
            "the run trains on (dataset.train_size)" + ("; choose at most that many" if spare else "")
        )
    indices = seeded_order(n, data.subset_seed)[: size + count]
    data.verify_selected({"train": (full, indices[size:])})  # e.g. decodes the added images once
    data.splits["train"] = Subset(full, indices)
    return {"labelled": size, "unlabeled": count}


@torch.no_grad()
def ms_per_batch(model: nn.Module, batches: list[dict]) -> float:
    """Mean wall-clock milliseconds of ``model`` on ``batches`` in evaluation mode, after one warm-up batch."""
    model.eval()
    model(batches[0])
    start = time.perf_counter()
    for batch in batches:
        model(batch)
    return 1000 * (time.perf_counter() - start) / len(batches)


def distill_run(options: dict, overrides: list[str]) -> dict:
    """Distils the run ``options["run_dir"]`` into a student (the keys of ``OPTIONS``, checked and typed by
    ``sve.cli.distill.parse``) with the config ``overrides``; returns the student's results record."""
    run_dir = Path(options["run_dir"]).expanduser()
    teacher_cfg, _, teacher_module, _ = load_run(run_dir, trainer=False)  # the teacher only predicts
    teacher = teacher_module.method.eval()
    if options["objective"] == "dirichlet" and teacher.num_members() < 2:  # one probability vector: no spread to fit
        raise InputError(
            f"objective=dirichlet fits a Dirichlet to the spread of the teacher's members and needs at "
            f"least 2; run_dir={run_dir} (method={teacher_cfg.method.name}) predicts with "
            f"{teacher.num_members()} member(s); use objective=mean, or distil an ensemble's run"
        )
    student_cfg = apply_overrides(teacher_cfg, [f"method={options['student']}", "ensemble_size=1", *overrides])
    check_accelerator(student_cfg, instead=ON_THE_CPU)  # the student is evaluated by a trainer of this config
    out = Path(options["out"] or run_dir / "distilled" / f"{options['objective']}_{options['student']}").expanduser()
    if (out / "results.json").exists():  # another distillation's record, metrics and weights: never overwritten
        raise InputError(
            f"{out} already holds a distilled student ({out / 'results.json'}); give another out=<dir>, "
            "or delete that directory to distill again"
        )
    student_cfg.paths.output_dir = str(out)
    pl.seed_everything(int(student_cfg.seed), workers=True)
    _, student_data, student, student_module = build(student_cfg)
    if student.num_members() != 1:
        raise InputError(
            f"student={options['student']} has {student.num_members()} members; a student has one "
            "(svf, single, single_lora, ...)"
        )
    student_data.setup()
    inputs = {"labelled": len(student_data.splits["train"]), "unlabeled": 0}
    if options["unlabeled"]:
        inputs = with_unlabeled(student_data, options["unlabeled"])
    epochs = options["epochs"] or int(OmegaConf.select(teacher_cfg, "trainer.max_epochs", default=1) or 1)
    lr = options["lr"] or student.lr or float(student_cfg.optimizer.lr)
    optimizer = torch.optim.AdamW(
        student.parameter_groups(),
        lr=lr,  # a group naming its lr keeps it (sv_lr)
        weight_decay=float(student_cfg.optimizer.get("weight_decay", 0.0)),
    )
    # The loop runs where the run trained: a GPU when the trainer asks for one and there is one (the evaluation
    # below is Lightning's, which places the model itself).
    wants_gpu = str(OmegaConf.select(student_cfg, "trainer.accelerator", default="cpu")) in ("gpu", "cuda", "auto")
    device = torch.device("cuda") if wants_gpu and torch.cuda.is_available() else torch.device("cpu")
    teacher.to(device)
    student.to(device)
    log.info(
        "distilling %s (%d members) into %s by %s for %d epochs at lr %g on %s, on %d labelled and %d further "
        "training inputs",
        teacher_cfg.method.name,
        teacher.num_members(),
        options["student"],
        options["objective"],
        epochs,
        lr,
        device,
        inputs["labelled"],
        inputs["unlabeled"],
    )
    start = time.perf_counter()
    losses = distill(
        student,
        teacher,
        student_data.train_dataloader(),
        options["objective"],
        optimizer,
        epochs,
        options["smoothing"],
        progress=lambda e, loss: log.info("epoch %d: loss %.4f", e, loss),
        device=device,
    )
    train_seconds = time.perf_counter() - start
    student.constrain_()
    evaluated = (
        DirichletStudent(student, options["samples"], int(student_cfg.seed))
        if options["objective"] == "dirichlet"
        else student
    )
    student_module.method = evaluated
    trainer = make_trainer(student_cfg, logger=False, callbacks=[])
    student_data.distribute(trainer.world_size, trainer.global_rank)
    student_data.order_seed = int(student_cfg.seed)
    with stopped_by_sigterm(f"distillation into {out}"):
        evaluation = evaluate(
            trainer, student_module, student_data, out, int(student_cfg.seed), **prediction_options(student_cfg)
        )
    batches = [to_device(b, device) for _, b in zip(range(COST_BATCHES), student_data.evaluation_loader("test"))]
    student.to(device)  # Lightning's evaluation may have moved the student back
    cost = {
        "teacher": {
            "members": teacher.num_members(),
            **teacher.parameter_counts(),
            "ms_per_test_batch": ms_per_batch(teacher, batches),
        },
        "student": {"members": 1, **student.parameter_counts(), "ms_per_test_batch": ms_per_batch(student, batches)},
        "batches_timed": len(batches),
    }
    cost["speedup"] = cost["teacher"]["ms_per_test_batch"] / cost["student"]["ms_per_test_batch"]
    # method, seed and experiment: what the table store reads (sve.paper.store.load_runs), so a
    # student written to run_dir(root, experiment, "distilled_<objective>", members, seed) is a table cell.
    fields = {
        "method": f"distilled_{options['objective']}",
        "seed": int(student_cfg.seed),
        "experiment": student_cfg.get("experiment_name"),
        "student": options["student"],
        "objective": options["objective"],
        "teacher_run": str(run_dir),
        "teacher_method": teacher_cfg.method.name,
        "teacher_members": teacher.num_members(),
        "epochs": epochs,
        "lr": lr,
        "losses": losses,
        "inputs": inputs,
        "train_seconds": train_seconds,
        "cost": cost,
        **evaluation,
    }
    record = results_record(fields, run_config(student_cfg), git_commit())
    write_json(out / "results.json", record)
    write_adapter(student, out / ADAPTER, {"config": run_config(student_cfg)})
    m = record["metrics"]
    print(
        f"distilled {teacher_cfg.method.name} ({teacher.num_members()} members) into {options['student']} by "
        f"{options['objective']}: acc {100 * m['test/acc']:.2f}%, ece {100 * m['test/ece']:.2f}%, nll "
        f"{m['test/nll']:.4f}; {cost['speedup']:.2f}x faster per test batch; written: {out / 'results.json'}"
    )
    return record
