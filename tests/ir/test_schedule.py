"""The Schedule recorder: get_block / get_loops lookups, purity of primitives, docstrings, repr."""

from __future__ import annotations

import pytest

import schedlib as sl
from schedlib.ir import primitives as P
from schedlib.ir.primitives.common import check_positive_int
from schedlib.ir.schedule import Trace

from .helpers import Reject, assert_same_result, loop_nest, moments_func, schedule, well_formed_problems


def test_get_block_and_get_loops_change_nothing() -> None:
    s = sl.Schedule(sl.workloads.matmul(7, 3, 5, epilogue="relu"))
    before = loop_nest(s)
    assert s.get_block("C") == "C"
    assert s.get_loops("C") == ["C.i", "C.j", "C.k"]
    assert s.get_loops("D") == ["D.i0", "D.i1"]
    assert s.blocks == ["C", "D"]
    assert loop_nest(s) == before and len(s.trace) == 0 and s.func is s.original
    assert_same_result(s.original, s)


def test_get_loops_follows_the_schedule() -> None:
    s = sl.Schedule(sl.workloads.matmul(7, 3, 5))
    i, _j, k = s.get_loops("C")
    s.split(k, [None, 2])
    s.reorder("C.k_0", i)
    assert s.get_loops("C") == ["C.k_0", "C.j", "C.i", "C.k_1"]
    a = s.cache_read("C", "A", "local")
    s.compute_at(a, "C.i")
    assert s.get_loops(a) == ["A_local.ax0", "A_local.ax1"]  # its own loops, not the enclosing ones
    assert s.get_block(a) == a
    assert_same_result(s.original, s)


def test_primitives_are_pure() -> None:
    """A primitive returns a new Func and never touches the one it was given."""
    f = sl.workloads.matmul(7, 3, 5, epilogue="bias")
    chain = sl.workloads.elementwise((3, 5), ("add", "relu"))
    cached = P.cache_read(f, "C", "A", "shared")[0]
    calls = [
        lambda g: P.split(g, "C.i", [None, 2]), lambda g: P.fuse(g, ["C.i", "C.j"]),
        lambda g: P.reorder(g, ["C.k", "C.i"]), lambda g: P.bind(g, "C.i", "blockIdx.x"),
        lambda g: P.unroll(g, "C.k"), lambda g: P.annotate(g, "C", "x", 1),
        lambda g: P.cache_read(g, "C", "A", "shared"), lambda g: P.cache_write(g, "C", "local"),
        lambda g: P.compute_at(g, "C", "D.i0"), lambda g: P.reverse_compute_at(g, "D", "C.i"),
        lambda g: P.rfactor(g, "C.k"), lambda g: P.decompose_reduction(g, "C", "C.k"),
        lambda g: P.vectorize(g, "D.i1"),
    ]
    more = [(chain, lambda g: P.compute_inline(g, "E0")), (chain, lambda g: P.reverse_compute_inline(g, "E1")),
            (cached, lambda g: P.storage_align(g, "A_shared", 0, 8, 1))]
    for func, call in [(f, c) for c in calls] + more:
        text = str(func)
        new, _ = call(func)
        assert new is not func and new != func
        assert str(func) == text


def test_schedule_methods_carry_the_primitive_docstrings() -> None:
    for name, fn in P.PRIMITIVES.items():
        doc = getattr(sl.Schedule, name).__doc__
        assert doc == fn.__doc__, name
        assert "before" in doc.lower() and "after" in doc.lower(), name


def test_repr_and_str() -> None:
    s = sl.Schedule(sl.workloads.reduce(4, 8))
    s.split("R.r", [None, 4])
    assert repr(s) == "<Schedule reduce_sum: 1 steps, rule=None>"
    assert str(s) == str(s.func)


# rejections of the lookups and of the shared argument checks ------------------------------------

def _mm() -> sl.Schedule:
    return schedule(sl.workloads.matmul(4, 4, 4), lambda s: s.split("C.i", [2, 2]))


NEGATIVE = [
    Reject("get-block-type", _mm, lambda s: s.get_block(["C"]), "get_block", "name", ["C"],
           "must be a block name (str)"),
    Reject("get-block-missing", _mm, lambda s: s.get_block("D"), "get_block", "name", "D",
           "no such block; blocks are: C"),
    # Regression: any value was taken, and the trace written with it could not be read back
    Reject("schedule-rule-not-a-name", _mm, lambda s: setattr(s, "rule", 3), "Schedule.rule", "rule", 3,
           "must be a rule name (str) or None"),
    Reject("schedule-config-not-knob-values", _mm, lambda s: setattr(s, "config", {"tile": [8]}), "Schedule.config",
           "config", {"tile": [8]}, "must be a dict of knob values"),
    Reject("get-loops-missing", _mm, lambda s: s.get_loops("C.i_0"), "get_loops", "block", "C.i_0",
           "no such block"),
    Reject("positive-int-upper", _mm, lambda s: check_positive_int("storage_align", "factor", 64, upper=32),
           "storage_align", "factor", 64, "must be at most 32"),
    # Regression: both raised a plain TypeError.
    Reject("schedule-of-non-func", _mm, lambda s: sl.Schedule("matmul"), "Schedule", "func", "matmul",
           "Schedule needs a Func (from sl.func or sl.workloads), got str"),
    Reject("trace-from-non-text", _mm, lambda s: Trace.from_json(123), "from_trace", "trace", 123,
           "must be JSON text"),
]


