"""The `eks-dra` command.

Each subcommand lives in the module that owns its responsibility and exposes `configure(parser)` and
`run(args) -> int`. Modules are imported only when their subcommand runs, so `eks-dra plan` never pays
for importing the CDK.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys

from eks_dra.errors import UserError

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("eks_dra.planner.command_plan", "allocate ResourceClaims offline on simulated nodes"),
    "slices": ("eks_dra.planner.command_slices", "print the ResourceSlices our drivers publish on an instance type"),
    "fixture": ("eks_dra.drivers.fixture", "write a fake host tree (sysfs, /dev) of an instance type"),
    "preflight": ("eks_dra.preflight", "check an environment against the AWS account (boto3)"),
    "catalog": ("eks_dra.catalog.refresh", "show, check or refresh the instance catalog"),
}


def _load(name: str):
    module_name, _ = COMMANDS[name]
    return importlib.import_module(module_name)


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eks-dra", description="DRA-ready EKS clusters for accelerators")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == selected:
            _load(name).configure(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    selected = next((a for a in argv if not a.startswith("-")), None)
    if selected not in COMMANDS:
        selected = None
    parser = build_parser(selected)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(_load(args.command).run(args) or 0)
    except UserError as exc:
        print(f"eks-dra {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `eks-dra plan | head`: the reader is gone; end quietly, as a shell tool does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush of stdout must not fail again
        return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
