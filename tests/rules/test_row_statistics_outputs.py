"""Row statistics that are func outputs too: a layer norm that returns its mean and rstd (as a training step
keeps them for the backward pass), a softmax that returns its row max and sum (a logsumexp).  They went to
the serial fallback; the general-reduction rule now stores each once per row, where it is computed, and the
stages after it read it back into a register.  Emulated against the reference and compiled within limits;
the kernel's shape read from the source."""

from __future__ import annotations

import re

import numpy as np
import pytest

import schedlib as sl
from schedlib.rules import get_rule

from .helpers import check_resources, run_and_compare

RULE = get_rule("general_reduction")
H100 = sl.hw.load("h100")


def _sum_and_sum_of_squares(X: sl.Tensor, rows: int, cols: int) -> tuple[sl.Tensor, sl.Tensor]:
    """A row's sum and its sum of squares, accumulated in fp32."""
    k1, k2 = sl.reduce_axis(cols, "k"), sl.reduce_axis(cols, "k")
    s1 = sl.compute((rows,), lambda i: sl.sum(X[i, k1].astype("float32"), axis=k1), "S1")
    s2 = sl.compute((rows,), lambda i: sl.sum(X[i, k2].astype("float32") * X[i, k2].astype("float32"), axis=k2),
                    "S2")
    return s1, s2


def layernorm_stats(rows: int, cols: int, dtype: str = "float32") -> sl.Func:
    """``Y = (X - mean) * rstd`` with ``mean`` and ``rstd`` (row statistics over two reductions) as outputs."""
    X = sl.placeholder((rows, cols), dtype, "X")
    s1, s2 = _sum_and_sum_of_squares(X, rows, cols)
    mean = sl.compute((rows,), lambda i: s1[i] / float(cols), "mean")
    rstd = sl.compute((rows,), lambda i: sl.rsqrt(sl.maximum(s2[i] / float(cols) - mean[i] * mean[i], 0.0) + 1e-5),
                      "rstd")
    Y = sl.compute((rows, cols), lambda i, j: ((X[i, j].astype("float32") - mean[i]) * rstd[i]).astype(dtype), "Y")
    return sl.func([X, Y, mean, rstd], "layernorm_stats")


def _max_and_sum_of(X: sl.Tensor, rows: int, cols: int) -> tuple[sl.Tensor, sl.Tensor]:
    """A row's max, and its sum of exp(x - max)."""
    k1, k2 = sl.reduce_axis(cols, "k"), sl.reduce_axis(cols, "k")
    mx = sl.compute((rows,), lambda i: sl.max(X[i, k1].astype("float32"), axis=k1), "row_max")
    se = sl.compute((rows,), lambda i: sl.sum(sl.exp(X[i, k2].astype("float32") - mx[i]), axis=k2), "row_sum")
    return mx, se


def softmax_stats(rows: int, cols: int, dtype: str = "float32") -> sl.Func:
    """A softmax that also returns its row max and its row sum of exponentials (both reductions)."""
    X = sl.placeholder((rows, cols), dtype, "X")
    mx, se = _max_and_sum_of(X, rows, cols)
    Y = sl.compute((rows, cols), lambda i, j: (sl.exp(X[i, j].astype("float32") - mx[i]) / se[i]).astype(dtype), "Y")
    return sl.func([X, Y, mx, se], "softmax_stats")


def max_and_sum(rows: int, cols: int, dtype: str = "float32") -> sl.Func:
    """Only statistics: a row's max and its sum of exp(x - max), both outputs (a cross-entropy's logsumexp)."""
    X = sl.placeholder((rows, cols), dtype, "X")
    return sl.func([X, *_max_and_sum_of(X, rows, cols)], "max_and_sum")


def moments(rows: int, cols: int, dtype: str = "float32") -> sl.Func:
    """A row's sum and sum of squares side by side, both outputs and read by nothing (a variance's parts)."""
    X = sl.placeholder((rows, cols), dtype, "X")
    return sl.func([X, *_sum_and_sum_of_squares(X, rows, cols)], "moments")


def softmax_lse(rows: int, cols: int, dtype: str = "float32") -> sl.Func:
    """A softmax and its log-sum-exp ``max + log(sum)``: a row statistic no later stage reads."""
    X = sl.placeholder((rows, cols), dtype, "X")
    mx, se = _max_and_sum_of(X, rows, cols)
    lse = sl.compute((rows,), lambda i: mx[i] + sl.log(se[i]), "lse")
    Y = sl.compute((rows, cols), lambda i, j: (sl.exp(X[i, j].astype("float32") - mx[i]) / se[i]).astype(dtype), "Y")
    return sl.func([X, lse, Y], "softmax_lse")


