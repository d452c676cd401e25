"""Every strategy on the replay backend: exhausts a small space without repeating itself (so it finds the
known best), and the model-guided ones beat random search on a structured recorded space."""

from __future__ import annotations

import numpy as np
import pytest

import schedlib.search as S
from schedlib.search.records import COUNTED, trials_to_reach

from .helpers import CountingReplay, ToyRule, matmul_table, toy_func, toy_table, toy_time

ALL = list(S.STRATEGIES)


def _needs(strategy: str) -> None:
    if strategy == "cmaes":
        pytest.importorskip("cmaes", reason="Optuna's CMA-ES sampler needs the 'cmaes' package")


@pytest.mark.parametrize("strategy", ALL)
def test_every_strategy_finds_the_known_best_of_a_small_space(strategy: str) -> None:
    _needs(strategy)
    rule, func = ToyRule(), toy_func()
    backend = CountingReplay(toy_table(rule, func))
    legal = len(list(rule.space(func, "h100").enumerate()))
    res = S.tune(func, "h100", trials=legal, strategy=strategy, storage="memory", backend=backend, rule=rule,
                 quiet=True, seed=3)
    best_config, best_time = backend.best
    assert res.best_config == best_config
    assert res.best_time_us == pytest.approx(best_time)
    assert res.best_schedule is not None and res.best_schedule.config == best_config
    measured = [S.config_key(c) for c in backend.measured]
    assert len(measured) == len(set(measured)) == legal, "a config was measured twice or one was skipped"
    counted = res.records[res.records["status"].isin(COUNTED)]
    assert len(counted) == legal and counted["config_key"].is_unique
    assert list(res.history.index) == list(range(1, legal + 1))
    assert res.history.iloc[-1] == pytest.approx(best_time)
    # the history against a best-so-far computed independently, from what the backend measured in order
    expected = np.minimum.accumulate([toy_time(c) for c in backend.measured])
    assert res.history.to_numpy() == pytest.approx(expected)


@pytest.mark.parametrize("strategy", ["tpe", "nsga2", "evolutionary"])
def test_model_guided_strategies_beat_random_on_a_structured_space(strategy: str) -> None:
    func, table = matmul_table(1024, 1024, 1024, seed=1)
    backend = S.ReplayBackend(table)
    _, best = backend.best
    target = best / 0.97
    good = sum(1 for r in table if r["time_us"] <= target)
    random_expected = (len(table) + 1) / (good + 1)  # uniform sampling without replacement
    assert random_expected > 300, "the space should make random search slow (few configs within 3%)"
    needed = []
    for seed in (0, 1):
        res = S.tune(func, "h100", trials=150, strategy=strategy, storage="memory", backend=backend, quiet=True,
                     seed=seed, warm_start=False, features="knobs", stop_below_us=target)
        needed.append(trials_to_reach(res.history, target))
    assert None not in needed, f"{strategy} did not get within 3% of the best in 150 trials: {needed}"
    assert sum(needed) / len(needed) <= random_expected / 3, (needed, random_expected)


def test_cmaes_records_illegal_points_as_typed_failures() -> None:
    _needs("cmaes")
    rule, func = ToyRule(), toy_func()
    res = S.tune(func, "h100", trials=20, strategy="cmaes", storage="memory", backend=S.ReplayBackend(toy_table()),
                 rule=rule, quiet=True, seed=0, warm_start=False)
    trials = res.trials
    illegal = trials[trials["status"] == "illegal"]
    assert len(illegal) > 0, "the toy space is 1/8 illegal; CMA-ES should have proposed some illegal point"
    assert (illegal["a"] + illegal["b"] > 5).all()
    assert illegal["error"].str.contains("a \\+ b > 5").all()
    assert (res.records["status"].isin(COUNTED)).sum() == 20


def test_screening_uses_the_model_once_it_is_trained() -> None:
    func, table = matmul_table(512, 512, 512)
    res = S.tune(func, "h100", trials=30, strategy="tpe", storage="memory", backend=S.ReplayBackend(table),
                 quiet=True, warm_start=False, features="knobs")
    sources = set(res.records["source"])
    assert "tpe+model" in sources, sources
    assert res.cost_model is not None and res.cost_model.trained


def test_unknown_strategy_and_bad_trials_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown strategy 'annealing'"):
        S.tune(toy_func(), "h100", trials=4, strategy="annealing", storage="memory",
               backend=S.ReplayBackend(toy_table()), rule=ToyRule())
    with pytest.raises(ValueError, match="trials=0"):
        S.tune(toy_func(), "h100", trials=0, storage="memory", backend=S.ReplayBackend(toy_table()), rule=ToyRule())


