"""The ``schedlib`` command's argument parser and help texts (the commands themselves are in :mod:`schedlib.cli`)."""

from __future__ import annotations

import argparse
import inspect
import textwrap
from collections.abc import Callable, Mapping
from typing import NoReturn

from schedlib.errors import SchedlibError

Handler = Callable[[argparse.Namespace], int]


class UsageError(SchedlibError):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2, no usage dump
        raise UsageError(message)


def positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v} must be at least 1")
    return v


def workload_kinds() -> str:
    """One line per built-in workload kind: its parameters with their defaults."""
    from schedlib.workloads import BUILTINS

    lines = []
    for kind in sorted(BUILTINS):
        params = inspect.signature(BUILTINS[kind]).parameters.values()
        shown = ", ".join(f"{p.name}={_default(p.default)}" for p in params)
        lines += textwrap.wrap(shown, 100, initial_indent=f"  {kind:12s} ", subsequent_indent=" " * 15)
    return "\n".join(lines)


def _default(value: object) -> str:
    if isinstance(value, tuple):
        return ("+" if all(isinstance(v, str) for v in value) else "x").join(str(v) for v in value)
    return str(value)


def _kind_names() -> str:
    from schedlib.workloads import BUILTINS

    return ", ".join(sorted(BUILTINS))


WORKLOAD_HELP = ("what to schedule, as kind:key=value,... (e.g. matmul:M=4096,N=4096,K=4096,dtype=float16); "
                 "kinds: {kinds}; parameters left out take their defaults, listed below; $M makes a symbolic "
                 "size, shape=64x128 and chain=add+relu give tuples")
TARGET_HELP = ("hardware profile: a key or alias (see 'schedlib profiles list'), a .yaml/.json profile file, or "
               "'auto' for the GPU present (h100 without one); default: {}")
BACKEND_HELP = ("how a config's time is found: 'estimate' asks the carver's analytical model (no GPU; the default), "
                "'gpu' measures on the GPU (needs cupy), 'replay' looks configs up in --replay FILE (the default "
                "when --replay is given)")
CONFIG_HELP = ("JSON object of knob values for --rule, e.g. '{\"stages\": 1}'; knobs left out keep the rule's "
               "default for this workload and target (with tensor_core given: that template's default); "
               "'schedlib carve' shows full configs")