def range_and_logsumexp(rows: int, cols: int, dtype: str = "float32") -> sl.Func:
    """A row's min beside its max and sum of exp(x - max): a chain and a reduction side by side."""
    X = sl.placeholder((rows, cols), dtype, "X")
    mx, se = _max_and_sum_of(X, rows, cols)
    k = sl.reduce_axis(cols, "k")
    mn = sl.compute((rows,), lambda i: sl.min(X[i, k].astype("float32"), axis=k), "row_min")
    return sl.func([X, mn, mx, se], "range_and_logsumexp")


CASES = [
    (lambda: layernorm_stats(5, 300), None),
    (lambda: layernorm_stats(3, 256, "float16"), {"threads": 32, "unroll": 8, "stage_row": True}),
    (lambda: softmax_stats(4, 70), None),  # a ragged row
    (lambda: softmax_stats(3, 512, "bfloat16"), {"threads": 64, "unroll": 4, "stage_row": True}),
    (lambda: max_and_sum(4, 70), None),
    (lambda: max_and_sum(2, 1024, "float16"), {"threads": 128, "unroll": 8, "stage_row": True}),
    (lambda: moments(5, 300), None),
    (lambda: moments(3, 512, "float16"), {"threads": 64, "unroll": 8, "stage_row": True}),
    (lambda: softmax_lse(4, 70), None),
    (lambda: range_and_logsumexp(3, 200, "bfloat16"), None),
]


@pytest.mark.parametrize(("make", "config"), CASES, ids=["layernorm", "layernorm-fp16-staged", "softmax-ragged",
                                                         "softmax-bf16-staged", "max-and-sum",
                                                         "max-and-sum-fp16-staged", "moments", "moments-fp16-staged",
                                                         "softmax-lse", "range-and-logsumexp-bf16"])
def test_statistics_are_stored_once_per_row(make, config: dict | None, rng: np.random.Generator) -> None:
    f = make()
    assert sl.rules.find_rule(f, H100).name == "general_reduction"
    sch = RULE.apply(f, H100, config or RULE.default_config(f, H100))
    kernel = sl.build(sch, "h100")
    assert len(kernel.launch) == 1  # one kernel: statistics, read-backs and the output per row
    run_and_compare(f, kernel, rng, {})
    lines = kernel.source.split("\n")
    for name in f.outputs:
        if func_block_is_elementwise(f, name):
            continue  # the output over (rows, cols): every thread stores its columns
        stores = [i for i, line in enumerate(lines) if re.search(rf"\b{name}\[[^\]]*\] = ", line)]
        assert len(stores) == 1, stores  # one store per row, by one thread:
        assert "threadIdx.x == 0" in lines[stores[0]] + lines[stores[0] - 1]
    check_resources(kernel)


def func_block_is_elementwise(f: sl.Func, buffer: str) -> bool:
    return len(f.buffer(buffer).shape) == 2


def test_side_by_side_stages_are_placed_beside_the_row_and_a_single_reduction_is_the_reduction_rules() -> None:
    """A row statistic nothing reads (a sum beside a sum of squares, a log-sum-exp beside the softmax) went to
    the serial fallback, the rule saying it had no place in the row's block; compute_with places it there."""
    for f, placed in ((moments(5, 37), ["S1"]), (softmax_lse(4, 16), ["lse"]),
                      (range_and_logsumexp(4, 16), ["row_min"])):
        assert RULE.applies(f, H100) is None
        sch = RULE.apply(f, H100, RULE.default_config(f, H100))
        assert [step["args"]["block"] for step in sch.trace if step["primitive"] == "compute_with"] == placed
    assert sl.rules.find_rule(sl.workloads.reduce(64, 100), H100).name == "reduction"


def softmax_then_lse(rows: int, cols: int) -> sl.Func:
    """:func:`softmax_lse` with its outputs listed the other way round: the softmax, then the log-sum-exp."""
    X = sl.placeholder((rows, cols), "float32", "X")
    mx, se = _max_and_sum_of(X, rows, cols)
    Y = sl.compute((rows, cols), lambda i, j: sl.exp(X[i, j] - mx[i]) / se[i], "Y")
    return sl.func([X, Y, sl.compute((rows,), lambda i: mx[i] + sl.log(se[i]), "lse")], "softmax_then_lse")


