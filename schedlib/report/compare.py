"""``sl.report.compare``: rule, carver, search and the vendor library side by side, one row per
workload x method, as a flat pandas DataFrame.

With a GPU every time is *measured* (CUDA events, L2 flush, median of repetitions, correctness checked
against the vendor result first).  Without one, times come from the carver's model and every such row says
``source == "estimated"``; the vendor row then has no time.  The two are never mixed in one table.

A workload with symbolic sizes (``softmax:rows=$M,cols=1024``) is compared as the symbolic kernel it is, run
at the size the carver ranks it at (:data:`schedlib.carver.DEFAULT_SYMBOLIC_VALUE`, 4096), so its rows agree
with ``carve`` and ``tune``; the ``shape`` column says so (``X[Mx1024] at M=4096``).
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from schedlib.errors import ProfileError, SchedlibError
from schedlib.hw import HardwareProfile, is_auto, resolve
from schedlib.ir.func import Func
from schedlib.ir.schedule import Schedule
from schedlib.report.legality import no_legal_config, why_nothing_legal
from schedlib.report.stats import Work, work
from schedlib.report.timer import MethodTimer
from schedlib.runtime.gpu import gpu_available, require_cupy
from schedlib.suites import WorkloadSpec, as_specs

METHODS = ("rule", "carver", "search", "vendor")
COLUMNS = ["workload", "shape", "dtype", "method", "rule", "config", "time_us", "p20_us", "p80_us", "tflops",
           "gbs", "pct_roofline", "speedup_vs_vendor", "tuning_s", "trials", "measured", "source"]


def _shape(func: Func, symbols: Mapping[str, int]) -> str:
    """``A[1024x512] B[512x256]``; with symbolic sizes, the values they were run at: ``X[Mx1024] at M=4096``."""
    parts = []
    for name in func.inputs:
        buf = func.buffer(name)
        parts.append(f"{name}[{'x'.join(str(d) for d in buf.shape)}]")
    bound = ", ".join(f"{k}={v}" for k, v in symbols.items())
    return " ".join(parts) + (f" at {bound}" if bound else "")


def _symbols(func: Func) -> dict[str, int]:
    """The sizes a symbolic workload is compared at: the carver's, so that the rows match ``carve``/``tune``."""
    from schedlib.carver.problem import bind_symbolic

    return bind_symbolic(func, None)


def _peak(profile: HardwareProfile, dtype: str, ceilings: dict[str, float] | None
          ) -> tuple[float, float, str | None]:
    """(peak FLOP/s for the dtype's best unit, DRAM bytes/s, a note when that unit's peak is not known),
    measured ceilings taking precedence.

    A 16-bit workload is held to the tensor-core peak where the profile records one; where it does not (bf16
    on a T4 or V100, a profile derived for an unknown GPU), to the fp32 SIMT peak, the rate the carver models
    such kernels at: one workload without that entry must not cost the whole report."""
    c = ceilings or {}
    note = None
    if dtype in ("float16", "bfloat16"):
        flops = c.get("fp16_flops")
        if not flops:
            try:
                flops = profile.peak_flops(dtype, True)
            except ProfileError:
                flops = profile.peak_flops("float32", False)
                note = f"{dtype} against the fp32 SIMT peak ({profile.key} records no {dtype} tensor-core peak)"
    else:
        flops = c.get("fp32_flops") or profile.peak_flops("float32", False)
    return float(flops), float(c.get("bandwidth") or profile.dram_bytes_per_s), note


