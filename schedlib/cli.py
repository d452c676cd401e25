"""The ``schedlib`` command.

    schedlib schedule WORKLOAD --target h100 [--explain] [--emulate]
    schedlib carve WORKLOAD --target h100 --topk 10 [--compiled]
    schedlib tune WORKLOAD --trials 64 --storage sqlite:///tune.db [--backend gpu|estimate] [--replay FILE]
    schedlib compare --suite llm-decoder --target auto --out report/
    schedlib profiles [list|show NAME|detect]
    schedlib demo

WORKLOAD is ``kind:key=value,...`` (e.g. ``matmul:M=4096,N=4096,K=4096,dtype=float16,epilogue=bias_relu``;
``$M`` makes a symbolic size).  Errors print ``schedlib: error: MESSAGE`` (one line for bad arguments; the lines
after the first indented) and exit with status 2; notes and warnings go to stderr as ``schedlib: note: ...``
and ``schedlib: warning: ...``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from schedlib import cli_args, cli_output
from schedlib.cli_args import UsageError
from schedlib.cli_emulate import check_emulator_size as _check_emulator_size
from schedlib.cli_emulate import emulation_note as _emulation_note
from schedlib.cli_output import compare_table, foreign_error, library_messages, lines, no_best, not_no_best, note
from schedlib.cli_runs import CompileProgress, removed_if_stopped
from schedlib.errors import SchedlibError
from schedlib.hw import is_auto

__all__ = ["UsageError", "build_parser", "main"]


def _gpu_problem() -> str | None:
    """Why measuring on the GPU is not possible here (None when it is)."""
    from schedlib.runtime.gpu import require_cupy

    try:
        require_cupy()
    except SchedlibError as exc:  # the library's message ends with an API hint: keep what it says is wrong
        return str(exc).split(";")[0]
    return None


def _require_gpu() -> None:
    """Before any work, the same message for every command asked to measure on a GPU that cannot be used."""
    problem = _gpu_problem()
    if problem is not None:
        raise UsageError(f"--backend gpu: {problem}; without a GPU pass --backend estimate (the carver's model)")


def _no_gpu_reason() -> str | None:
    import importlib.util

    return "cupy is not installed" if importlib.util.find_spec("cupy") is None else _gpu_problem()


def _fallback(reason: str) -> Any:
    """The profile ``--target auto`` uses without a GPU, with a note saying so."""
    from schedlib.hw import resolve

    profile = resolve("h100")
    note(f"--target auto: {reason}, so using the {profile.key} profile ({profile.name}); --target NAME picks another")
    return profile


def _profile(target: str) -> Any:
    from schedlib.hw import detect, resolve

    if is_auto(target):
        reason = _no_gpu_reason()
        return detect() if reason is None else _fallback(f"no GPU found ({reason})")
    return resolve(target)


def _workloads(text: str) -> list[Any]:
    """A workload string, or every workload of a YAML/JSON suite file."""
    from schedlib.suites import is_suite_file, load_suite_file, parse_workload

    if is_suite_file(text):
        return load_suite_file(text)
    return [parse_workload(text)]


def _workload(text: str) -> Any:
    """One workload: a string, or a suite file holding exactly one."""
    specs = _workloads(text)
    if len(specs) != 1:
        names = ", ".join(s.name for s in specs[:4]) + (", ..." if len(specs) > 4 else "")
        raise UsageError(f"suite file {text} holds {len(specs)} workloads ({names}); this command takes one: give "
                         f"its workload string, or run them all with schedlib compare --suite {text}")
    return specs[0]


def cmd_schedule(args: argparse.Namespace) -> int:
    import numpy as np

    from schedlib.report.demo import SYMBOLIC_DEFAULT, check_output, random_inputs
    from schedlib.rules import apply_default, explain, get_rule
    from schedlib.runtime.kernel import build

    spec = _workload(args.workload)
    func = spec.build()
    profile = _profile(args.target)
    if args.emulate:
        _check_emulator_size(func)  # before any output
        _emulation_note(spec, func)
    if args.config and not args.rule:
        raise UsageError("--config needs --rule NAME")
    if args.rule:
        rule = get_rule(args.rule)
        why = rule.applies(func, profile)
        if why is not None:
            raise UsageError(f"rule {args.rule} does not apply to {spec.text}: {why}")
        # None: the rule's own default; a partial --config is merged over that default
        config = _merged_config(rule, func, profile, _config(args.config)) if args.config else None
        sch = rule.apply(func, profile, config)
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
        # the demo's check: a wrong kernel must fail here as it does there
        err, tol, ok = check_output(func, got, ref)
        sizes = ", ".join(f"{k}={v}" for k, v in zip(func.symbols, [SYMBOLIC_DEFAULT] * len(func.symbols)))
        print(f"\nemulator vs numpy{' at ' + sizes if sizes else ''}: max relative error {err:.2e} "
              f"(tolerance {tol:.0e}): {'ok' if ok else 'MISMATCH'}")
        if not ok:  # a wrong kernel, not a usage error: status 1, as demo gives
            sys.stdout.flush()
            print(f"schedlib: error: --emulate: the kernel's result differs from numpy's (max relative error "
                  f"{err:.2e}, more than {tol:.0e})", file=sys.stderr)
            return 1
    return 0


def _config(text: str) -> dict[str, Any]:
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--config is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise UsageError(f"--config must be a JSON object of knob values, got {text!r}")
    return config


def _merged_config(rule: Any, func: Any, profile: Any, given: dict[str, Any]) -> dict[str, Any]:
    """``given`` over the rule's default for this workload and target, after checking its knob names."""
    names = list(rule.space(func, profile).names)
    unknown = [k for k in given if k not in names]
    if unknown:
        which = ", ".join(repr(k) for k in unknown)
        raise UsageError(f"--config: unknown knob{'s' if len(unknown) > 1 else ''} {which} for rule {rule.name}; "
                         f"its knobs are {', '.join(names)}")
    base = rule.default_config(func, profile)
    if "tensor_core" in given and hasattr(rule, "template_default"):  # that template's own default
        try:
            base = rule.template_default(func, profile, given["tensor_core"])
        except ValueError:  # not in this space: reported below
            pass
    merged = {**base, **given}
    problem = rule.space(func, profile).reason(merged)
    if problem is not None:
        raise UsageError(f"--config: {problem} (rule {rule.name} on {profile.key})")
    return merged