def test_tpe_screens_its_ranked_candidates_from_one_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Screening K TPE proposals costs one Parzen fit, not K (the step overhead at 500 records)."""
    from optuna.samplers import TPESampler

    from schedlib.search.strategies import RankingTPESampler, make_strategy

    fits = []
    real = TPESampler._sample

    def counting(self, study, trial, search_space):
        fits.append(trial.number)
        return real(self, study, trial, search_space)

    monkeypatch.setattr(TPESampler, "_sample", counting)
    strategy = make_strategy("tpe", seed=0)
    assert isinstance(strategy.sampler, RankingTPESampler) and strategy.screen_k == 16
    func, table = matmul_table(512, 512, 512)
    res = S.tune(func, "h100", trials=40, strategy="tpe", storage="memory", backend=S.ReplayBackend(table),
                 quiet=True, warm_start=False, features="knobs")
    # keyed by Optuna's trial number, as ``fits`` is (the ``trial`` column is the 1-based budget count)
    sources = res.records.set_index("number")["source"]
    screened = sources[sources == "tpe+model"]
    assert len(screened) >= 10, "the model should screen TPE's candidates once it is trained"
    per_trial = {int(n): fits.count(int(n)) for n in screened.index}
    # before TPE's 10 startup trials it samples independently (no fit at all); after, one fit per trial
    assert all(per_trial[n] == 0 for n in per_trial if n < 10), per_trial
    assert all(per_trial[n] == 1 for n in per_trial if n >= 10), per_trial


def test_ranked_candidates_are_legal_value_indices_best_first() -> None:
    import optuna

    from schedlib.search.strategies import RankingTPESampler

    sampler = RankingTPESampler(seed=1, n_startup_trials=3, n_ei_candidates=12, multivariate=True)
    study = optuna.create_study(sampler=sampler)
    study.optimize(lambda t: (t.suggest_int("a", 0, 5) - 2) ** 2 + t.suggest_int("b", 0, 3), n_trials=12)
    assert sampler.take_ranked(), "the last trial's fit left its candidates"
    assert sampler.take_ranked() == [], "candidates are handed out once"
    trial = study.ask()
    params = sampler.sample_relative(study, optuna.trial.FrozenTrial(
        number=trial.number, state=optuna.trial.TrialState.RUNNING, value=None, datetime_start=None,
        datetime_complete=None, params={}, distributions={}, user_attrs={}, system_attrs={},
        intermediate_values={}, trial_id=trial._trial_id), study._get_trials(deepcopy=False)[0].distributions)
    ranked = sampler.take_ranked()
    assert len(ranked) == 12 and ranked[0] == params, "TPE's own pick heads the list"
    assert all(0 <= c["a"] <= 5 and 0 <= c["b"] <= 3 and isinstance(c["a"], int) for c in ranked)


def test_spread_starts_far_apart_and_never_repeats() -> None:
    import random

    from schedlib.search.codec import SpaceCodec

    rule, func = ToyRule(), toy_func()
    codec = SpaceCodec(rule.space(func, "h100"))
    rng = random.Random(0)
    first = codec.spread(rng, set(), 4)
    keys = [codec.key(c) for c in first]
    assert len(set(keys)) == 4 and all(codec.space.is_legal(c) for c in first)
    idx = [[k.values.index(c[k.name]) for k in codec.free] for c in first]
    # after a random first point, max-min distance reaches the far corners of the index box
    far = max(sum(abs(a - b) for a, b in zip(idx[0], other)) for other in idx[1:])
    assert far >= max(len(k.values) - 1 for k in codec.free)
    rest = codec.spread(rng, set(keys), len(codec.legal()))
    assert not set(keys) & {codec.key(c) for c in rest}
    assert len(rest) == len(codec.legal()) - 4, "every untried legal point is handed out exactly once"


def test_evolutionary_refines_the_incumbent_with_a_neighbour() -> None:
    func, table = matmul_table(512, 512, 512)
    res = S.tune(func, "h100", trials=40, strategy="evolutionary", storage="memory",
                 backend=S.ReplayBackend(table), quiet=True, warm_start=False, features="knobs")
    from schedlib.hw import resolve
    from schedlib.rules import find_rule

    profile = resolve("h100")
    codec = S.SpaceCodec(find_rule(func, profile).space(func, profile))
    rows = res.records.sort_values("trial")
    assert set(rows["source"].iloc[:4]) == {"spread"}, "the model is untrained: the first batch is spread out"
    local = rows[rows["source"] == "evolutionary+local"]
    assert len(local) >= 5
    for _, row in local.iterrows():  # each differs in one knob by one step from a config measured before it
        before = rows[rows["trial"] < row["trial"]]
        steps = [sum(abs(k.values.index(row["config"][k.name]) - k.values.index(c[k.name])) for k in codec.free)
                 for c in before["config"]]
        assert 1 in steps


def test_grid_walks_a_space_too_large_to_list(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the codec's listing limit (the fp16 matmul space's product is 403,200 points) the grid takes the
    legal points lazily, in the same lexicographic order, instead of refusing."""
    import schedlib.search.codec as codec

    rule, func = ToyRule(), toy_func()
    legal = list(rule.space(func, "h100").enumerate())
    monkeypatch.setattr(codec, "ENUMERATE_LIMIT", 3)
    backend = CountingReplay(toy_table(rule, func))
    S.tune(func, "h100", trials=5, strategy="grid", storage="memory", backend=backend, rule=rule, quiet=True,
           warm_start=False)
    assert [S.config_key(c) for c in backend.measured] == [S.config_key(c) for c in legal[:5]]