def compare(workloads: Iterable[Any], target: Any = "auto", methods: Sequence[str] = METHODS, *, topk: int = 5,
            trials: int = 16, strategy: str = "tpe", storage: str | None = None, backend: str | None = None,
            ceilings: dict[str, float] | None = None, quiet: bool = True,
            templates: Sequence[Any] = (), variants: Sequence[Mapping[str, Any]] = (),
            progress: Callable[[str], None] | None = None) -> pd.DataFrame:
    """One row per workload x method (``carver`` gives a top-1 and a best-of-top-k row).

    ``backend`` is ``"gpu"`` or ``"estimate"``; by default ``gpu`` when a device is visible.  ``templates``
    adds a ``rule[tensor_core=V]`` row per value V with that template's default, for workloads whose rule has
    it (the matmul's ``True`` = mma.sync next to Hopper's wgmma default, say).  ``variants`` adds a
    ``rule[knob=value]`` row per mapping of knob values: the rule default with those knobs changed (what one
    knob buys, side by side: ``{"stages": 1}`` for the fp32 matmul), for workloads whose rule space has the
    knobs and a default that differs.  A method that fails (a kernel
    that does not build, or computes a different result) gets a row with no time and ``source`` saying why;
    the other methods still run.  The search runs in a study of its own (``storage="memory"``), so that its
    row's ``trials`` and ``tuning_s`` are this comparison's; given a ``storage``, it resumes the study there
    and the row's ``source`` says how many of its trials this call ran.  ``progress``, when given, is called
    with one line before each workload (``"compare: workload 3/18: prefill.down_proj ..."``): a suite on the
    GPU runs for minutes.
    """
    workloads = [workloads] if isinstance(workloads, (str, WorkloadSpec, Func)) else list(workloads)
    # numpy integers (a count read from a DataFrame) are the ints they hold
    topk, trials = (int(v) if isinstance(v, numbers.Integral) and not isinstance(v, bool) else v
                    for v in (topk, trials))
    methods = (methods,) if isinstance(methods, str) else tuple(methods)
    _check_arguments(workloads, methods, topk, trials, strategy, backend, variants)
    methods = tuple(dict.fromkeys(methods))  # each once ("rule rule" on the command line), in order
    measured = (backend or ("gpu" if gpu_available() else "estimate")) == "gpu"
    if measured:
        require_cupy()  # before any work, with the install hint
    if set(methods) == {"vendor"} and not measured:  # every row would be "needs a GPU"
        raise ValueError("compare: methods=('vendor',) has no time without a GPU (the carver's model estimates "
                         "schedlib's kernels only); add 'rule', 'carver' or 'search', or measure on a GPU")
    auto = is_auto(target)
    profile = resolve("h100" if auto and not measured else target)
    timer = MethodTimer(profile, measured)
    rows: list[dict[str, Any]] = []
    histories: dict[str, list[float]] = {}
    peak_notes: list[str] = []  # said next to the roofline's source in the report
    built = [(item, item.build()) if isinstance(item, WorkloadSpec) else (None, item) for item in as_specs(workloads)]
    _check_variant_knobs([func for _, func in built], profile, variants)
    start = time.perf_counter()
    labels = _unique([spec.name if spec else func.name for spec, func in built])
    for i, ((spec, func), label) in enumerate(zip(built, labels), 1):
        if progress is not None:
            progress(f"compare: workload {i}/{len(built)}: {label} ({', '.join(methods)}; "
                     f"{time.perf_counter() - start:.0f} s so far)")
        symbols = _symbols(func)
        w = work(func, symbols)
        peak, bw, peak_note = _peak(profile, w.dtype, ceilings)
        if peak_note and peak_note not in peak_notes:
            peak_notes.append(peak_note)
        timer.prepare(func, spec, symbols)
        base = {"workload": label, "shape": _shape(func, symbols), "dtype": w.dtype}
        found = _run_methods(func, profile, methods, timer, topk, trials, strategy, storage, quiet, templates,
                             variants)
        for _method, info in found:
            if "history" in info:
                histories[label] = info.pop("history")
        vendor_us = None
        for method, info in found:
            row = {**base, "method": method, **info}
            rows.append(_finish(row, w, peak, bw, measured))
            if method == "vendor":
                vendor_us = row["time_us"]
        for row in rows:
            if row["workload"] == label:
                t = row["time_us"]
                row["speedup_vs_vendor"] = (vendor_us / t) if vendor_us and t == t and t else float("nan")
    df = pd.DataFrame(rows, columns=COLUMNS)
    roofline = "; ".join(["measured ceilings" if ceilings else f"profile {profile.key}", *peak_notes])
    df.attrs.update({"target": profile.key, "measured": measured, "histories": histories, "roofline": roofline})
    return df


