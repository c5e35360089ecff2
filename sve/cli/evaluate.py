"""``sve-eval run_dir=<run dir> [dataset=<option>] [key=value ...]`` (``python evaluate.py ...`` in a
checkout): a trained run evaluated again from its checkpoint, without training (``sve.runs.reevaluate``)."""

# The command's own options (sve.runs.reevaluate.OPTIONS), one line each.
OPTIONS = {
    "run_dir": "the trained run's directory (or its adapter/ directory); may also come first, without run_dir=",
    "name": "the evaluation's name: evaluations/<name>.json (default: the evaluated dataset's name)",
    "ckpt_path": "another checkpoint of the run (default: checkpoints/final.ckpt)",
    "update_results": "true: replace the evaluation keys of the run's results.json (default false)",
    "refit_temperature": "true: on other data, also test/refit_ts_* with T refitted on its val labels (default false)",
}
# What the trained model and its training are made of (an evaluation cannot swap these groups), and what an
# evaluation does not read (no optimiser, no logger, no callbacks).
FIXED_GROUPS = ("method", "backbone", "experiment", "recipe")
NOT_READ = ("optimizer", "scheduler", "logger", "callbacks", "hydra/launcher")


def usage() -> str:
    from sve.cli.configs import groups_help, module_doc

    usage_line = module_doc("sve.runs.reevaluate").split("\n\n")[1].replace("``", "")
    usage_line = usage_line.replace("python evaluate.py", "sve-eval")
    options = "\n".join(f"  {key}=...{' ' * (16 - len(key))}{text}" for key, text in OPTIONS.items())
    return f"""usage: {usage_line}

{__doc__.split(": ", 1)[1].replace("``", "")}

Options:
{options}

Config groups an evaluation may swap (group=option; the default is the trained run's own); {", ".join(FIXED_GROUPS)}
stay the trained run's:
{groups_help(leave_out=FIXED_GROUPS + NOT_READ, with_defaults=False)}

Any other key=value overrides the run's config for the evaluation (dataset.root=DIR, dataset.corruptions=all,
trainer.accelerator=cpu); +key=value adds a key, ~key removes one; --config-dir DIR adds your own config folder.
SVE_VERBOSE=1 keeps the notices of the libraries that are hidden by default; SVE_DEBUG=1 shows the traceback of
an error. More: the docstring of sve/runs/reevaluate.py."""


def evaluate(argv: list[str]) -> int:
    """``sve-eval``'s arguments: its own options (``OPTIONS`` of ``sve.runs.reevaluate``) and the overrides of the
    run's config, then ``sve.runs.reevaluate.evaluate_run``."""
    from sve.cli.configs import module_doc
    from sve.cli.run_options import command_options
    from sve.errors import InputError
    from sve.runs.reevaluate import OPTIONS, evaluate_run

    options, overrides = command_options(argv, OPTIONS)
    if not options["run_dir"]:
        print(module_doc("sve.runs.reevaluate").split("\n\n")[1])
        if argv:  # arguments, but none says which run: name the one that was needed
            raise InputError(f"no run directory among the arguments {argv}; give it first or as run_dir=<run dir>")
        return 2
    if options["update_results"] not in ("true", "false"):
        raise InputError(f"update_results={options['update_results']!r} is not valid; expected true or false")
    if options["refit_temperature"] not in ("true", "false"):
        raise InputError(f"refit_temperature={options['refit_temperature']!r} is not valid; expected true or false")
    evaluate_run(
        options["run_dir"],
        overrides,
        options["name"] or None,
        options["ckpt_path"] or None,
        options["update_results"] == "true",
        options["refit_temperature"] == "true",
    )
    return 0


def main() -> None:
    from sve.cli.run_options import run_command

    run_command(usage, evaluate)


if __name__ == "__main__":
    main()
