"""``sve-distill run_dir=<trained ensemble run> [objective=mean|dirichlet] [student=svf] [key=value ...]``: a
trained ensemble distilled into one network and evaluated (``sve.runs.distillation``)."""

import sys

from sve.errors import InputError, one_line_errors


def parse(argv: list[str]) -> tuple[dict, list[str]]:
    """``sve-distill``'s own options (``OPTIONS`` of ``sve.runs.distillation``, typed and checked) and the
    overrides of the student's config."""
    from sve.cli.run_options import command_options
    from sve.runs.distillation import OPTIONS
    from sve.training.distill import check_objective

    options, overrides = command_options(argv, OPTIONS)
    if not options["run_dir"]:
        raise InputError(
            "a trained ensemble run's directory is required, first or as run_dir=<run dir> (sve-distill --help)"
        )
    check_objective(options["objective"])
    for key, kind in (("epochs", int), ("samples", int), ("lr", float), ("smoothing", float), ("unlabeled", int)):
        if options[key] is not None:
            try:
                options[key] = kind(options[key])
            except ValueError:
                expected = "an integer" if kind is int else "a number"
                raise InputError(f"{key}={options[key]!r} is not valid; expected {expected}") from None
            may_be_zero = key in ("smoothing", "unlabeled")
            if options[key] < 0 or (options[key] == 0 and not may_be_zero):
                raise InputError(
                    f"{key}={options[key]!r} is not valid; expected "
                    + ("a number >= 0" if may_be_zero else "a positive number")
                )
    return options, overrides


def distill(argv: list[str]) -> dict:
    """The command line ``argv`` run: ``sve.runs.distillation.distill_run``; the student's results record."""
    from sve.runs.distillation import distill_run

    return distill_run(*parse(argv))


def main() -> None:
    if not sys.argv[1:] or sys.argv[1] in ("-h", "--help"):
        from sve.cli.configs import groups, module_doc  # the usage without importing torch: it answers at once

        print(module_doc("sve.runs.distillation").replace("``", ""))
        print(f"\nstudent=<option of configs/method>: {', '.join(groups()['method'])}")
        sys.exit(0 if sys.argv[1:] else 2)
    from sve.cli.quiet import hide_noise

    hide_noise()
    with one_line_errors():  # a user error is one line (SVE_DEBUG=1: the traceback)
        distill(sys.argv[1:])


if __name__ == "__main__":
    main()
