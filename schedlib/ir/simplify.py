"""Expression utilities: traversal, substitution, integer bounds and an affine simplifier.

Schedules build index expressions by substitution (``i -> i_0 * 32 + i_1``), so most index arithmetic is
affine.  The simplifier puts integer expressions in a canonical affine form and, given the value ranges of
loop variables, removes ``//`` and ``%`` whose result is known (``(i_0 * 32 + i_1) // 32 -> i_0``) and
guards that always hold.  That keeps printed loop nests readable and generated CUDA lean.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from schedlib.ir.dtype import is_int
from schedlib.ir.expr import (
    Binary,
    Call,
    Cast,
    Const,
    Expr,
    Load,
    Reduce,
    Select,
    Var,
    binary,
    call,
    cast,
    select,
)
from schedlib.ir.rounding import rounded

Ranges = Mapping[str, tuple[int, int]]  # var name -> inclusive (lo, hi)


def map_children(e: Expr, fn: Callable[[Expr], Expr]) -> Expr:
    """Rebuild ``e`` with ``fn`` applied to each direct child (constructors re-fold constants)."""
    if isinstance(e, Binary):
        return binary(e.op, fn(e.a), fn(e.b))
    if isinstance(e, Call):
        return call(e.fn, *(fn(a) for a in e.args))
    if isinstance(e, Cast):  # a cast to the value's own narrow type is a rounding: kept while it rounds
        return (rounded if e.value.dtype == e.dtype else cast)(e.dtype, fn(e.value))
    if isinstance(e, Select):
        return select(fn(e.cond), fn(e.then), fn(e.other))
    if isinstance(e, Load):
        return Load(e.buffer, tuple(fn(i) for i in e.indices), e.dtype, e.tensor)
    if isinstance(e, Reduce):
        return Reduce(e.op, fn(e.source), e.axes, e.dtype)
    return e


def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Binary):
        return (e.a, e.b)
    if isinstance(e, Call):
        return e.args
    if isinstance(e, Cast):
        return (e.value,)
    if isinstance(e, Select):
        return (e.cond, e.then, e.other)
    if isinstance(e, Load):
        return e.indices
    if isinstance(e, Reduce):
        return (e.source,)
    return ()


def walk(e: Expr) -> Iterable[Expr]:
    """Pre-order traversal of every node of ``e``."""
    stack = [e]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(children(node)))


def tree_count(e: Expr, counted: Callable[[Expr], bool] = lambda node: True) -> int:
    """How many nodes of ``e`` written out as a tree are ``counted`` (all of them by default), as the printer,
    the code generator and every walk see it: a subexpression shared by two parents counts twice.  Counted in
    time linear in the distinct nodes, so an expression built with much sharing costs no more to measure."""
    memo: dict[int, int] = {}
    stack = [(e, False)]
    while stack:
        node, expanded = stack.pop()
        if id(node) in memo:
            continue
        kids = children(node)
        if expanded or not kids:
            memo[id(node)] = int(counted(node)) + sum(memo[id(k)] for k in kids)
        else:
            stack.append((node, True))
            stack.extend((k, False) for k in kids)
    return memo[id(e)]


def free_vars(e: Expr) -> set[str]:
    return {n.name for n in walk(e) if isinstance(n, Var)}


def loads(e: Expr) -> list[Load]:
    return [n for n in walk(e) if isinstance(n, Load)]


def substitute(e: Expr, mapping: Mapping[str, Expr]) -> Expr:
    """Replace variables by name; unmapped variables stay."""
    if not mapping:
        return e

    def go(x: Expr) -> Expr:
        if isinstance(x, Var):
            return mapping.get(x.name, x)
        return map_children(x, go)

    return go(e)


def rename_buffer(e: Expr, old: str, new: str, index_fn: Callable[[tuple[Expr, ...]], tuple[Expr, ...]] | None
                  = None, only: int | None = None) -> Expr:
    """Point loads of buffer ``old`` at ``new`` (optionally rewriting their indices); ``only``: just the
    load of that number among them, counted left to right (``X[i, k] * X[j, k]``: 0 is ``X[i, k]``)."""
    seen = [0]

    def go(x: Expr) -> Expr:
        if isinstance(x, Load) and x.buffer == old:
            number, seen[0] = seen[0], seen[0] + 1
            idx = tuple(go(i) for i in x.indices)
            if only is not None and number != only:
                return Load(x.buffer, idx, x.dtype, x.tensor)
            return Load(new, index_fn(idx) if index_fn else idx, x.dtype)
        return map_children(x, go)

    return go(e)


# ---------------------------------------------------------------------------------------------
# integer bounds

def bounds(e: Expr, ranges: Ranges) -> tuple[int, int] | None:
    """Inclusive integer bounds of ``e`` over the given variable ranges, or None if unknown."""
    if isinstance(e, Const):
        if isinstance(e.value, float):
            return None
        v = int(e.value)
        return v, v
    if isinstance(e, Var):
        return ranges.get(e.name)
    if isinstance(e, Binary) and is_int(e.dtype):
        a = bounds(e.a, ranges)
        if a is None:
            return None
        if e.op in ("//", "%") and isinstance(e.b, Const) and int(e.b.value) > 0:
            c = int(e.b.value)
            if e.op == "//":
                return a[0] // c, a[1] // c
            if a[0] >= 0 and a[1] - a[0] < c and a[0] % c <= a[1] % c:
                return a[0] % c, a[1] % c
            return (0, c - 1) if a[0] >= 0 else None
        b = bounds(e.b, ranges)
        if b is None:
            return None
        if e.op == "+":
            return a[0] + b[0], a[1] + b[1]
        if e.op == "-":
            return a[0] - b[1], a[1] - b[0]
        if e.op == "*":
            products = [a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1]]
            return min(products), max(products)
        if e.op == "min":
            return min(a[0], b[0]), min(a[1], b[1])
        if e.op == "max":
            return max(a[0], b[0]), max(a[1], b[1])
    return None


# ---------------------------------------------------------------------------------------------
# affine normal form: {atom: coefficient} + constant, with integer coefficients

Affine = tuple[dict[Expr, int], int]


def to_affine(e: Expr) -> Affine:
    """Decompose an integer expression; non-affine parts become atoms."""
    if isinstance(e, Const) and not isinstance(e.value, float):
        return {}, int(e.value)
    if isinstance(e, Binary) and e.op in ("+", "-"):
        ta, ca = to_affine(e.a)
        tb, cb = to_affine(e.b)
        sign = 1 if e.op == "+" else -1
        terms = dict(ta)
        for atom, k in tb.items():
            terms[atom] = terms.get(atom, 0) + sign * k
        return {a: k for a, k in terms.items() if k != 0}, ca + sign * cb
    if isinstance(e, Binary) and e.op == "*":
        for x, y in ((e.a, e.b), (e.b, e.a)):
            if isinstance(y, Const) and not isinstance(y.value, float):
                tx, cx = to_affine(x)
                k = int(y.value)
                return ({a: c * k for a, c in tx.items() if c * k != 0}, cx * k)
    return {e: 1}, 0


def from_affine(terms: Mapping[Expr, int], c: int, dtype: str = "int32") -> Expr:
    out: Expr | None = None
    for atom, k in terms.items():
        if k == 0:
            continue
        term = atom if k == 1 else binary("*", atom, Const(k, dtype))
        if out is None:
            out = term if k > 0 else binary("*", atom, Const(k, dtype))
        elif k > 0:
            out = binary("+", out, term)
        else:
            out = binary("-", out, atom if k == -1 else binary("*", atom, Const(-k, dtype)))
    if out is None:
        return Const(c, dtype)
    if c > 0:
        return binary("+", out, Const(c, dtype))
    if c < 0:
        return binary("-", out, Const(-c, dtype))
    return out


def simplify(e: Expr, ranges: Ranges | None = None) -> Expr:
    """Canonicalize integer index arithmetic and drop provably redundant ``//``, ``%`` and comparisons.
    Arithmetic on loaded values is left as written (see :func:`_reads_data`)."""
    rng = ranges or {}

    def go(x: Expr) -> Expr:
        x = map_children(x, go)
        if not isinstance(x, Binary) or x.dtype == "int8" or _reads_data(x):
            return x
        if is_int(x.dtype) and x.op in ("+", "-", "*"):
            terms, c = _fold_divmod(*to_affine(x))
            return from_affine(terms, c, x.dtype)
        if is_int(x.dtype) and x.op in ("//", "%") and isinstance(x.b, Const) and int(x.b.value) > 0:
            return _simplify_divmod(x, int(x.b.value), rng)
        if x.op in ("<", "<=", ">", ">=") and is_int(x.a.dtype) and is_int(x.b.dtype):
            diff = bounds(go(binary("-", x.a, x.b)), rng)
            if diff is not None:
                lo, hi = diff
                verdict = {"<": (hi < 0, lo >= 0), "<=": (hi <= 0, lo > 0),
                           ">": (lo > 0, hi <= 0), ">=": (lo >= 0, hi < 0)}[x.op]
                if verdict[0]:
                    return Const(True, "bool")
                if verdict[1]:
                    return Const(False, "bool")
        if x.op in ("min", "max") and is_int(x.dtype):
            a, b = bounds(x.a, rng), bounds(x.b, rng)
            if a is not None and b is not None:
                first = a[1] <= b[0] if x.op == "min" else a[0] >= b[1]
                second = b[1] <= a[0] if x.op == "min" else b[0] >= a[1]
                if first:
                    return x.a
                if second:
                    return x.b
        return x

    return go(e)


def _reads_data(e: Binary) -> bool:
    """Whether ``e`` computes on loaded values rather than indices.  Such integer arithmetic wraps at its
    dtype's width (``int8(100) * 2 // 2`` is -28, not 100), which the affine algebra here does not model: it
    is left as written, so a schedule never changes what a func computes.  (int8 arithmetic is left as
    written even on indices: at 8 bits ``int8(i) * 2 // 2`` wraps from i = 64.)"""
    return any(isinstance(n, Load) for n in walk(e))


def _fold_divmod(terms: dict[Expr, int], c: int) -> Affine:
    """``k * c * (a // c) + k * (a % c)`` -> ``k * a``: a fused loop's index taken apart and put back together
    (the flat address of ``X[f // 37, f % 37]``) is the fused index again.  Exact for any sign under floor
    and under truncating division alike, since both keep ``a == (a // c) * c + a % c``."""
    for atom, k in list(terms.items()):
        if not (isinstance(atom, Binary) and atom.op == "%" and isinstance(atom.b, Const)):
            continue
        div = Binary("//", atom.a, atom.b, atom.dtype)
        if atom not in terms or terms.get(div) != k * int(atom.b.value):
            continue
        del terms[atom], terms[div]
        inner, ci = to_affine(atom.a)
        for a, ka in inner.items():
            terms[a] = terms.get(a, 0) + k * ka
        terms = {a: v for a, v in terms.items() if v != 0}
        c += k * ci
    return terms, c


def _simplify_divmod(x: Binary, c: int, rng: Ranges) -> Expr:
    terms, k0 = to_affine(x.a)
    whole = {a: k // c for a, k in terms.items() if k % c == 0}
    rest = {a: k for a, k in terms.items() if k % c != 0}
    rest_expr = from_affine(rest, k0 % c, x.dtype)
    rb = bounds(rest_expr, rng)
    if rb is not None and rb[0] >= 0 and rb[1] < c:
        if x.op == "//":
            return from_affine(whole, k0 // c, x.dtype)
        return rest_expr
    if x.op == "%" and not rest and k0 % c == 0:
        return Const(0, x.dtype)
    if whole and rest and rb is not None and rb[0] >= 0:
        # (c*w + r) // c = w + r // c and (c*w + r) % c = r % c; the generated code divides with C's
        # truncation, which agrees with this only while both parts are non-negative
        whole_expr = from_affine(whole, k0 // c, x.dtype)
        wb = bounds(whole_expr, rng)
        if wb is not None and wb[0] >= 0:
            inner = _simplify_divmod(Binary(x.op, rest_expr, x.b, x.dtype), c, rng)
            return inner if x.op == "%" else simplify(binary("+", whole_expr, inner), rng)
    return x


def is_true(e: Expr) -> bool:
    return isinstance(e, Const) and e.value is True


def conjuncts(e: Expr | None) -> list[Expr]:
    """Split a conjunction into its parts (an absent predicate has none)."""
    if e is None or is_true(e):
        return []
    if isinstance(e, Binary) and e.op == "and":
        return conjuncts(e.a) + conjuncts(e.b)
    return [e]


def conjunction(parts: Iterable[Expr]) -> Expr | None:
    out: Expr | None = None
    seen: list[Expr] = []
    for p in parts:
        if is_true(p) or p in seen:
            continue
        seen.append(p)
        out = p if out is None else binary("and", out, p)
    return out


def is_var(e: Expr, name: str | None = None) -> bool:
    return isinstance(e, Var) and (name is None or e.name == name)


def var_ranges(extents: Mapping[str, Expr]) -> dict[str, tuple[int, int]]:
    """Ranges of loop variables whose extents are constants: [0, extent - 1]."""
    out: dict[str, tuple[int, int]] = {}
    for name, ext in extents.items():
        if isinstance(ext, Const):
            out[name] = (0, int(ext.value) - 1)
    return out


def var(name: str) -> Var:
    return Var(name)