def cmd_carve(args: argparse.Namespace) -> int:
    import pandas as pd

    from schedlib.carver import carve
    from schedlib.report.legality import no_legal_config

    spec = _workload(args.workload)
    profile = _profile(args.target)
    resources = None
    if args.compiled:
        from schedlib.cache import cache_dir
        from schedlib.carver.compiled import pool_size
        from schedlib.runtime.resources import compiled_resources

        cache_dir("compile")  # an unusable cache is this one error, not a "did not compile" warning per config
        resources = CompileProgress(compiled_resources(profile), pool_size(args.topk))
        print(f"compiling the model's best {pool_size(args.topk)} configs for {profile.arch} (the next ones in place "
              "of any that fail) ...", file=sys.stderr, flush=True)
    try:
        df = carve(spec.build(), profile, topk=args.topk, resources=resources)
    finally:  # the progress line ends before the summary, an error or "interrupted"
        if resources is not None:
            resources.done()
    if args.compiled:
        c = df.attrs["compiled"]
        print(f"compiled {c['compiled']} configs for {c['arch']}: {c['spilling']} spill, {c['failed']} failed to "
              f"compile, {c['unlaunchable']} cannot launch with the compiled registers", file=sys.stderr)
    if df.empty:  # not "Empty DataFrame" and status 0: nothing here can run on this target
        raise SchedlibError(f"carve: {no_legal_config(df, spec.name)}")
    symbolic = df.attrs.get("symbolic") or {}
    if symbolic:  # the times hold at these sizes only; say them, as compare's shape column does
        print("ranked at " + ", ".join(f"{k}={v}" for k, v in symbolic.items())
              + " (the symbolic sizes' values for this ranking)")
    shown = ("config", "est_time_us", "pct_of_peak", *(("registers_per_thread", "model_registers", "spill_bytes")
                                                       if args.compiled else ()), "reason")
    cols = [c for c in shown if c in df.columns]
    with pd.option_context("display.max_colwidth", 90, "display.width", 240):
        print(df[cols].to_string())
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from schedlib.search import tune
    from schedlib.search.records import COUNTED

    backend = _tune_backend(args)
    func = _workload(args.workload).build()
    profile = _profile(args.target)
    if backend == "gpu":
        _require_gpu()
    # with no best, tune logs a line of its own; this command says it as its error, once
    search_log = logging.getLogger("schedlib.search")
    search_log.addFilter(not_no_best)
    try:
        res = tune(func, profile, trials=args.trials, strategy=args.strategy, storage=args.storage,
                   backend=backend, quiet=args.quiet, **({"replay": args.replay} if args.replay else {}))
    finally:
        search_log.removeFilter(not_no_best)
    if res.best_config is None:  # not "best: inf us ... config: null" with status 0
        print(f"schedlib: error: {no_best(res, func.name)}", file=sys.stderr)
        return 1
    # the label names the backend that ran: with --replay that is the recording, never the carver
    source = {"estimate": "estimated by the carver's model, not measured", "gpu": "measured on the GPU",
              "replay": f"replayed from {args.replay}"}[backend]
    if func.symbols and backend == "estimate":  # the model prices symbolic sizes at one value: say it, as carve does
        from schedlib.carver.problem import bind_symbolic
        sizes = ", ".join(f"{k}={v}" for k, v in bind_symbolic(func, None).items())
        print(f"estimated at {sizes} (the symbolic sizes' values for these times)")
    print(f"best: {res.best_time_us:.3g} us ({source})  config: {json.dumps(res.best_config)}")
    recorded = int(res.records["status"].isin(COUNTED).sum()) if len(res.records) else 0
    reused = max(recorded - res.measured_now, 0)
    counts = f"{res.measured_now} new config{'' if res.measured_now == 1 else 's'} measured"
    if reused:
        counts += f"; {reused} recorded trial{'' if reused == 1 else 's'} reused"
    if recorded < args.trials:  # the search stops early only when every legal config is recorded
        counts += f"; every legal config of the space is recorded ({recorded}), so more trials find nothing new"
    elif not res.measured_now:
        counts += f" (the study already holds --trials {args.trials}; raise --trials to search further)"
    print(counts)
    return 0


