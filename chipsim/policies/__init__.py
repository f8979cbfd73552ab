"""Built-in policies register themselves on import."""

from chipsim.policies import baselines  # noqa: F401
from chipsim.policies.base import REGISTRY, LayerPlan, Param, Policy, make_policy, register  # noqa: F401
