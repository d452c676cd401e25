"""The XGBoost cost model: it must rank held-out configs of a structured space well, treat failures as
slow, survive non-finite features, and be exposed on the tuning result."""

from __future__ import annotations

import math
import random

import numpy as np
import pandas as pd
import pytest

import schedlib.search as S
from schedlib.hw import resolve
from schedlib.rules import find_rule

from .helpers import matmul_table


def _model(func, objective: str = "regression", carver: bool | str = False) -> S.CostModel:
    profile = resolve("h100")
    rule = find_rule(func, profile)
    return S.CostModel(S.Featurizer(func, profile, rule, rule.space(func, profile), carver=carver),
                       objective=objective, seed=0)


def _split(table, n_train: int, seed: int = 0):
    rows = list(table)
    random.Random(seed).shuffle(rows)
    return rows[:n_train], rows[n_train:]


@pytest.mark.parametrize("objective", ["regression", "rank"])
def test_rank_correlation_on_held_out_records(objective: str) -> None:
    func, table = matmul_table(2048, 2048, 1024, seed=2)
    train, test = _split(table, 200)
    model = _model(func, objective).fit([r["config"] for r in train], [r["time_us"] for r in train])
    score = model.rank_correlation([r["config"] for r in test], [r["time_us"] for r in test])
    assert score["n"] == len(test)
    assert score["spearman"] > 0.85 and score["kendall"] > 0.65, score


def test_an_untrained_model_refuses_to_predict_and_a_shuffled_target_ranks_badly() -> None:
    func, table = matmul_table(1024, 1024, 1024)
    model = _model(func)
    with pytest.raises(RuntimeError, match="not been trained"):
        model.predict([table[0]["config"]])
    train, test = _split(table, 200)
    times = [r["time_us"] for r in train]
    random.Random(5).shuffle(times)  # no relation left between configs and times
    model.fit([r["config"] for r in train], times)
    score = model.rank_correlation([r["config"] for r in test], [r["time_us"] for r in test])
    assert abs(score["spearman"]) < 0.3, score


def test_failures_train_as_slow() -> None:
    func, table = matmul_table(1024, 1024, 1024)
    train, test = _split(table, 300)
    # every config with block_m == 16 "crashed": the model must learn to rank that region last
    times = [math.inf if r["config"]["block_m"] == 16 else r["time_us"] for r in train]
    model = _model(func).fit([r["config"] for r in train], times)
    pred = model.predict([r["config"] for r in test])
    crashed = np.array([r["config"]["block_m"] == 16 for r in test])
    assert pred[crashed].min() > np.median(pred[~crashed])


def test_update_retrains_only_when_the_data_grew_enough() -> None:
    func, table = matmul_table(1024, 1024, 1024)
    model = _model(func)
    recs = [S.database.Record(i, "ok", r["time_us"], r["config"]) for i, r in enumerate(table[:100])]
    assert not model.update(recs[:5])  # below min_train
    assert model.update(recs[:20]) and model.fits == 1
    assert not model.update(recs[:22]) and model.fits == 1
    assert model.update(recs[:40]) and model.fits == 2 and model.n_train == 40


def test_non_finite_features_become_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """An inf from the tiling figures goes through vector(), which must turn it into NaN ("missing"):
    XGBoost rejects inf outright."""
    func, table = matmul_table(256, 256, 256)
    model = _model(func)
    feat = model.featurizer
    real = feat._tiling_values
    bad = S.config_key(table[0]["config"])

    def tiling(config):
        values = real(config)
        if S.config_key(config) == bad:
            values[0], values[1] = math.inf, -math.inf
        return values

    monkeypatch.setattr(feat, "_tiling_values", tiling)
    vec = feat.vector(table[0]["config"])
    first = len(feat.knobs)  # the tiling features follow the knobs
    assert np.isnan(vec[first]) and np.isnan(vec[first + 1]), vec
    assert np.isfinite(feat.vector(table[1]["config"])[first])
    model.fit([r["config"] for r in table[:50]], [r["time_us"] for r in table[:50]])
    assert np.isfinite(model.predict([table[0]["config"]])).all()


