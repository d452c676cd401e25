"""Conditions combine with '&', '|' and '~' (Python's 'and', 'or', 'not' cannot be overloaded), and only
conditions do: a number is not taken for true, as C would."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import schedlib as sl


def test_and_or_not_on_conditions_match_numpy() -> None:
    X = sl.placeholder((6, 7), "float32", "X")
    Y = sl.compute((6, 7), lambda i, j: sl.if_then_else(
        ((X[i, j] > 0) & (X[i, j] < 1)) | ~(X[i, j] > -2), 1.0, 0.0), "Y")
    f = sl.func([X, Y])
    assert "and" in str(f) and "or" in str(f) and "not(" in str(f)
    x = (np.random.default_rng(3).standard_normal((6, 7)) * 3).astype("float32")
    want = (((x > 0) & (x < 1)) | ~(x > -2)).astype("float32")
    assert want.any() and not want.all()
    np.testing.assert_array_equal(sl.run_reference(f, {"X": x})["Y"], want)
    np.testing.assert_array_equal(sl.build(f, "h100").run_cpu(x), want)


def test_a_python_bool_works_on_either_side() -> None:
    X = sl.placeholder((4,), "float32", "X")
    cond = X[0] > 0
    assert str(True & cond) == str(cond & True) == str(cond)  # and-ing with True folds away
    assert str(cond | False) == "X[0] > 0 or False" and str(False | cond) == "False or X[0] > 0"


@pytest.mark.parametrize("make", [
    lambda X: (X[0] + 1) & X[1],
    lambda X: (X[0] > 0) | X[1],
    lambda X: ~X[0],
])
def test_logic_on_numbers_is_refused_with_the_fix(make: Callable[[sl.Tensor], object]) -> None:
    X = sl.placeholder((4,), "float32", "X")
    with pytest.raises(sl.IRError, match="compare first"):
        make(X)


def test_python_and_points_to_the_operators() -> None:
    X = sl.placeholder((4,), "float32", "X")
    with pytest.raises(sl.IRError, match="'&', '\\|', '~'"):
        bool((X[0] > 0) and (X[1] > 0))