def _unique(labels: list[str]) -> list[str]:
    """Labels as given, a repeated one numbered (``matmul``, ``matmul #2``): rows, charts and convergence
    curves are keyed by label, so two workloads must not share one."""
    out: list[str] = []
    for label in labels:
        n, name = 1, label
        while name in out:
            n += 1
            name = f"{label} #{n}"
        out.append(name)
    return out


def _check_arguments(workloads: list[Any], methods: tuple[Any, ...], topk: int, trials: int, strategy: str,
                     backend: str | None, variants: Sequence[Mapping[str, Any]] = ()) -> None:
    """Refuse bad arguments up front: a failure inside a method becomes a row, which would hide them."""
    from schedlib.search.strategies import STRATEGIES

    if not workloads:
        raise ValueError("compare: no workloads given")
    odd = [w for w in workloads if not isinstance(w, (str, WorkloadSpec, Func))]
    if odd:
        raise TypeError(f"compare: workloads must be spec strings, WorkloadSpecs or Funcs, got {odd[0]!r}")
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise ValueError(f"compare: unknown method(s) {bad}; choose from {METHODS}")
    for name, value in (("topk", topk), ("trials", trials)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"compare: {name}={value!r} must be a positive int")
    if strategy not in STRATEGIES:
        raise ValueError(f"compare: unknown strategy {strategy!r}; expected one of {list(STRATEGIES)}")
    if backend not in (None, "gpu", "estimate"):
        raise ValueError(f"compare: backend={backend!r} must be 'gpu', 'estimate' or None (gpu when present)")
    if isinstance(variants, Mapping) or not all(isinstance(v, Mapping) and v and all(isinstance(k, str) for k in v)
                                                for v in variants):
        raise ValueError(f"compare: variants must be a list of non-empty {{knob: value}} mappings, got {variants!r}")


def _check_variant_knobs(funcs: Sequence[Func], profile: HardwareProfile,
                         variants: Sequence[Mapping[str, Any]]) -> None:
    """A variant applies to the workloads whose rule space has its knobs; one that no workload's rule has
    (a misspelt knob) would silently add no row, so it is refused before any work."""
    if not variants:
        return
    from schedlib.rules import find_rule

    spaces: list[set[str]] = []
    for func in funcs:
        spaces.append(set(find_rule(func, profile).space(func, profile).names))
    names = set().union(*spaces)
    for variant in variants:
        unknown = sorted(set(variant) - names)
        if unknown:
            raise ValueError(f"compare: variant {dict(variant)!r}: no workload's rule has knob(s) {unknown}; "
                             f"their knobs are {sorted(names)}")
        if not any(set(variant) <= space for space in spaces):
            raise ValueError(f"compare: variant {dict(variant)!r}: no workload's rule has all of its knobs (they "
                             "come from different rules), so it would add no row")


def _finish(row: dict[str, Any], w: Work, peak: float, bw: float, measured: bool) -> dict[str, Any]:
    t = row.get("time_us", float("nan"))
    ok = t == t and t > 0
    row["tflops"] = w.flops / (t * 1e-6) / 1e12 if ok else float("nan")
    row["gbs"] = w.bytes / (t * 1e-6) / 1e9 if ok else float("nan")
    row["pct_roofline"] = 100 * w.roofline_s(peak, bw) / (t * 1e-6) if ok else float("nan")
    row["measured"] = measured and ok
    row.setdefault("source", "measured" if measured else "estimated")
    return row


def _timed(timer: MethodTimer, sch: Schedule, rule: Any, config: dict[str, Any]) -> dict[str, float]:
    t = timer.schedule(sch, rule, config)
    return {"time_us": t["median_us"], "p20_us": t["p20_us"], "p80_us": t["p80_us"]}


