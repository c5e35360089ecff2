"""The result store of the paper's tables: table definitions (``sve/configs/tables/<name>.yaml``), the stable
directory of every run (``run_dir``), and the runs found under a store (``load_runs``, ``select``). The sweep
(``sve.paper.sweep``) needs only this, not the table builder (``sve.paper.report``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from sve.errors import InputError
from sve.paths import TABLES
from sve.paths import results_root as store_root
from sve.runs.results import UnreadableFile, read_results

log = logging.getLogger(__name__)

SMOKE = "smoke"  # results/smoke/: the CPU-sized variant of every target, never mixed into the real tables
MINI = "mini"  # the miniature's tables (configs/tables/mini_*.yaml) live under results/mini/, the rest under results/
TUNED = "tuned.json"  # a tuned row's choice, beside its seeds' run directories (sve.paper.sweep writes it)


# --- table definitions ---------------------------------------------------------------------------------


def table_names() -> list[str]:
    return sorted(p.stem for p in TABLES.glob("*.yaml"))


def is_definition_path(name: str) -> bool:
    """A table named by its file (``tables/mine.yaml``): a definition of one's own project, which need not be
    written into the installed package's ``configs/tables/``."""
    return name.endswith((".yaml", ".yml"))


def is_table(name: str) -> bool:
    return name in table_names() or is_definition_path(name)


def definition_path(name: str) -> Path:
    return Path(name) if is_definition_path(name) else TABLES / f"{name}.yaml"


def load_spec(name: str, smoke: bool = False) -> DictConfig:
    """``configs/tables/<name>.yaml``, or the definition file ``name`` names (``*.yaml``, resolved against the
    current directory); with ``smoke`` its ``smoke`` block replaces the keys it names."""
    path = definition_path(name)
    if not path.is_file():
        if is_definition_path(name):
            raise InputError(
                f"no table definition {path} (resolved from {Path.cwd()}): name an existing .yaml "
                f"file, or one of the shipped tables {table_names()}"
            )
        raise InputError(
            f"no table definition {path}: {name!r} is not a table; choose one of {table_names()}, "
            "or name your own definition file (<path>.yaml)"
        )
    spec = with_base(load_yaml(path), path)
    for key, value in (spec.get("smoke") or {}).items() if smoke else ():
        spec[key] = value  # replaced, not merged: a smoke block's experiments or rows are the whole list
    check_spec(spec, path)
    spec.name = path.stem  # outputs are named by the file's stem: tables/<stem>.md
    spec.source = str(path)  # files it names (paper:) are found beside it first
    return spec


def with_base(spec: DictConfig, path: Path, chain: tuple[Path, ...] = ()) -> DictConfig:
    """``spec`` over the file its ``base:`` names (relative to ``path``'s folder), so that tables of one setting
    state it once (``configs/tables/bases/``): a key ``spec`` sets replaces the base's, and so does a key of its
    ``smoke`` block within the base's ``smoke``. A base may have a base of its own."""
    name = spec.get("base")
    if name is None:
        return spec
    base_path = path.parent / str(name)
    if not isinstance(name, str) or not base_path.is_file():
        raise InputError(f"{path}: base: {name!r} is not a file beside it (expected e.g. bases/mini_cifar10.yaml)")
    if base_path.resolve() in chain:
        raise InputError(f"{path}: base: {name!r} leads back to itself")
    base = with_base(load_yaml(base_path), base_path, (*chain, path.resolve()))
    inherited = OmegaConf.to_container(base, resolve=False)
    own = OmegaConf.to_container(spec, resolve=False)
    del own["base"]
    merged = {**inherited, **own}
    if isinstance(inherited.get("smoke"), dict) and isinstance(own.get("smoke"), dict):
        merged["smoke"] = {**inherited["smoke"], **own["smoke"]}
    return OmegaConf.create(merged)


def load_yaml(path: Path) -> DictConfig:
    """``path`` as a config; a YAML syntax error is one line naming the file, the line and the parser's problem
    (the parser's own report is a 60-line traceback)."""
    import yaml

    try:
        loaded = OmegaConf.load(path)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = " ".join(str(getattr(err, "problem", None) or err).split())
        raise InputError(
            f"{where}: not valid YAML ({problem}); fix the file (the format of "
            "sve/configs/tables/*.yaml, docs/extending.md)"
        ) from None
    if not isinstance(loaded, DictConfig):
        raise InputError(
            f"{path}: expected a mapping of keys (kind:, experiments:, rows: ...), found a {type(loaded).__name__}"
        )
    return loaded


