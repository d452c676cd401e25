"""Checks on what search is given: the arguments of ``tune``/``apply_best`` and the records read back.

Why records are checked: a tuning database is a file anyone can edit, copy half-written or corrupt.  A
record is only used when it could have been written by ``tune`` itself - its config is a point of the rule's
current space and is the config its config_key names, and an ok time is a finite positive number - so one
damaged row costs that row, never the whole study, and a NaN or negative time can never become "the best".
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from schedlib.errors import SchedlibError
from schedlib.hw import HardwareProfile
from schedlib.ir.func import Func
from schedlib.rules import find_rule, get_rule
from schedlib.rules.base import Rule, Space
from schedlib.search.records import COUNTED, OK, RECORDS, config_key

log = logging.getLogger("schedlib.search")


def pick_rule(func: Func, profile: HardwareProfile, rule: Rule | str | None) -> Rule:
    """The rule that takes ``func``: the first that applies, or the named one if it applies."""
    if rule is None:
        return find_rule(func, profile)
    chosen = get_rule(rule) if isinstance(rule, str) else rule
    why = chosen.applies(func, profile)
    if why is not None:
        raise SchedlibError(f"rule {chosen.name} does not apply to {func.name}: {why}")
    return chosen


def time_problem(value: Any) -> str | None:
    """Why ``value`` is not a usable measured time in microseconds (None when it is)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"time_us={value!r} is not a number"
    if not (math.isfinite(value) and value > 0):
        return f"time_us={value!r} is not a finite positive number"
    return None


def record_problem(attrs: Any, space: Space | None) -> str | None:
    """Why a trial's stored attributes are not a usable record (None when they are)."""
    if not isinstance(attrs, Mapping):
        return f"its attributes are a {type(attrs).__name__}, not an object"
    status = attrs.get("status")
    if status is not None and not isinstance(status, str):  # before the set lookup: a list is unhashable
        return f"status={status!r} is not a string"
    if status not in RECORDS:
        return None
    config = attrs.get("config")
    if not isinstance(config, Mapping):
        return f"config={config!r} is not an object" if "config" in attrs else "it has no config"
    if not isinstance(attrs.get("config_key"), str):
        return f"config_key={attrs.get('config_key')!r} is not a string"
    # the key is the record's identity (what is deduplicated, re-benchmarked, never measured again): a config
    # edited apart from it would carry another config's time, or hide the config it names
    try:
        key = config_key(config)
    except (TypeError, ValueError) as exc:
        return f"config {config!r} cannot be keyed ({exc})"
    if key != attrs["config_key"]:
        return f"config {key} does not match its config_key {attrs['config_key']}"
    if status == OK:
        why = time_problem(attrs.get("time_us"))
        if why is not None:
            return why
    if space is not None and status in COUNTED:  # an illegal record is allowed to hold an illegal config
        why = space.reason(config)
        if why is not None:
            return f"config {dict(config)} is not in the {space.rule} space ({why})"
    return None


class SkipTally:
    """Counts skipped rows and reports them in one warning, naming the storage and the first reason."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.seen: set[Any] = set()
        self.count = 0
        self.first: str | None = None

    def skip(self, ident: Any, reason: str) -> None:
        if ident in self.seen:
            return  # a row re-read on the next refresh is reported once
        self.seen.add(ident)
        self.count += 1
        self.first = self.first or f"{ident}: {reason}"

    def report(self) -> None:
        if self.count:
            log.warning("%s: skipped %d malformed record(s) (first: %s)", self.where, self.count, self.first)
            self.count, self.first = 0, None
