"""Search strategies: who proposes the next config, and how the cost model screens the proposals.

Every strategy plugs into Optuna through one sampler, :class:`GuidedSampler`, which asks the strategy for
the whole config at once.  That keeps all bookkeeping in the Optuna study (resume, many workers, one
storage) while letting the strategy decide freely:

* Optuna samplers (``tpe``, ``nsga2``, ``random``) are wrapped by :class:`OptunaStrategy`: it draws from the
  sampler until it has a legal config nobody recorded or claimed yet; once the cost model is trained it
  draws ``screen`` such configs and keeps the one the model predicts fastest ("sample K from the sampler's
  distribution, measure the predicted best").  Random search stays unscreened: it is the baseline.
* ``cmaes`` is Optuna's CMA-ES with a margin for the integer (value-index) knobs.  Its proposals are never
  replaced - CMA-ES pairs each value with the exact point it sampled - so an illegal point becomes a typed
  ``illegal`` failure and a point proposed again is answered from the record (``cached``).  It is not
  screened for the same reason: a pre-selected sample would bias the covariance update.
* ``grid`` walks the legal points in order; ``evolutionary`` lives in ``evolutionary.py``.
"""

from __future__ import annotations

import random
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

from schedlib.rules.base import Config
from schedlib.search.codec import SpaceCodec
from schedlib.search.cost_model import CostModel
from schedlib.search.database import RecordIndex

STRATEGIES = ("tpe", "cmaes", "nsga2", "random", "grid", "evolutionary")
DEFAULT_SCREEN = {"tpe": 16, "nsga2": 16}  # candidates screened per trial (benchmarks/search_strategies.py)


@dataclass
class Proposal:
    config: Config
    source: str


@dataclass
class SearchContext:
    """What a strategy may look at: the space, the records (all workers), the model, a seeded RNG."""

    codec: SpaceCodec
    index: RecordIndex
    model: CostModel | None
    rng: random.Random
    current: int | None = None  # number of the trial being proposed
    force_fill: bool = False  # set by the tuner when a strategy keeps proposing known points
    fill_failed: bool = False  # the last forced fill found no unrecorded point (the space may be used up)
    sources: dict[int, str] = field(default_factory=dict)

    def taken(self) -> set[str]:
        return self.index.taken(exclude=self.current)

    def fill(self, taken: set[str] | None = None) -> Proposal | None:
        config = self.codec.unrecorded(self.rng, self.taken() if taken is None else taken)
        return None if config is None else Proposal(config, "fill")

    def screen(self, candidates: Sequence[Config]) -> int:
        """Index of the candidate the model predicts fastest (the first when the model is not trained)."""
        if len(candidates) < 2 or self.model is None or not self.model.trained:
            return 0
        return int(np.argmin(self.model.predict(list(candidates))))


class Strategy(ABC):
    """Proposes one config per trial; ``uses_model`` asks the tuner to keep the cost model trained."""

    name = "strategy"
    uses_model = False
    substitutes = True  # may a proposal be replaced by another config (dedupe, legality)?

    def __init__(self) -> None:
        self._ctx: SearchContext | None = None

    @property
    def ctx(self) -> SearchContext:
        if self._ctx is None:
            raise RuntimeError(f"strategy {self.name} is not bound to a search yet")
        return self._ctx

    def bind(self, ctx: SearchContext) -> None:
        self._ctx = ctx

    @abstractmethod
    def propose(self, study: optuna.Study, trial: FrozenTrial) -> Proposal | None:
        """The next config to measure (None: nothing left to propose)."""

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        return None

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        return None


class GuidedSampler(BaseSampler):
    """The one Optuna sampler of every study: the whole config comes from the strategy, relative to the
    fixed search space of value indices; enqueued (warm-start) trials keep their fixed params."""

    def __init__(self, strategy: Strategy) -> None:
        self.strategy = strategy

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return dict(self.strategy.ctx.codec.distributions)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if not search_space or trial.system_attrs.get("fixed_params"):
            return {}
        ctx = self.strategy.ctx
        ctx.current = trial.number
        proposal = None
        if ctx.force_fill:  # bypass the strategy: no sampler state (e.g. CMA-ES's) is attached to this trial
            ctx.force_fill = False
            proposal = ctx.fill()
            ctx.fill_failed = proposal is None
        if proposal is None:
            proposal = self.strategy.propose(study, trial)
        if proposal is None:
            return {}
        ctx.sources[trial.number] = proposal.source
        return ctx.codec.encode(proposal.config)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        low, high = param_distribution.low, param_distribution.high  # type: ignore[attr-defined]
        return self.strategy.ctx.rng.randint(low, high)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.strategy.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self.strategy.after_trial(study, trial, state, values)


