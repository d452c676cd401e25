"""The ``schedlib`` command.

    schedlib schedule WORKLOAD --target h100 [--explain] [--emulate]
    schedlib carve WORKLOAD --target h100 --topk 10
    schedlib tune WORKLOAD --trials 64 --storage sqlite:///tune.db [--backend gpu|replay|estimate]
    schedlib compare --suite llm-decoder --target auto --out report/
    schedlib profiles [list|show NAME|detect]
    schedlib demo

WORKLOAD is ``kind:key=value,...`` (e.g. ``matmul:M=4096,N=4096,K=4096,dtype=float16,epilogue=bias_relu``;
``$M`` makes a symbolic size).  Bad arguments print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from schedlib.errors import SchedlibError


class UsageError(SchedlibError):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2, no usage dump
        raise UsageError(message)


def _profile(target: str) -> Any:
    from schedlib.hw import detect, resolve

    if target == "auto":
        from schedlib.runtime.gpu import gpu_available

        return detect() if gpu_available() else resolve("h100")
    return resolve(target)


def _workload(text: str) -> Any:
    from schedlib.suites import parse_workload

    return parse_workload(text)


def cmd_schedule(args: argparse.Namespace) -> int:
    import numpy as np

    from schedlib.report.demo import SYMBOLIC_DEFAULT, random_inputs
    from schedlib.rules import apply_default, explain, get_rule
    from schedlib.runtime.kernel import build

    spec = _workload(args.workload)
    func = spec.build()
    profile = _profile(args.target)
    if args.emulate:
        _check_emulator_size(func)  # before any output
    if args.config and not args.rule:
        raise UsageError("--config needs --rule NAME")
    if args.rule:
        config = _config(args.config) if args.config else None  # None: the rule's own default
        sch = get_rule(args.rule).apply(func, profile, config)
        if sch is None:
            raise UsageError(f"rule {args.rule} does not apply to {spec.text}")
    else:
        sch = apply_default(func, profile)
    print(f"rule: {sch.rule}  config: {json.dumps(sch.config)}")
    if args.explain:
        print(explain(func, profile))
    print("\n# trace\n" + (str(sch.trace) or "(empty)"))
    print("\n# loop nest\n" + str(sch))
    kernel = build(sch, profile)
    if not args.no_source:
        print("\n# CUDA (" + kernel.arch + ")\n" + kernel.source.split("end of the schedlib CUDA prelude ----\n")[-1])
    if args.emulate:
        from schedlib.ir.reference import run_reference

        inputs = random_inputs(func)
        ref = next(iter(run_reference(func, inputs).values())).astype(np.float64)
        got = kernel.run_cpu(*[inputs[n] for n in func.inputs], bounds_check=True)
        got = np.asarray(got[0] if isinstance(got, tuple) else got, dtype=np.float64)
        err = float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))
        sizes = ", ".join(f"{k}={v}" for k, v in zip(func.symbols, [SYMBOLIC_DEFAULT] * len(func.symbols)))
        print(f"\nemulator vs numpy{' at ' + sizes if sizes else ''}: max relative error {err:.2e}")
    return 0


def _config(text: str) -> dict[str, Any]:
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--config is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise UsageError(f"--config must be a JSON object of knob values, got {text!r}")
    return config


# The emulator runs every thread on the CPU: beyond this many elements in all buffers it takes hours.
EMULATE_LIMIT = 1 << 24


def _check_emulator_size(func: Any) -> None:
    from schedlib.report.demo import SYMBOLIC_DEFAULT

    total = 0
    for name in (*func.inputs, *func.outputs):
        n = 1
        for d in func.buffer(name).shape:
            n *= int(getattr(d, "value", SYMBOLIC_DEFAULT))
        total += n
    if total > EMULATE_LIMIT:
        raise UsageError(f"--emulate: the buffers hold {total:,} elements, more than the CPU emulator's "
                         f"{EMULATE_LIMIT:,}; pass smaller sizes (the schedule is the same rule at any size)")


def cmd_carve(args: argparse.Namespace) -> int:
    import pandas as pd

    from schedlib.carver import carve

    df = carve(_workload(args.workload).build(), _profile(args.target), topk=args.topk)
    cols = [c for c in ("config", "est_time_us", "pct_of_peak", "reason") if c in df.columns]
    with pd.option_context("display.max_colwidth", 90, "display.width", 200):
        print(df[cols].to_string())
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from schedlib.search import tune

    kwargs: dict[str, Any] = {}
    if args.replay:
        kwargs["replay"] = args.replay
    res = tune(_workload(args.workload).build(), _profile(args.target), trials=args.trials, strategy=args.strategy,
               storage=args.storage, backend=args.backend, quiet=args.quiet, **kwargs)
    print(f"best: {res.best_time_us:.3g} us  config: {json.dumps(res.best_config)}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from schedlib.report import compare, write_report
    from schedlib.report.writers import prepare_out_dir
    from schedlib.suites import suite

    specs = [_workload(w) for w in args.workload] if args.workload else suite(args.suite)
    prepare_out_dir(args.out)
    df = compare(specs, _profile(args.target) if args.target != "auto" else "auto", methods=args.methods,
                 trials=args.trials, backend=args.backend)
    paths = write_report(df, args.out, histories=df.attrs.get("histories"))
    print(df[["workload", "method", "time_us", "pct_roofline", "source"]].to_string(index=False))
    print(f"report written to {paths['html']}")
    return 0


def cmd_profiles(args: argparse.Namespace) -> int:
    from schedlib import hw

    if args.action == "list":
        for key in hw.list():
            p = hw.load(key)
            print(f"{key:10s} {p.name} (sm_{p.compute_capability.replace('.', '')}, {p.sm_count} SMs)")
    elif args.action == "show":
        if not args.name:
            raise UsageError("profiles show needs a NAME")
        print(json.dumps(hw.load(args.name).to_dict(), indent=2, default=str))
    else:
        print(json.dumps(hw.detect().to_dict(), indent=2, default=str))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from schedlib.report.demo import run_demo

    run_demo(args.target, args.out, trials=args.trials, limit=args.limit)
    return 0


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v} must be at least 1")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="schedlib", description="Schedule tensor computations into fast CUDA kernels.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    s = sub.add_parser("schedule", help="apply the rules and print trace, loop nest and CUDA")
    s.add_argument("workload")
    s.add_argument("--target", default="h100")
    s.add_argument("--explain", action="store_true", help="say which rule took it and why others declined")
    s.add_argument("--emulate", action="store_true", help="run on the CPU emulator against numpy")
    s.add_argument("--rule", help="use this rule instead of the dispatcher")
    s.add_argument("--config", help="a JSON config for --rule")
    s.add_argument("--no-source", action="store_true", help="do not print the CUDA source")
    s.set_defaults(fn=cmd_schedule)
    c = sub.add_parser("carve", help="rank configs with the analytical model (no GPU needed)")
    c.add_argument("workload")
    c.add_argument("--target", default="h100")
    c.add_argument("--topk", type=_positive, default=10)
    c.set_defaults(fn=cmd_carve)
    t = sub.add_parser("tune", help="search the knob space")
    t.add_argument("workload")
    t.add_argument("--target", default="h100")
    t.add_argument("--trials", type=_positive, default=64)
    t.add_argument("--strategy", default="tpe", choices=["tpe", "cmaes", "nsga2", "random", "grid", "evolutionary"])
    t.add_argument("--storage", default=None, help="Optuna storage URL or journal file (default: per-user cache)")
    t.add_argument("--backend", default="estimate", choices=["gpu", "replay", "estimate"])
    t.add_argument("--replay", help="recorded measurements for --backend replay")
    t.add_argument("--quiet", action="store_true")
    t.set_defaults(fn=cmd_tune)
    m = sub.add_parser("compare", help="compare rule, carver, search and the vendor library; write a report")
    m.add_argument("--suite", default="basic", help="llm-decoder, basic, or a .yaml/.json suite file")
    m.add_argument("--workload", action="append", help="a workload spec (repeatable; overrides --suite)")
    m.add_argument("--target", default="auto")
    m.add_argument("--out", default="report")
    m.add_argument("--methods", nargs="+", default=["rule", "carver", "search", "vendor"],
                   choices=["rule", "carver", "search", "vendor"])
    m.add_argument("--trials", type=_positive, default=16)
    m.add_argument("--backend", choices=["gpu", "estimate"], default=None)
    m.set_defaults(fn=cmd_compare)
    pr = sub.add_parser("profiles", help="list, show or detect hardware profiles")
    pr.add_argument("action", nargs="?", default="list", choices=["list", "show", "detect"])
    pr.add_argument("name", nargs="?")
    pr.set_defaults(fn=cmd_profiles)
    d = sub.add_parser("demo", help="the built-in suite end to end (the main job)")
    d.add_argument("--target", default="auto")
    d.add_argument("--out", default="schedlib-report")
    d.add_argument("--trials", type=_positive, default=12)
    d.add_argument("--limit", type=_positive, default=64, help="largest size verified on the CPU emulator")
    d.set_defaults(fn=cmd_demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return int(args.fn(args) or 0)
    except BrokenPipeError:  # output piped into a pager or head that closed early
        sys.stderr.close()
        return 0
    except (SchedlibError, ValueError, LookupError) as exc:
        # a KeyError's str() is its repr; show the message itself
        text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
        message = text.splitlines()[0] if text else type(exc).__name__
        print(f"schedlib: error: {message}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file or directory named on the command line (or in the environment)
        where = f": {exc.filename}" if exc.filename else ""
        print(f"schedlib: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("schedlib: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
