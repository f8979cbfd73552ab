"""Policies register themselves on import; every module of this package is imported here, so a new
policy is one new file (no registry edit)."""

import importlib
import pkgutil

from chipsim.policies.base import REGISTRY, LayerPlan, NoParams, Param, Policy, make_policy, param, register  # noqa: F401

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _module != "base":
        importlib.import_module(f"{__name__}.{_module}")
