"""Integer simplification of ``//`` and ``%`` under variable ranges: exact on every point, and it pulls whole
multiples of the divisor out only where both parts are non-negative (where C's truncating division agrees)."""

from __future__ import annotations

import itertools

import numpy as np

from schedlib.ir.expr import Const, Expr, binary
from schedlib.ir.reference import evaluate_int
from schedlib.ir.simplify import free_vars, simplify, var


def _points(ranges: dict[str, tuple[int, int]]) -> list[dict[str, int]]:
    names = sorted(ranges)
    return [dict(zip(names, p)) for p in itertools.product(*(range(lo, hi + 1) for lo, hi in
                                                             (ranges[n] for n in names)))]


def test_multiples_of_the_divisor_leave_the_division() -> None:
    x, y = var("x"), var("y")
    ranges = {"x": (0, 15), "y": (0, 7)}
    chunk = simplify(binary("%", binary("//", x * 8 + y, Const(4)), Const(2)), ranges)
    assert free_vars(chunk) == {"y"}  # ((8x + y) // 4) % 2 = y // 4
    row = simplify(binary("//", x * 8 + y, Const(4)), ranges)
    assert row == simplify(x * 2 + binary("//", y, Const(4)), ranges)
    for p in _points(ranges):
        assert evaluate_int(chunk, p) == ((8 * p["x"] + p["y"]) // 4) % 2


def test_a_part_that_may_be_negative_keeps_the_division_whole() -> None:
    x, y = var("x"), var("y")
    e = binary("//", x * 8 + y, Const(4))
    assert simplify(e, {"x": (-2, 2), "y": (0, 7)}) == e
    assert simplify(e, {"x": (0, 2), "y": (-3, 7)}) == e
    assert simplify(e, {"y": (0, 7)}) == e  # x unbounded


def test_random_affine_divisions_keep_their_value() -> None:
    rng = np.random.default_rng(7)
    names = ["a", "b", "c"]
    for _ in range(300):
        ranges = {n: (0, int(rng.integers(1, 6))) for n in names}
        expr: Expr = Const(int(rng.integers(0, 9)))
        for n in names:
            expr = expr + var(n) * int(rng.choice([1, 2, 3, 4, 6, 8, 16]))
        for _ in range(int(rng.integers(1, 3))):
            expr = binary(str(rng.choice(["//", "%"])), expr, Const(int(rng.choice([2, 3, 4, 8]))))
        simple = simplify(expr, ranges)
        for p in _points(ranges):
            assert evaluate_int(simple, p) == evaluate_int(expr, p), (expr, simple, p)


def test_a_fused_index_taken_apart_and_put_back_is_the_index() -> None:
    """``(f // c) * c + f % c`` (a row-major address of ``X[f // c, f % c]``) folds to ``f``, scaled terms too,
    for any sign; a mismatched pair stays as it is."""
    x, y = var("x"), var("y")
    f = x * 64 + y
    flat = simplify(binary("//", f, Const(37)) * 37 + binary("%", f, Const(37)), {})
    assert flat == simplify(f, {})
    scaled = simplify(binary("//", f, Const(10)) * 30 + binary("%", f, Const(10)) * 3 + 5, {})
    assert scaled == simplify(f * 3 + 5, {})
    kept = binary("//", f, Const(10)) * 20 + binary("%", f, Const(10))
    assert free_vars(simplify(kept, {})) == {"x", "y"} and "%" in str(simplify(kept, {}))
    for p in _points({"x": (-3, 3), "y": (-70, 70)}):
        assert evaluate_int(simplify(kept, {}), p) == evaluate_int(kept, p)
