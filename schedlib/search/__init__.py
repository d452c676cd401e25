"""Measured search over a rule's knob space: ``tune`` finds, ``apply_best`` reuses.

    import schedlib as sl, schedlib.search
    res = sl.search.tune(sl.workloads.matmul(4096, 4096, 4096), "h100", trials=200, strategy="evolutionary",
                         backend="gpu")
    sch = sl.search.apply_best(sl.workloads.matmul(4096, 4096, 4096), "h100")   # later, instantly

Modules: ``tune`` (arguments and result), ``loop`` (the loop), ``guard`` (one measurement that cannot abort
it), ``strategies``/``evolutionary`` (proposers), ``cost_model`` (XGBoost screening), ``database`` (keys,
storage, resume), ``records`` (statuses and tables), ``backends`` (``estimate``, ``replay``, ``gpu`` and the
worker process).
"""

from __future__ import annotations

from schedlib.search.apply import apply_best
from schedlib.search.backends import Backend, make_backend
from schedlib.search.backends.estimate import EstimateBackend
from schedlib.search.backends.gpu import GpuBackend, naive_reference_schedule
from schedlib.search.backends.replay import ReplayBackend, read_recording, write_recording
from schedlib.search.backends.worker import SubprocessBackend, WorkerSetupError
from schedlib.search.codec import SpaceCodec
from schedlib.search.cost_model import CostModel, Featurizer
from schedlib.search.database import SCHEMA_VERSION, NoRecordError, TuningKey, workload_hash
from schedlib.search.guard import InProcessTimeoutError
from schedlib.search.records import Measurement, config_key, trials_to_reach
from schedlib.search.storage import StorageError
from schedlib.search.strategies import STRATEGIES
from schedlib.search.tune import TuneResult, tune

__all__ = [
    "SCHEMA_VERSION", "STRATEGIES", "Backend", "CostModel", "EstimateBackend", "Featurizer", "GpuBackend",
    "InProcessTimeoutError", "Measurement", "NoRecordError", "ReplayBackend", "SpaceCodec", "StorageError",
    "SubprocessBackend", "TuneResult",
    "TuningKey", "WorkerSetupError", "apply_best", "config_key", "make_backend", "naive_reference_schedule",
    "read_recording", "trials_to_reach", "tune", "workload_hash", "write_recording",
]