def build_parser(handlers: Mapping[str, Handler], version: str) -> argparse.ArgumentParser:
    """The parser; each subcommand's ``fn`` default is ``handlers[name]``."""
    kinds = _kind_names()
    epilog = "workload kinds and their parameters (defaults):\n" + workload_kinds()
    fmt = argparse.RawDescriptionHelpFormatter
    p = _Parser(prog="schedlib", description="Schedule tensor computations into fast CUDA kernels.")
    p.add_argument("--version", action="version", version=f"schedlib {version}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser,
                           help="one of the commands below; 'schedlib COMMAND --help' describes it")

    def command(name: str, help_text: str, *, workload: bool = True) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".",
                           epilog=epilog if workload else None, formatter_class=fmt)
        c.set_defaults(fn=handlers[name])
        if workload:
            c.add_argument("workload", metavar="WORKLOAD", help=WORKLOAD_HELP.format(kinds=kinds))
        return c

    s = command("schedule", "apply the rules and print trace, loop nest and CUDA")
    s.add_argument("--target", default="h100", help=TARGET_HELP.format("h100"))
    s.add_argument("--explain", action="store_true", help="say which rule took it and why others declined")
    s.add_argument("--emulate", action="store_true",
                   help="run the kernel on the CPU emulator and compare with numpy (slow: use small sizes)")
    s.add_argument("--rule", metavar="NAME", help="use this rule instead of the dispatcher's choice")
    s.add_argument("--config", metavar="JSON", help=CONFIG_HELP)
    s.add_argument("--no-source", action="store_true", help="do not print the CUDA source")
    c = command("carve", "rank configs with the analytical model (no GPU needed)")
    c.add_argument("--target", default="h100", help=TARGET_HELP.format("h100"))
    c.add_argument("--topk", type=positive, default=10, metavar="N", help="how many configs to show (default: 10)")
    c.add_argument("--compiled", action="store_true",
                   help="compile the model's best max(2N, 8) configs and rank them again with the registers ptxas "
                        "allots (spilling ones last); shows registers and spills (needs nvcc or NVRTC, not a GPU)")
    t = command("tune", "search the knob space")
    t.add_argument("--target", default="h100", help=TARGET_HELP.format("h100"))
    t.add_argument("--trials", type=positive, default=64, metavar="N",
                   help="size the study should reach, counting trials recorded by earlier runs (default: 64)")
    t.add_argument("--strategy", default="tpe", choices=["tpe", "cmaes", "nsga2", "random", "grid", "evolutionary"],
                   help="search strategy (default: tpe)")
    t.add_argument("--storage", default=None, metavar="URL",
                   help="where the study is kept: an SQLite file, a journal file (.log or .journal), an "
                        "SQLAlchemy URL, or 'memory' (kept nowhere); default: an SQLite file in the per-user cache")
    # None: estimate, or replay when --replay is given (cli._tune_backend)
    t.add_argument("--backend", default=None, choices=["gpu", "replay", "estimate"], help=BACKEND_HELP)
    t.add_argument("--replay", metavar="FILE", help="recorded measurements (.json or .csv) for --backend replay")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    m = command("compare", "compare rule, carver, search and the vendor library; write a report", workload=False)
    m.epilog = epilog
    # None: basic; told apart from an explicit --suite, which --workload would otherwise drop unsaid
    m.add_argument("--suite", default=None,
                   help="llm-decoder, basic, or a .yaml/.json suite file (default: basic; not with --workload)")
    m.add_argument("--workload", action="append", metavar="WORKLOAD",
                   help="a workload spec, kind:key=value,... (repeatable; replaces --suite); kinds: " + kinds)
    m.add_argument("--target", default="auto", help=TARGET_HELP.format("auto"))
    m.add_argument("--out", default="report", metavar="DIR",
                   help="directory for report.html, report.md and report.csv (default: report)")
    m.add_argument("--methods", nargs="+", default=["rule", "carver", "search", "vendor"],
                   choices=["rule", "carver", "search", "vendor"], help="methods to compare (default: all four)")
    m.add_argument("--trials", type=positive, default=16, metavar="N",
                   help="search trials per workload (default: 16)")
    m.add_argument("--backend", choices=["gpu", "estimate"], default=None,
                   help="'gpu' measures (needs cupy), 'estimate' uses the carver's model "
                        "(default: gpu when one is present, else estimate)")
    m.add_argument("--quiet", action="store_true", help="no progress line per workload on stderr")
    pr = command("profiles", "list, show or detect hardware profiles", workload=False)
    pr.add_argument("action", nargs="?", default="list", choices=["list", "show", "detect"],
                    help="list the known profiles (the default), show one as JSON, or detect the GPU present")
    pr.add_argument("name", nargs="?", metavar="NAME", help="the profile key, alias or file for 'show' (only)")
    d = command("demo", "run the built-in suite end to end: verify, compare and write a report", workload=False)
    d.add_argument("--target", default="auto", help=TARGET_HELP.format("auto"))
    d.add_argument("--out", default="schedlib-report", metavar="DIR",
                   help="directory for the report (default: schedlib-report)")
    d.add_argument("--trials", type=positive, default=12, metavar="N",
                   help="search trials per workload (default: 12)")
    d.add_argument("--limit", type=positive, default=64, metavar="N",
                   help="largest size of the verification step, on the GPU or the CPU emulator alike "
                        "(default: 64); the timings use the full sizes")
    return p