@pytest.mark.parametrize("case", NEGATIVE, ids=lambda c: c.id)
def test_rejections(case: Reject) -> None:
    case.check()


VALID_ARGS: dict[str, dict[str, object]] = {
    "split": {"loop": "C.k", "factors": [None, 2]},
    "fuse": {"loops": ["C.i", "C.j"]},
    "reorder": {"loops": ["C.j", "C.i"]},
    "bind": {"loop": "C.i", "thread": "blockIdx.x"},
    "vectorize": {"loop": "D.i1"},
    "unroll": {"loop": "C.k"},
    "annotate": {"target": "C.k", "key": "pipeline_stages", "value": 2},
    "storage_align": {"block": "A_shared", "dim": 0, "factor": 8, "offset": 1},
    "storage_permute": {"block": "A_shared", "dim": 1, "factors": [2, 2], "order": [1, 0]},
    "double_buffer": {"block": "A_shared"},
    "cache_read": {"block": "C", "buffer": "A_shared", "scope": "local"},
    "cache_write": {"block": "D", "scope": "local"},
    "compute_at": {"block": "C", "loop": "C_local.ax0"},
    "reverse_compute_at": {"block": "D", "loop": "C_local.ax0"},
    "compute_with": {"block": "S", "loop": "Q.i"},
    "compute_inline": {"block": "B_local"},
    "reverse_compute_inline": {"block": "D"},
    "rfactor": {"loop": "C.k", "factor_axis": 0},
    "decompose_reduction": {"block": "C", "loop": "C.k"},
}
GARBAGE: list[object] = [None, 3, -1, 2.5, True, "", "nope", [], {}, ["C.i"], ("C.i", "C.j"), {"C.i": 1}, object(),
                         float("nan")]


def _garbage_base(name: str = "") -> sl.Schedule:
    if name == "compute_with":  # needs two blocks that share no data
        return schedule(moments_func(8, 16), lambda s: s.split("S.k", [None, 4]), lambda s: s.split("Q.k", [None, 4]),
                        lambda s: s.bind("Q.i", "blockIdx.x"))
    if name == "double_buffer":  # needs a shared copy attached at a serial loop
        return schedule(sl.workloads.matmul(8, 4, 4, epilogue="relu"), lambda s: s.split("C.k", [None, 2]),
                        lambda s: s.cache_read("C", "A", "shared"), lambda s: s.compute_at("A_shared", "C.k_0"))
    return schedule(sl.workloads.matmul(8, 4, 4, epilogue="relu"), lambda s: s.cache_read("C", "A", "shared"),
                    lambda s: s.cache_read("C", "B", "local"), lambda s: s.cache_write("C", "local"))


@pytest.mark.parametrize("name", sorted(VALID_ARGS))
def test_every_primitive_accepts_its_valid_arguments(name: str) -> None:
    assert set(VALID_ARGS) == set(P.PRIMITIVES)
    s = _garbage_base(name)
    before = s.func
    s._apply(name, **VALID_ARGS[name])
    assert len(s.trace) == 4 and s.func != before
    assert_same_result(s.original, s)


@pytest.mark.parametrize("name", sorted(VALID_ARGS))
def test_garbage_arguments_only_raise_schedule_error(name: str) -> None:
    """Any value in any argument slot either works or raises ScheduleError, never another exception."""
    for argument in VALID_ARGS[name]:
        for bad in GARBAGE:
            s = _garbage_base(name)
            before, steps = s.func, len(s.trace)
            try:
                s._apply(name, **{**VALID_ARGS[name], argument: bad})
            except sl.ScheduleError as err:
                assert err.primitive == name and s.func is before and len(s.trace) == steps
            else:  # some values are fine there (any identifier as a key, a tuple of loops, another factor)
                assert len(s.trace) == steps + 1 and not well_formed_problems(s.func), (argument, bad)
                assert_same_result(s.original, s)


def test_numpy_integers_and_loop_lists_are_taken_as_users_write_them() -> None:
    """A factor read from a numpy shape is a numpy integer, and loops are often passed as one list: both mean
    the same as plain ints and separate names, and the trace stays plain JSON."""
    import json

    import numpy as np

    f = sl.workloads.matmul(64, 64, 64)
    plain = sl.Schedule(f)
    plain.split("C.i", [None, 16])
    plain.reorder("C.i_1", "C.i_0")
    fused_plain = plain.fuse("C.i_1", "C.i_0")
    numpy_style = sl.Schedule(f)
    assert numpy_style.split("C.i", [None, np.int64(16)]) == ["C.i_0", "C.i_1"]
    numpy_style.reorder(["C.i_1", "C.i_0"])
    assert numpy_style.fuse(("C.i_1", "C.i_0")) == fused_plain
    assert str(numpy_style) == str(plain)
    assert json.loads(numpy_style.trace.to_json()) == json.loads(plain.trace.to_json())
    with pytest.raises(sl.ScheduleError, match=r"factor (np\.float64\()?16\.0\)? must be a positive integer or None"):
        numpy_style.split("C.j", [None, np.float64(16)])


def test_get_block_names_its_own_argument() -> None:
    s = sl.Schedule(sl.workloads.matmul(8, 6, 4))
    with pytest.raises(sl.ScheduleError, match=r"get_block: argument name='nope': no such block"):
        s.get_block(name="nope")
