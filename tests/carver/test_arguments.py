"""Bad arguments to the carver and the rules' spaces: refused up front, naming the argument and the value,
instead of a price for a config the rule cannot build or an error from deep inside."""

from __future__ import annotations

import random
import re

import pytest

import schedlib as sl
from schedlib import workloads as wl
from schedlib.rules import apply_default, explain, get_rule

MATMUL = get_rule("matmul")


@pytest.mark.parametrize(("knob", "value"), [("block_m", 32.0), ("vector", True), ("thread_m", 2.0),
                                             ("tensor_core", 0)])
def test_a_knob_value_of_another_type_is_not_legal(knob: str, value: object) -> None:
    f = wl.matmul(512, 512, 512)
    config = {**MATMUL.default_config(f, "h100"), knob: value}
    space = MATMUL.space(f, "h100")
    assert f"knob {knob}={value!r} is not one of" in space.reason(config)
    with pytest.raises(sl.ScheduleError, match=f"knob {knob}="):
        sl.carver.estimate(f, "h100", config)
    with pytest.raises(sl.ScheduleError, match=f"knob {knob}="):
        MATMUL.apply(f, "h100", config)


def test_a_config_must_be_a_mapping() -> None:
    f = wl.matmul(64, 64, 64)
    assert MATMUL.space(f, "h100").reason(None) == "a config is a mapping of knob values, got NoneType"
    with pytest.raises(sl.ScheduleError, match="a config is a mapping of knob values, got list"):
        sl.carver.estimate(f, "h100", [1, 2])


@pytest.mark.parametrize("topk", [True, 1.5, "3", 0, -1])
def test_carve_needs_a_positive_int_topk(topk: object) -> None:
    with pytest.raises(ValueError, match=f"topk must be a positive int or None, got {topk!r}"):
        sl.carver.carve(wl.matmul(64, 64, 64), "h100", topk=topk)


@pytest.mark.parametrize("value", [1.5, True, "64", [64], {"M": 1.7}])
def test_symbolic_values_must_be_ints(value: object) -> None:
    with pytest.raises(ValueError, match=r"symbolic_value for .* must be an int"):
        sl.carver.carve(wl.matmul(sl.var("M"), 64, 64), "h100", topk=1, symbolic_value=value)


@pytest.mark.parametrize("func", [None, "matmul", 5])
def test_entry_points_need_a_func(func: object) -> None:
    got = type(func).__name__
    with pytest.raises(TypeError, match=re.escape(f"carver: expected a Func (from sl.func or sl.workloads), "
                                                  f"got {got} {func!r}")):
        sl.carver.carve(func, "h100")
    with pytest.raises(TypeError, match=re.escape(f"apply_default: expected a Func or a list of Funcs, got {got}")):
        apply_default(func, "h100")
    with pytest.raises(TypeError, match=re.escape(f"explain: expected a Func (from sl.func or sl.workloads), "
                                                  f"got {got} {func!r}")):
        explain(func, "h100")


def test_space_enumeration_limits_sampling_and_knob_lookup() -> None:
    space = MATMUL.space(wl.matmul(64, 64, 64), "h100")
    assert list(space.enumerate(0)) == [] and len(list(space.enumerate(3))) == 3
    with pytest.raises(ValueError, match=r"enumerate\(limit=-1\)"):
        list(space.enumerate(-1))
    with pytest.raises(TypeError, match=r"sample needs a random\.Random, got NoneType"):
        space.sample(None)
    assert space.is_legal(space.sample(random.Random(0)))
    with pytest.raises(KeyError, match="the matmul space has no knob 'bogus'"):
        space.knob("bogus")


def test_a_func_no_kernel_can_index_is_refused_before_ranking() -> None:
    # 65536^2 elements pass the 32-bit offsets every kernel uses: the carver ranked such configs anyway (at
    # 1.1e7 us), every one of which the build then refused
    with pytest.raises(sl.ShapeError, match=r"buffer A of shape \[65536, 65536\] has 4,294,967,296 elements; "
                                            "generated kernels index with 32-bit offsets"):
        sl.carver.carve(wl.matmul(65536, 65536, 65536), "h100", topk=2)
    # a symbolic size is checked at the value the carver prices it at, which the message names
    with pytest.raises(sl.ShapeError, match=r"buffer A of shape \[131072, 16384\] with \{'M': 131072\}"):
        sl.carver.estimate(wl.matmul(sl.var("M"), 64, 16384), "h100", {}, symbolic_value=131072)
    assert len(sl.carver.carve(wl.matmul(sl.var("M"), 64, 16384), "h100", topk=2)) == 2  # M = 4096 fits
