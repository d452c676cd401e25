"""A measuring-worker handler that breaks the reply protocol on purpose, for configs with b == 1 (the mode is
chosen by a and c); every other config answers a valid time.  Runs inside the worker process."""

from __future__ import annotations

from typing import Any

# (a, c) -> what the handler answers for b == 1; the keys the tests check against
MODES = {
    (0, 1): "none", (0, 2): "list", (0, 4): "unsendable",
    (1, 1): "zeros", (1, 2): "some_zero", (1, 4): "nan",
    (2, 1): "negative", (2, 2): "text", (2, 4): "empty",
    (3, 1): "inf", (3, 2): "times_not_list", (3, 4): "bad_status",
}


class MalformedHandler:
    def __init__(self, init: dict[str, Any]) -> None:
        self.info: dict[str, Any] = {}

    def handle(self, request: dict[str, Any]) -> Any:
        c = request["config"]
        t = 10.0 + c["a"] + c["b"] + c["c"]
        mode = MODES.get((c["a"], c["c"])) if c["b"] == 1 else None
        replies: dict[str | None, Any] = {
            "none": None, "list": [1, 2], "unsendable": {"status": "ok", "times_us": [object()]},
            "zeros": {"status": "ok", "times_us": [0.0, 0.0, 0.0]},
            "some_zero": {"status": "ok", "times_us": [0.0, 0.5, 0.5]},
            "nan": {"status": "ok", "times_us": [float("nan")]},
            "negative": {"status": "ok", "times_us": [-3.0]},
            "text": {"status": "ok", "time_us": "fast"}, "empty": {"status": "ok", "times_us": []},
            "inf": {"status": "ok", "time_us": float("inf")}, "times_not_list": {"status": "ok", "times_us": 5},
            "bad_status": {"status": ["ok"], "error_type": {"x": 1}},
        }
        return replies.get(mode, {"status": "ok", "times_us": [t, t, t]})
