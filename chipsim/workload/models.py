"""MoE model shapes: what chipsim costs of a model, read from its Hugging Face config.json.

A shape comes from one of three places (`model_of`): a bundled shape named by `model.name` (the data files in
chipsim/workload/shapes/, each the published config.json fields chipsim reads, with their source), a
config.json named by `model.config`, or an inline mapping of config.json fields under `model.shape`. All three
are read by chipsim.workload.hf_config, which knows each architecture's field names.

Timing always uses these shapes; a trace only supplies routing, so a trace recorded from a reduced-width model
of the same layer / expert / top-k / shared counts matches the full shape.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

from chipsim.errors import InputError
from chipsim.workload import hf_config
from chipsim.workload.hf_config import SHAPES_DIR
from chipsim.workload.shape import ModelShape


# A run needs one shape: `get_model` reads that shape's file alone; MODELS (every bundled shape) is read on first use
# (PEP 562), not at import, so a `chipsim run` does not parse fourteen YAML files at start-up.
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")  # a bundled name is its file's stem


@functools.lru_cache(maxsize=None)
def _read_one(name: str) -> ModelShape:
    path = SHAPES_DIR / f"{name}.yaml"
    shape = hf_config.read_bundled(path)
    if shape.name != name:
        raise InputError(f"model shape {path}: names itself {shape.name}; a bundled shape is named as its file")
    return shape


def _read_bundled() -> dict[str, ModelShape]:
    """The bundled shapes by name, from chipsim/workload/shapes/*.yaml (a file's stem is its name)."""
    return {path.stem: _read_one(path.stem) for path in sorted(SHAPES_DIR.glob("*.yaml"))}


def __getattr__(attr: str):
    if attr == "MODELS":  # read once, then a plain module global (tests register tiny shapes in it)
        models = globals()["MODELS"] = _read_bundled()
        return models
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


def _registry() -> dict[str, ModelShape]:
    registry = globals().get("MODELS")
    return registry if registry is not None else __getattr__("MODELS")


def get_model(name: str) -> ModelShape:
    if "MODELS" not in globals() and _NAME.match(name) and (SHAPES_DIR / f"{name}.yaml").is_file():
        return _read_one(name)
    registry = _registry()
    try:
        return registry[name]
    except KeyError:
        known = ", ".join(sorted(registry))
        raise InputError(f"model.name: unknown model '{name}' (known: {known}; or give model.config: a "
                         "config.json, or model.shape: its fields)") from None


def model_of(model_cfg) -> ModelShape:
    """The shape a config's `model` section names: model.config (a config.json), model.shape (its fields inline),
    else the bundled model.name."""
    if getattr(model_cfg, "config", "") and getattr(model_cfg, "shape", None):
        raise InputError("model.shape: give model.config (a config.json) or model.shape (its fields inline), not both")
    if getattr(model_cfg, "config", ""):
        return hf_config.read_config_file(model_cfg.config, "model.config")
    if getattr(model_cfg, "shape", None):
        return hf_config.shape_from_config(dict(model_cfg.shape), "model.shape", name="inline")
    return get_model(model_cfg.name)


def resolve(name_or_path: str) -> ModelShape:
    """A bundled name, or a path to a config.json or a bundled-style YAML file (`chipsim models NAME|PATH`)."""
    models = _registry()
    if name_or_path in models:
        return models[name_or_path]
    if os.path.sep in name_or_path or name_or_path.endswith((".json", ".yaml", ".yml")):
        if name_or_path.endswith((".yaml", ".yml")):
            return hf_config.read_bundled(Path(name_or_path))
        return hf_config.read_config_file(name_or_path, "chipsim models")
    return get_model(name_or_path)
