"""MoE model shapes: what chipsim costs of a model, read from its Hugging Face config.json.

A shape comes from one of three places (`model_of`): a bundled shape named by `model.name` (the data files in
chipsim/workload/shapes/, each the published config.json fields chipsim reads, with their source), a
config.json named by `model.config`, or an inline mapping of config.json fields under `model.shape`. All three
are read by chipsim.workload.hf_config, which knows each architecture's field names.

Timing always uses these shapes; a trace only supplies routing, so a trace recorded from a reduced-width model
of the same layer / expert / top-k / shared counts matches the full shape.
"""

from __future__ import annotations

import os
from pathlib import Path

from chipsim.errors import InputError
from chipsim.workload import hf_config
from chipsim.workload.hf_config import SHAPES_DIR
from chipsim.workload.shape import FULL, MAMBA, MIXERS, SLIDING, ModelShape  # noqa: F401 (re-exported)


def _read_bundled() -> dict[str, ModelShape]:
    """The bundled shapes by name, from chipsim/workload/shapes/*.yaml."""
    shapes: dict[str, ModelShape] = {}
    for path in sorted(SHAPES_DIR.glob("*.yaml")):
        shape = hf_config.read_bundled(path)
        if shape.name in shapes:
            raise InputError(f"model shape {path}: name {shape.name} is taken by another file of {SHAPES_DIR}")
        shapes[shape.name] = shape
    return shapes


MODELS: dict[str, ModelShape] = _read_bundled()


def get_model(name: str) -> ModelShape:
    try:
        return MODELS[name]
    except KeyError:
        known = ", ".join(sorted(MODELS))
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
    if name_or_path in MODELS:
        return MODELS[name_or_path]
    if os.path.sep in name_or_path or name_or_path.endswith((".json", ".yaml", ".yml")):
        if name_or_path.endswith((".yaml", ".yml")):
            return hf_config.read_bundled(Path(name_or_path))
        return hf_config.read_config_file(name_or_path, name_or_path)
    return get_model(name_or_path)
