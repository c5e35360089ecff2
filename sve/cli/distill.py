"""``sve-distill run_dir=<trained ensemble run> [objective=mean|dirichlet] [student=svf] [key=value ...]``: a
trained ensemble distilled into one network and evaluated (``sve.runs.distillation``)."""

import sys

from sve.errors import one_line_errors


def main() -> None:
    if not sys.argv[1:] or sys.argv[1] in ("-h", "--help"):
        from sve.cli.configs import groups, module_doc  # the usage without importing torch: it answers at once

        print(module_doc("sve.runs.distillation").replace("``", ""))
        print(f"\nstudent=<option of configs/method>: {', '.join(groups()['method'])}")
        sys.exit(0 if sys.argv[1:] else 2)
    from sve.cli.quiet import hide_noise

    hide_noise()
    with one_line_errors():  # a user error is one line (SVE_DEBUG=1: the traceback)
        from sve.runs.distillation import distill_run

        distill_run(sys.argv[1:])


if __name__ == "__main__":
    main()