def _failed(exc: BaseException, cause: str | None = None) -> dict[str, Any]:
    """The timing columns of a failed row; ``source`` names the exception and, given, the ``cause`` behind it
    (a workload with no legal config on the target fails every method, each with a symptom of its own)."""
    nan = float("nan")
    text = " ".join(str(exc).split())
    said = f"{type(exc).__name__}: {text}" if text else f"{type(exc).__name__} (raised without a message)"
    if cause:
        said = cause if text == cause else f"{cause}; {said}"
    return {"time_us": nan, "p20_us": nan, "p80_us": nan, "source": f"failed: {said}"[:400]}


def _run_methods(func: Func, profile: HardwareProfile, methods: Sequence[str], timer: MethodTimer, topk: int,
                 trials: int, strategy: str, storage: str | None, quiet: bool, templates: Sequence[Any] = (),
                 variants: Sequence[Mapping[str, Any]] = ()) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    # the vendor first: its time survives a later kernel that takes the device down with it
    vendor = _vendor_row(timer) if "vendor" in methods else None
    causes: list[str | None] = []  # asked once per workload, and only when a method fails
    for method in ("rule", "carver", "search"):
        if method not in methods:
            continue
        try:
            out += _METHODS[method](func, profile, timer, topk, trials, strategy, storage, quiet)
        except Exception as exc:  # one failing method must not lose the others' rows
            if not causes:
                causes.append(why_nothing_legal(func, profile))
            out.append((method, {"rule": None, "config": None, "tuning_s": 0.0, "trials": 0,
                                 **_failed(exc, causes[0])}))
    for template in templates:
        out += _template_row(func, profile, timer, template)
    for variant in variants:
        out += _variant_row(func, profile, timer, variant)
    if vendor is not None:
        out.append(("vendor", vendor))
    return out


def _template_row(func: Func, profile: HardwareProfile, timer: MethodTimer, template: Any
                  ) -> list[tuple[str, dict[str, Any]]]:
    from schedlib.rules import find_rule

    rule = find_rule(func, profile)
    if not hasattr(rule, "template_default"):  # a rule with one template
        return []
    try:
        config = rule.template_default(func, profile, template)
    except ValueError:  # the template is not in this workload's space
        return []
    return _config_row(f"rule[tensor_core={template}]", func, profile, timer, rule, config)


def _variant_row(func: Func, profile: HardwareProfile, timer: MethodTimer, variant: Mapping[str, Any]
                 ) -> list[tuple[str, dict[str, Any]]]:
    from schedlib.rules import find_rule

    rule = find_rule(func, profile)
    space = rule.space(func, profile)
    default = rule.default_config(func, profile)
    config = {**default, **variant}
    if not set(variant) <= set(space.names) or config == default:  # another rule's knob, or the rule row itself
        return []
    name = "rule[" + ",".join(f"{k}={v}" for k, v in variant.items()) + "]"
    why = space.reason(config)
    if why is not None:
        nan = float("nan")
        return [(name, {"rule": rule.name, "config": config, "tuning_s": 0.0, "trials": 0, "time_us": nan,
                        "p20_us": nan, "p80_us": nan, "source": f"not in the space: {why}"})]
    return _config_row(name, func, profile, timer, rule, config)


def _config_row(name: str, func: Func, profile: HardwareProfile, timer: MethodTimer, rule: Any, config: dict[str, Any]
                ) -> list[tuple[str, dict[str, Any]]]:
    """One row timing ``rule`` at ``config`` (no tuning), or saying why it failed."""
    info = {"rule": rule.name, "config": config, "tuning_s": 0.0, "trials": 0}
    try:
        return [(name, {**info, **_timed(timer, rule.apply(func, profile, config), rule, config)})]
    except Exception as exc:
        return [(name, {**info, **_failed(exc)})]


def _vendor_row(timer: MethodTimer) -> dict[str, Any]:
    nan = float("nan")
    try:
        t = timer.vendor_time()
    except Exception as exc:
        return {"rule": None, "config": None, "tuning_s": 0.0, "trials": 0, **_failed(exc)}
    if t is None:
        return {"rule": None, "config": None, "time_us": nan, "p20_us": nan, "p80_us": nan, "tuning_s": 0.0,
                "trials": 0, "source": "needs a GPU" if not timer.measured else "no vendor equivalent"}
    return {"rule": None, "config": None, "time_us": t["median_us"], "p20_us": t["p20_us"], "p80_us": t["p80_us"],
            "tuning_s": 0.0, "trials": 0}