def _tune_backend(args: argparse.Namespace) -> str:
    """The backend ``tune`` runs: ``--replay FILE`` alone means replay; a backend that ignores the file, or replay
    without one, is refused before any work (the library would replay under an ``estimate`` label, or say
    ``backend='replay:<file>'``, which is no option of this command)."""
    if args.backend is None:
        return "replay" if args.replay else "estimate"
    if args.backend == "replay" and not args.replay:
        raise UsageError("--backend replay needs --replay FILE (recorded measurements, .json or .csv)")
    if args.backend != "replay" and args.replay:
        raise UsageError(f"--replay FILE goes with --backend replay (or no --backend), not --backend {args.backend}")
    return str(args.backend)


def _check_out(text: str) -> None:
    """Refuse ``--out ''`` before any work, as ``--storage ''`` is: an empty path means the current folder."""
    if not text.strip():
        raise UsageError(f"--out {text!r} is empty: give the folder for the report (e.g. --out report)")


def cmd_compare(args: argparse.Namespace) -> int:
    from schedlib.hw import resolve
    from schedlib.suites import suite

    _check_out(args.out)
    if args.workload and args.suite is not None:  # one would be dropped without a word
        raise UsageError(f"--suite {args.suite} and --workload: --workload replaces the suite, so give one or "
                         f"the other (to run both, list them all in one suite file)")
    specs = [s for w in args.workload for s in _workloads(w)] if args.workload else suite(args.suite or "basic")
    if args.backend == "gpu":
        _require_gpu()
    if set(args.methods) == {"vendor"} and (args.backend == "estimate" or _no_gpu_reason() is not None):
        raise UsageError("--methods vendor: the vendor library has no time without a GPU (the carver's model "
                         "estimates schedlib's kernels only); add rule, carver or search, or measure on a GPU")
    explicit = None if is_auto(args.target) else resolve(args.target)  # a bad --target creates no folder
    with removed_if_stopped(args.out):  # a run stopped before the report leaves no empty folder of its own
        return _compare(args, specs, explicit)


