"""The two-phase operators (one module per op pair), the attributes object they share, and the sizing
arithmetic. :class:`~aclnn_py.MoeDistributeBuffer` is the high-level API over these. Every call of an
operator, a plan or the buffer runs one compiled body (``aclnn_py._core``)."""

from .._core import Plan

# plan_parts is imported with the package, though only the compiled core's plans call it: a rank process
# forked from a server that imported the package (aclnn_py.worlds.spawn) then finds it loaded.
from . import generations, plan_parts, sizing  # noqa: F401
from .combine import CombinePlan, PreparedCombine, moe_distribute_combine, prepare_combine
from .config import MoeConfig
from .dispatch import (
    DispatchOutputs,
    DispatchPlan,
    PreparedDispatch,
    moe_distribute_dispatch,
    prepare_dispatch,
)
from .executor import Prepared
from .generations import GenerationError
from .profiles import SocProfile, profile_of

__all__ = [
    "CombinePlan", "DispatchOutputs", "DispatchPlan", "GenerationError", "MoeConfig", "Plan", "Prepared", "PreparedCombine",
    "PreparedDispatch", "SocProfile", "generations", "moe_distribute_combine", "moe_distribute_dispatch",
    "prepare_combine", "prepare_dispatch", "profile_of", "sizing",
]