def _rule_rows(func: Func, profile: HardwareProfile, timer: MethodTimer, *_: Any) -> list[tuple[str, dict[str, Any]]]:
    from schedlib.rules import apply_default, get_rule

    t0 = time.perf_counter()
    sch = apply_default(func, profile)
    cost = time.perf_counter() - t0
    info = {"rule": sch.rule, "config": sch.config, "tuning_s": cost, "trials": 0}
    return [("rule", {**info, **_timed(timer, sch, get_rule(sch.rule), sch.config)})]


def _carver_rows(func: Func, profile: HardwareProfile, timer: MethodTimer, topk: int, *_: Any
                 ) -> list[tuple[str, dict[str, Any]]]:
    """The model's top-1, and the best measured of its top-k (a config that fails is skipped, and said)."""
    from schedlib.carver import carve
    from schedlib.rules import get_rule

    t0 = time.perf_counter()
    ranked = carve(func, profile, topk=topk)
    cost = time.perf_counter() - t0
    if ranked.empty:
        raise SchedlibError(no_legal_config(ranked))
    rule = get_rule(ranked["rule"].iloc[0])
    timings: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for config in ranked["config"]:
        try:
            timings.append((config, _timed(timer, rule.apply(func, profile, config), rule, config)))
        except Exception as exc:
            timings.append((config, _failed(exc)))
        if not timer.measured:
            break  # the model already ranked them: its top-1 is its best
    top = timings[0]
    ok = [ct for ct in timings if ct[1]["time_us"] == ct[1]["time_us"]]
    best = min(ok, key=lambda ct: ct[1]["time_us"]) if ok else top
    info = {"rule": rule.name, "tuning_s": cost, "trials": len(timings)}
    failed = len(timings) - len(ok)
    note = {"source": f"{failed} of {len(timings)} failed; {best[1].get('source', 'measured')}"} if failed else {}
    return [("carver", {**info, "config": top[0], **top[1]}),
            ("carver_best_of_k", {**info, "config": best[0], **best[1], **note})]


def _search_rows(func: Func, profile: HardwareProfile, timer: MethodTimer, topk: int, trials: int, strategy: str,
                 storage: str | None, quiet: bool) -> list[tuple[str, dict[str, Any]]]:
    from schedlib.rules import get_rule
    from schedlib.search import tune

    if timer.measured and func.symbols:  # said in the row, in terms of the workload rather than the backend's
        raise SchedlibError(f"the GPU search tunes concrete sizes; give {', '.join(func.symbols)} values to "
                            "search this workload")
    t0 = time.perf_counter()
    res = tune(func, profile, trials=trials, strategy=strategy, storage="memory" if storage is None else storage,
               backend="gpu" if timer.measured else "estimate", quiet=quiet)
    cost = time.perf_counter() - t0
    if res.best_schedule is None:  # every config failed, or none the rule can build: say that, not AttributeError
        raise SchedlibError(f"the search's {len(res.records)} records hold no config that ran and that the rule "
                            "can build")
    rule = get_rule(res.best_schedule.rule) if res.best_schedule.rule else None
    info = {"rule": rule.name if rule else None, "config": res.best_config, "tuning_s": cost,
            "trials": len(res.history), "history": [float(v) for v in res.history]}
    earlier = len(res.history) - res.measured_now
    if earlier > 0:  # a study given as storage: its trials are not this call's cost
        source = "measured" if timer.measured else "estimated"
        info["source"] = (f"{source}; best of the study's {len(res.history)} trials, {res.measured_now} of them "
                          f"run by this call (tuning_s counts those)")
    return [("search", {**info, **_timed(timer, res.best_schedule, rule, res.best_config)})]


_METHODS = {"rule": _rule_rows, "carver": _carver_rows, "search": _search_rows}