KINDS = ("metrics", "figure2", "figure3", "figureB", "cost", "conformal")
TUNE_KEYS = {"key": True, "grid": True, "metric": True, "seed": True, "per_decade": False, "extend": False}


def check_spec(spec: DictConfig, path: Path) -> None:
    """The keys the sweep and the builder read, checked when the definition is loaded: a definition of one's
    own with a typo would otherwise be a KeyError or TypeError from deep in the builder, after its runs trained."""
    from sve.paper.display import METRICS

    def bad(key: str, value, valid: str) -> InputError:
        return InputError(
            f"{path}: {key}: {value!r} is not valid; {valid} (the format of sve/configs/tables/*.yaml, "
            "docs/extending.md)"
        )

    if spec.get("kind") not in KINDS:
        raise bad("kind", spec.get("kind"), f"choose one of {list(KINDS)}")
    if spec.kind == "conformal":  # its experiments, rows and seeds are those of the tables it names
        names = spec.get("of")
        if not OmegaConf.is_list(names) or not names or not all(isinstance(n, str) for n in names):
            raise bad("of", names, "expected a list of the tables whose rows it shows, e.g. [mini_table2]")
        known = table_names()
        for name in names:
            if name not in known:
                raise bad("of", name, f"choose from {known}")
        if not OmegaConf.is_list(spec.get("metrics")) or not all(m in METRICS for m in spec.metrics):
            raise bad("metrics", spec.get("metrics"), f"expected a list; choose from {sorted(METRICS)}")
        return
    if spec.kind not in ("metrics", "figure2"):
        return  # the figures' and the cost table's own keys are read by their builders
    for key in ("experiments", "rows", "seeds", "metrics"):
        if key not in spec:
            raise InputError(f"{path}: no {key}: a {spec.kind} table needs experiments, rows, seeds and metrics")
    if not OmegaConf.is_dict(spec.experiments) or not spec.experiments:
        raise bad("experiments", spec.experiments, "expected a mapping {experiment: label}")
    if not OmegaConf.is_list(spec.seeds) or not all(isinstance(s, int) for s in spec.seeds):
        raise bad("seeds", spec.seeds, "expected a list of integers, e.g. [0, 1, 2]")
    for metric in spec.metrics if OmegaConf.is_list(spec.metrics) else [spec.metrics]:
        if metric not in METRICS:
            raise bad("metrics", metric, f"choose from {sorted(METRICS)}")
    for i, row in enumerate(spec.rows if OmegaConf.is_list(spec.rows) else [spec.rows]):
        if (
            not OmegaConf.is_dict(row)
            or not isinstance(row.get("method"), str)
            or not isinstance(row.get("members"), int)
        ):
            raise bad(f"rows[{i}]", row, "expected {method: <name>, members: <int>, overrides: [...]}")
    tunes = {"tune": spec.get("tune")}
    rows = spec.rows if OmegaConf.is_list(spec.rows) else [spec.rows]
    tunes.update({f"rows[{i}].tune": row.get("tune") for i, row in enumerate(rows)})
    for where, tune in tunes.items():
        if tune is None:
            continue
        if not OmegaConf.is_dict(tune):
            raise bad(where, tune, "expected {key: method.lr, grid: [...], metric: nll, seed: 0}")
        unknown = sorted(set(tune) - set(TUNE_KEYS))
        missing = sorted(k for k, needed in TUNE_KEYS.items() if needed and k not in tune)
        if unknown or missing:
            raise InputError(
                f"{path}: {where}: {'unknown ' + str(unknown) if unknown else ''}"
                f"{'; ' if unknown and missing else ''}{'missing ' + str(missing) if missing else ''}; "
                f"its keys are {list(TUNE_KEYS)} (per_decade and extend optional)"
            )
        if tune.metric not in METRICS:
            raise bad(f"{where}.metric", tune.metric, f"choose from {sorted(METRICS)}")
    for i, row in enumerate(rows):
        knob = row.get("knob")
        if knob is None:
            continue
        if not spec.get("tune") and not row.get("tune"):
            raise bad(f"rows[{i}].knob", knob, "a knob is tuned at the row's tuned rate: give the table a tune block")
        if (
            not OmegaConf.is_dict(knob)
            or set(knob) != {"key", "grid"}
            or not OmegaConf.is_list(knob.grid)
            or len(knob.grid) < 2
        ):
            raise bad(f"rows[{i}].knob", knob, "expected {key: sigma_init, grid: [<the default>, <another>]}")


