"""The analytical carver: rank a rule's knob space from the hardware profile alone, no GPU needed.

``carve(func, target)`` returns a DataFrame of the best legal, hardware-aligned configs with the model's
figures (footprints, traffic per memory level, occupancy, waves, estimated time and what bounds it);
``estimate`` prices one config; ``best`` returns the winner's Schedule.  See ``model.py`` for the model
and ``enumerate.py`` for the Roller-style search.  Given ``resources`` (a function from a Schedule to the
registers and spills its compiled kernels use; ``schedlib.runtime.resources.compiled_resources`` runs ptxas),
``carve`` and ``best`` price the model's best configs again with those registers (``compiled.py``).
"""

from schedlib.carver.model import evaluate, reason
from schedlib.carver.occupancy import Occupancy, occupancy
from schedlib.carver.problem import DEFAULT_SYMBOLIC_VALUE, Problem, analyze
from schedlib.carver.rank import best, carve, estimate

__all__ = ["DEFAULT_SYMBOLIC_VALUE", "Occupancy", "Problem", "analyze", "best", "carve", "estimate", "evaluate",
           "occupancy", "reason"]