def _compare(args: argparse.Namespace, specs: list[Any], explicit: Any) -> int:
    from schedlib.report import compare, write_report
    from schedlib.report.writers import REPORT_FILES, prepare_out_dir

    prepare_out_dir(args.out, REPORT_FILES)  # before the note below: a bad --out is the whole answer
    if explicit is not None:
        profile = explicit
    elif args.backend == "estimate":  # as compare() does: estimates for "auto" use the h100 numbers
        profile = _fallback("--backend estimate does not look for the GPU")
    else:
        reason = _no_gpu_reason()
        profile = "auto" if reason is None else _fallback(f"no GPU found ({reason})")
    progress = None if args.quiet else (lambda text: print(f"schedlib: {text}", file=sys.stderr, flush=True))
    df = compare(specs, profile, methods=args.methods, trials=args.trials, backend=args.backend, progress=progress)
    paths = write_report(df, args.out, histories=df.attrs.get("histories"))
    print(compare_table(df))
    print(f"report written to {paths['html']}")
    return 0


def cmd_profiles(args: argparse.Namespace) -> int:
    from schedlib import hw

    if args.name and args.action != "show":  # silently ignoring it would look like it had been used
        raise UsageError(f"profiles {args.action} takes no NAME (got {args.name!r}); "
                         f"'schedlib profiles show NAME' shows one profile")
    if args.action == "list":
        for key in hw.list():
            p = hw.load(key)
            print(f"{key:10s} {p.name} (sm_{p.compute_capability.replace('.', '')}, {p.sm_count} SMs)")
    elif args.action == "show":
        if not args.name:
            raise UsageError("profiles show needs a NAME")
        print(json.dumps(hw.load(args.name).to_dict(), indent=2, default=str))
    else:
        reason = _no_gpu_reason()
        if reason is not None:  # not the library's hint, "pass properties=...", which no option here does
            raise UsageError(f"profiles detect: no GPU found ({reason}); 'schedlib profiles list' shows the "
                             "built-in profiles, and --target NAME picks one")
        print(json.dumps(hw.detect().to_dict(), indent=2, default=str))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from schedlib.report.demo import run_demo

    _check_out(args.out)
    with removed_if_stopped(args.out):  # a demo stopped before its report leaves no empty folder of its own
        run_demo(args.target, args.out, trials=args.trials, limit=args.limit)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from schedlib import __version__

    handlers = {"schedule": cmd_schedule, "carve": cmd_carve, "tune": cmd_tune, "compare": cmd_compare,
                "profiles": cmd_profiles, "demo": cmd_demo}
    return cli_args.build_parser(handlers, __version__)


def main(argv: Sequence[str] | None = None) -> int:
    with library_messages(), cli_output.reader_may_leave():
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    args = None
    try:
        args = build_parser().parse_args(argv)
        return int(args.fn(args) or 0)
    except BrokenPipeError:  # output piped into a pager or head that closed early
        sys.stderr.close()
        return 0
    except (SchedlibError, ValueError, LookupError) as exc:
        # a KeyError's str() is its repr; show the message itself
        text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
        print(lines("schedlib: error: ", text or type(exc).__name__), file=sys.stderr)
        return 2
    except OSError as exc:  # a file or directory named on the command line (or in the environment)
        where = f": {exc.filename}" if exc.filename else ""
        print(f"schedlib: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("schedlib: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # optuna's or the database's own errors; any other is a bug and keeps its traceback
        line = foreign_error(exc, getattr(args, "storage", None))
        if line is None:
            raise
        print(f"schedlib: error: {line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