class OptunaStrategy(Strategy):
    """An Optuna sampler as proposer, with dedupe, legality filtering and cost-model screening."""

    def __init__(self, name: str, sampler: BaseSampler, screen: int = 0, substitutes: bool = True,
                 max_draws: int = 16) -> None:
        super().__init__()
        self.name, self.sampler, self.screen_k = name, sampler, screen
        self.substitutes, self.max_draws = substitutes, max_draws
        self.uses_model = screen > 1

    def draw(self, study: optuna.Study, trial: FrozenTrial) -> Config:
        codec = self.ctx.codec
        space = self.sampler.infer_relative_search_space(study, trial)
        params = dict(self.sampler.sample_relative(study, trial, space)) if space else {}
        for name, dist in codec.distributions.items():
            if name not in params:
                params[name] = self.sampler.sample_independent(study, trial, name, dist)
        return codec.decode(params)

    def draws(self, study: optuna.Study, trial: FrozenTrial, n: int) -> Iterator[Config]:
        """Up to ``n`` draws.  A sampler that ranks candidates of its own (:class:`RankingTPESampler`) gives
        them from one fit; any other is asked ``n`` times."""
        ranked = getattr(self.sampler, "take_ranked", None)
        if ranked is not None:
            ranked()  # forget the candidates of an earlier trial's fit
        for i in range(n):
            if i == 1 and ranked is not None:
                candidates = ranked()
                if candidates:
                    codec = self.ctx.codec
                    yield from (codec.decode(params) for params in candidates[1:n])
                    return
            yield self.draw(study, trial)

    def propose(self, study: optuna.Study, trial: FrozenTrial) -> Proposal | None:
        ctx = self.ctx
        if not self.substitutes:
            return Proposal(self.draw(study, trial), self.name)
        taken = ctx.taken()
        screening = self.screen_k > 1 and ctx.model is not None and ctx.model.trained
        # Screening spends its K draws whatever they turn out to be (a draw of a converged TPE costs tens
        # of ms and often repeats a recorded point); without screening, draw until one is new.
        draws, want = (self.screen_k, self.screen_k) if screening else (self.max_draws, 1)
        candidates: list[Config] = []
        seen: set[str] = set()
        for config in self.draws(study, trial, draws):
            key = ctx.codec.key(config)
            if key in taken or key in seen or not ctx.codec.space.is_legal(config):
                continue
            seen.add(key)
            candidates.append(config)
            if len(candidates) >= want:
                break
        if not candidates:
            return ctx.fill(taken)
        best = ctx.screen(candidates)
        return Proposal(candidates[best], f"{self.name}+model" if len(candidates) > 1 else self.name)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.sampler.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self.sampler.after_trial(study, trial, state, values)


class RankingTPESampler(optuna.samplers.TPESampler):
    """TPE that keeps the candidates of its last fit, best expected improvement first.

    Why: screening wants K proposals from the sampler's distribution.  TPE already draws ``n_ei_candidates``
    points from its "good" density and ranks them by l(x)/g(x); asking it K times refits both densities on
    every record K times (about 10 ms each at 500 records).  Keeping the ranked list of one fit gives the same
    kind of proposals for the price of one.  The hook is Optuna's acquisition step; if a future Optuna no longer
    calls it, :meth:`take_ranked` returns nothing and the strategy falls back to asking K times.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._ranked: list[dict[str, int]] = []

    def _compute_acquisition_func(self, samples: dict[str, np.ndarray], mpe_below: Any, mpe_above: Any) -> Any:
        values = super()._compute_acquisition_func(samples, mpe_below, mpe_above)
        order = np.argsort(-np.asarray(values), kind="stable")
        self._ranked = [{name: round(float(column[i])) for name, column in samples.items()} for i in order]
        return values

    def take_ranked(self) -> list[dict[str, int]]:
        """The ranked candidates (value indices) of the last fit, once; empty when there was no fit."""
        ranked, self._ranked = self._ranked, []
        return ranked


class GridStrategy(Strategy):
    """Exhaustive: the legal points in lexicographic knob order, skipping recorded and claimed ones."""

    name = "grid"

    def __init__(self) -> None:
        super().__init__()
        self._points: Iterator[Config] | None = None

    def propose(self, study: optuna.Study, trial: FrozenTrial) -> Proposal | None:
        codec, taken = self.ctx.codec, self.ctx.taken()
        if self._points is None:  # a space too large to list is walked lazily, in the same order
            self._points = iter(codec.legal()) if codec.enumerable else codec.space.enumerate()
        for config in self._points:
            if codec.key(config) not in taken:
                return Proposal(dict(config), "grid")
        return self.ctx.fill(taken)


def make_strategy(name: str, seed: int = 0, screen: int | None = None) -> Strategy:
    """A fresh strategy by name; ``screen`` (K candidates screened by the model) overrides the default."""
    k = DEFAULT_SCREEN.get(name, 0) if screen is None else int(screen)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if name == "tpe":
            return OptunaStrategy("tpe", RankingTPESampler(
                seed=seed, multivariate=True, constant_liar=True, n_startup_trials=10,
                n_ei_candidates=max(24, 3 * k)), screen=k)
        if name == "cmaes":
            try:
                import cmaes  # noqa: F401 - Optuna's CmaEsSampler imports it lazily, mid-search
            except ImportError:
                raise ImportError("strategy 'cmaes' needs the 'cmaes' package (pip install cmaes), which "
                                  "Optuna's CmaEsSampler uses") from None
            from schedlib.search.cma_sampler import InMemoryCmaEsSampler

            return OptunaStrategy("cmaes", InMemoryCmaEsSampler(
                seed=seed, with_margin=True, n_startup_trials=1, warn_independent_sampling=False,
                independent_sampler=optuna.samplers.RandomSampler(seed=seed)), screen=0, substitutes=False)
        if name == "nsga2":
            return OptunaStrategy("nsga2", optuna.samplers.NSGAIISampler(seed=seed, population_size=16), screen=k)
        if name == "random":
            return OptunaStrategy("random", optuna.samplers.RandomSampler(seed=seed), screen=k)
        if name == "grid":
            return GridStrategy()
        if name == "evolutionary":
            from schedlib.search.evolutionary import EvolutionaryStrategy

            return EvolutionaryStrategy()
    raise ValueError(f"unknown strategy {name!r}; expected one of {list(STRATEGIES)}")