def scaled_then_moments(rows: int, cols: int) -> sl.Func:
    """Rows scaled by 2, then the row's sum and sum of squares that nothing reads, listed after it."""
    X = sl.placeholder((rows, cols), "float32", "X")
    Y = sl.compute((rows, cols), lambda i, j: X[i, j] * 2.0, "Y")
    return sl.func([X, Y, *_sum_and_sum_of_squares(X, rows, cols)], "scaled_then_moments")


@pytest.mark.parametrize("make", [softmax_then_lse, scaled_then_moments])
def test_statistics_listed_after_the_output(make, rng: np.random.Generator) -> None:
    """A statistic listed after the output over (rows, cols) comes after it in the func's blocks: the rule
    took the last block for that output and declined ("output block lse must be element-wise")."""
    f = make(4, 70)
    assert f.blocks[-1].name != "Y"
    assert sl.rules.find_rule(f, H100).name == "general_reduction"
    kernel = sl.build(RULE.apply(f, H100), "h100")
    assert len(kernel.launch) == 1
    run_and_compare(f, kernel, rng, {})


M, N = sl.var("M"), sl.var("N")


# A symbolic row length: the columns split over threads leave a box of ceil(N / f) * f around a row of N,
# still the whole row, so a statistic nothing reads is placed beside it (compute_with refused it, and every
# config failed).
@pytest.mark.parametrize(("make", "shape", "sizes"), [
    *((make, (M, 33), ({"M": 1}, {"M": 5})) for make in (layernorm_stats, softmax_stats, max_and_sum, moments,
                                                         softmax_lse)),
    *((make, (4, N), ({"N": 1}, {"N": 70})) for make in (softmax_lse, moments)),
], ids=["rows-layernorm", "rows-softmax", "rows-max-and-sum", "rows-moments", "rows-softmax-lse",
        "cols-softmax-lse", "cols-moments"])
def test_symbolic_sizes(make, shape: tuple, sizes: tuple[dict[str, int], ...], rng: np.random.Generator) -> None:
    f = make(*shape)
    sch = sl.rules.apply_default(f, H100)
    assert sch.rule == "general_reduction"
    kernel = sl.build(sch, "h100")
    assert len(kernel.launch) == 1
    for symbols in sizes:
        run_and_compare(f, kernel, rng, symbols)


def test_the_carver_counts_the_statistics_as_output_bytes() -> None:
    f = layernorm_stats(4096, 4096)
    row = sl.carver.estimate(f, H100, RULE.default_config(f, H100))
    assert row["compulsory_bytes"] == 2 * 4096 * 4096 * 4 + 2 * 4096 * 4  # X and Y, mean and rstd


def test_what_the_rule_declines_says_why() -> None:
    X = sl.placeholder((16, 8), "float32", "X")
    k = sl.reduce_axis(16, "k")
    colmax = sl.compute((8,), lambda j: sl.max(X[k, j], axis=k), "colmax")
    Y = sl.compute((16, 8), lambda i, j: X[i, j] - colmax[j], "Y")
    why = RULE.applies(sl.func([X, Y, colmax], "centre_columns"), H100)
    assert why is not None and "the column layout stores one output; colmax is a further one" in why
    X3 = sl.placeholder((2, 3, 8), "float32", "X")
    k3 = sl.reduce_axis(8, "k")
    s3 = sl.compute((2, 3), lambda b, i: sl.sum(X3[b, i, k3], axis=k3), "S")
    Y3 = sl.compute((2, 3, 8), lambda b, i, j: X3[b, i, j] - s3[b, i], "Y")
    why = RULE.applies(sl.func([X3, Y3, s3], "centre_3d"), H100)
    assert why is not None and "statistics are stored for rows of a 2-D func" in why
    X2 = sl.placeholder((4, 8), "float32", "X")
    k2 = sl.reduce_axis(8, "k")
    s2 = sl.compute((4,), lambda i: sl.sum(X2[i, k2], axis=k2), "S")
    twice = sl.compute((4, 8), lambda i, j: X2[i, j] * 2.0, "twice")
    Y2 = sl.compute((4, 8), lambda i, j: twice[i, j] - s2[i], "Y")
    why = RULE.applies(sl.func([X2, Y2, twice], "also_twice"), H100)
    assert why is not None and "output twice is written by neither the last stage" in why