def test_carver_figures_become_features() -> None:
    func, table = matmul_table(1024, 1024, 1024)
    model = _model(func, carver=True)
    names = model.featurizer.names
    assert any(n.startswith("carver:") for n in names), names
    assert "carver:est_time_us" in names
    train, test = _split(table, 150)
    model.fit([r["config"] for r in train], [r["time_us"] for r in train])
    assert model.rank_correlation([r["config"] for r in test], [r["time_us"] for r in test])["spearman"] > 0.8


def test_tune_exposes_a_model_that_evaluates_on_held_out_records() -> None:
    func, table = matmul_table(1024, 1024, 1024, seed=4)
    res = S.tune(func, "h100", trials=120, strategy="random", storage="memory", backend=S.ReplayBackend(table),
                 quiet=True, warm_start=False, features="knobs")
    assert res.cost_model is not None and res.cost_model.n_train == 120
    seen = set(res.records["config_key"])
    held_out = pd.DataFrame([{**r, "status": "ok"} for r in table if S.config_key(r["config"]) not in seen])
    assert len(held_out) == len(table) - 120
    score = res.cost_model.evaluate(held_out)
    assert score["n"] == len(held_out) and score["spearman"] > 0.8, score


def test_replay_gaps_do_not_train_the_model() -> None:
    func, table = matmul_table(1024, 1024, 1024, seed=4)
    recorded = table[::2]  # half the space is missing from the recording
    res = S.tune(func, "h100", trials=80, strategy="random", storage="memory", backend=S.ReplayBackend(recorded),
                 quiet=True, warm_start=False, features="knobs")
    statuses = res.records["status"].value_counts().to_dict()
    assert statuses.get("not_recorded", 0) > 10, statuses
    assert res.cost_model is not None and res.cost_model.n_train == statuses["ok"]


@pytest.mark.parametrize("objective", ["regression", "rank"])
def test_ctrl_c_during_training_arrives_after_the_fit(objective: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An interrupt that lands inside XGBoost's native training is held until the fit returns: the model is
    whole, and the KeyboardInterrupt reaches the caller (it was lost, or raised as an XGBoostError)."""
    import os
    import signal

    import xgboost

    func, table = matmul_table(1024, 1024, 1024)
    cls = xgboost.XGBRegressor if objective == "regression" else xgboost.XGBRanker
    real_fit = cls.fit

    def interrupted_fit(self: object, *args: object, **kwargs: object) -> object:
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, delivered while the fit runs
        return real_fit(self, *args, **kwargs)

    monkeypatch.setattr(cls, "fit", interrupted_fit)
    model = _model(func, objective)
    with pytest.raises(KeyboardInterrupt):
        model.fit([r["config"] for r in table[:40]], [r["time_us"] for r in table[:40]])
    assert model.trained and model.fits == 1 and model.n_train == 40
    assert np.isfinite(model.predict([r["config"] for r in table[40:50]])).all()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back


@pytest.mark.parametrize("objective", ["regression", "rank"])
def test_a_model_that_predicts_one_cost_says_so_instead_of_nan(objective: str) -> None:
    """Trained on records that all took the same time, the model predicts one cost for everything: the
    correlation is undefined, and evaluate says why (it returned {'spearman': nan, 'kendall': nan})."""
    func, table = matmul_table(1024, 1024, 1024)
    model = _model(func, objective).fit([r["config"] for r in table[:6]], [5.0] * 6)
    held_out = pd.DataFrame([{**r, "status": "ok"} for r in table[10:40]])
    with pytest.raises(ValueError, match=r"predicts the same cost for all 30 records.* trained on 6 records"):
        model.evaluate(held_out)
