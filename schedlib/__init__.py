"""schedlib: schedule a Spatial/Reduce loop IR into fast CUDA kernels.

Three ways fill one knob space per rule: expert rules (``sl.rules``), an analytical carver
(``sl.carver``) and measured search (``sl.search``).  Start with::

    import schedlib as sl
    f = sl.workloads.matmul(256, 256, 256)
    s = sl.Schedule(f)
"""

from __future__ import annotations

from schedlib import hw, rules, workloads
from schedlib.errors import (
    BuildError,
    CompileError,
    EmulatorError,
    ExecutionError,
    IRError,
    ProfileError,
    SchedlibError,
    ScheduleError,
    ShapeError,
)
from schedlib.ir import (
    Func,
    Schedule,
    Tensor,
    Trace,
    abs,
    compute,
    erf,
    exp,
    if_then_else,
    log,
    max,
    maximum,
    min,
    minimum,
    placeholder,
    reduce_axis,
    rsqrt,
    run_reference,
    sigmoid,
    sqrt,
    sum,
    tanh,
    var,
)
from schedlib.ir.func import make_func as _make_func
from schedlib.runtime import Kernel, build

__version__ = "0.14.0"


_LAZY = ("carver", "search", "report", "codegen", "runtime", "suites")


def __getattr__(name: str) -> object:
    """Import the heavier subpackages (optuna, xgboost, pandas, matplotlib) on first use."""
    if name in _LAZY:
        import importlib

        return importlib.import_module(f"schedlib.{name}")
    raise AttributeError(f"module 'schedlib' has no attribute {name!r}")


def func(tensors: list[Tensor], name: str = "main") -> Func:
    """Collect the stages between the given inputs (placeholders) and outputs into a Func of blocks."""
    return _make_func(tensors, name)


__all__ = [
    "BuildError",
    "CompileError",
    "EmulatorError",
    "ExecutionError",
    "Func",
    "IRError",
    "Kernel",
    "ProfileError",
    "SchedlibError",
    "Schedule",
    "ScheduleError",
    "ShapeError",
    "Tensor",
    "Trace",
    "__version__",
    "abs",
    "build",
    "compute",
    "erf",
    "exp",
    "func",
    "hw",
    "if_then_else",
    "log",
    "max",
    "maximum",
    "min",
    "minimum",
    "placeholder",
    "reduce_axis",
    "rsqrt",
    "rules",
    "run_reference",
    "sigmoid",
    "sqrt",
    "sum",
    "tanh",
    "var",
    "workloads",
]