def results_root(smoke: bool = False, root: Path | None = None) -> Path:
    """The store (``root``, else ``$SVE_RESULTS``, else ``./results``), or its smoke store."""
    root = store_root(root)
    return root / SMOKE if smoke else root


def run_dir(root: Path, experiment: str, method: str, members: int, seed: int) -> Path:
    """The stable directory of one run: a rerun of a sweep finds it (sve.paper.sweep skips it when done)."""
    return root / "runs" / experiment / f"{method}_m{members}" / f"seed{seed}"


# --- runs ----------------------------------------------------------------------------------------------


@dataclass
class Run:
    path: Path
    experiment: str | None
    method: str
    members: int
    seed: int
    results: dict

    def metric(self, key: str) -> float | None:
        """A test metric, or failing that an entry of the run's ``cost`` (a distilled student's speed-up over
        its teacher, measured in one process: ``sve.runs.distillation``), or a split-conformal metric computed
        from the run's saved test predictive (``sve.paper.conformal_splits``)."""
        value = self.results.get("metrics", {}).get(f"test/{key}")
        if value is None:
            value = (self.results.get("cost") or {}).get(key)
        if value is None:
            from sve.paper import conformal_splits  # reads the run's files: imported only when asked for

            if key in conformal_splits.KEYS:
                value = conformal_splits.run_metric(self.path.parent, key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def members_of(results: dict) -> int:
    """Members or samples that produced the predictive (``sve.runs.results.migrate`` gives older files theirs)."""
    return int(results["num_members"])


_reported: set[Path] = set()  # unreadable result files this process has reported already


def first_report(path: Path) -> bool:
    """True the first time this process reports the unreadable file ``path`` (a sweep that reported a run's
    results.json as failed calls it too, so that the tables built after it do not say it again)."""
    key = Path(path).absolute()
    new = key not in _reported
    _reported.add(key)
    return new


# Runs trained again to check that they reproduce (scripts/mini_distill.py --retrain-teachers), beside runs/: the
# committed run is the table's cell, its copy is not.
TEACHERS = "teachers"
# Runs outside a table's protocol, each testing one explanation a README gives (make mini-diagnostics): a
# diagnostic's rate is not a grid point of its row, so it is never a cell.
DIAGNOSTICS = "diagnostics"


def load_runs(root: Path) -> list[Run]:
    """Every results.json under ``root`` (``root/smoke``, ``root/teachers`` and ``root/diagnostics`` excluded
    unless it is the root itself). A file that is not valid JSON (``sve.runs.results.read_results``) or lacks
    the keys of a run is skipped with a warning naming it and what to do (once per file and process); its cell
    stays empty and listed as missing."""
    runs = []
    root = Path(root)
    for path in sorted(root.rglob("results.json")):
        parts = path.relative_to(root).parts
        if parts[0] in (SMOKE, TEACHERS, DIAGNOSTICS) or "tune" in parts[:-1]:  # tuning runs: the chosen one
            continue  # is copied as seed 0
        try:
            results = read_results(path)
            if not isinstance(results.get("metrics"), dict):  # every cell reads it (Run.metric): say so here, once
                raise TypeError(f'its "metrics" is {type(results.get("metrics")).__name__}, not an object')
            runs.append(
                Run(path, results["experiment"], results["method"], members_of(results), int(results["seed"]), results)
            )
        except UnreadableFile as err:
            if first_report(path):
                log.warning("skipping a run: %s", err)
        except (ValueError, KeyError, TypeError) as err:
            if first_report(path):
                log.warning(
                    "skipping %s: not the results of a run (%s: %s); %s",
                    path,
                    type(err).__name__,
                    err,
                    "delete it (or its run directory) to run that run again",
                )
    return runs


def parse_row(text: str) -> tuple[str, int]:
    """A row named as ``method:members`` (``sve:4``) -> ("sve", 4); claims and ``tune_as`` name rows so."""
    method, _, members = str(text).partition(":")
    if not method or not members.isdigit():
        raise ValueError(f"row {text!r} must read method:members, e.g. sve:4")
    return method, int(members)


def select(runs: list[Run], experiment: str, method: str, members: int) -> dict[int, Run]:
    """The runs of one cell by seed; a seed found twice keeps the first path in sorted order."""
    found: dict[int, Run] = {}
    for run in runs:
        if (run.experiment, run.method, run.members) == (experiment, method, members):
            if run.seed in found:
                log.warning(
                    "seed %d of %s/%s/M=%d twice: using %s, not %s",
                    run.seed,
                    experiment,
                    method,
                    members,
                    found[run.seed].path,
                    run.path,
                )
                continue
            found[run.seed] = run
    return found
