"""PEFT LoRA adapters → the adapter inputs of a multi-tenant residual.

An adapter is a PEFT directory (adapter_config.json and
adapter_model.safetensors, as `save_pretrained` writes them) or a dict of
named tensors with PEFT's key names, with or without the adapter name
("...q_proj.lora_A.weight" or "...q_proj.lora_A.default.weight"). A dict's
factors are used as given (scaling 1) unless a config is passed too.

For each LoRA site the residual was compiled with, A [r, in] is zero-padded
to [R, in] and B [out, r] becomes s·B zero-padded to [out, R], where s is
PEFT's scaling: lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora,
after rank_pattern and alpha_pattern. A site the adapter does not target
gets zero factors: that layer stays the base layer, as in PEFT.
"""

import json
import math
import os
import re

import numpy as np

from stageml.errors import AdapterError
from stageml.runtime.module import as_numpy

CONFIG, WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
_FACTOR = re.compile(r"^(?P<module>.+)\.(?P<factor>lora_[AB])(\.[^.]+)?\.weight$")
_PEFT_PREFIX = "base_model.model."


def _module(name: str):
    """('...q_proj', 'lora_A') for a LoRA factor's name, else None."""
    match = _FACTOR.match(name)
    return (match["module"], match["factor"]) if match else None


def _pattern_value(patterns: dict, module: str, default):
    """PEFT's rank_pattern / alpha_pattern lookup (peft.utils.get_pattern_key)."""
    for key, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def read(source, config=None) -> tuple[dict, dict | None]:
    """({tensor name: ndarray}, config dict or None) from a directory or a dict."""
    if isinstance(source, (str, os.PathLike)):
        directory = os.fspath(source)
        for file in (CONFIG, WEIGHTS):
            if not os.path.isfile(os.path.join(directory, file)):
                raise AdapterError(f"adapter directory {directory!r} has no {file}: "
                                   "save the adapter with PEFT's save_pretrained")
        try:
            with open(os.path.join(directory, CONFIG)) as f:
                config = json.load(f)
            from safetensors.numpy import load_file
            tensors = load_file(os.path.join(directory, WEIGHTS))
        except (OSError, ValueError) as e:
            raise AdapterError(f"adapter in {directory!r} cannot be read ({e}): "
                               "save it again with PEFT's save_pretrained") from None
        return tensors, config
    if not isinstance(source, dict):
        raise AdapterError(f"an adapter is a PEFT directory or a dict of tensors, not a {type(source).__name__}: "
                           "pass one of those")
    tensors = {name: as_numpy(value) for name, value in source.items()}
    if config is not None and not isinstance(config, dict):
        config = config.to_dict()  # a peft LoraConfig
    return tensors, config


def _check_config(config: dict) -> None:
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"adapter config has peft_type {config['peft_type']!r}: StageML serves LoRA adapters only")
    for flag in ("use_dora", "fan_in_fan_out", "lora_bias"):
        if config.get(flag):
            raise AdapterError(f"adapter config sets {flag}, which StageML does not serve: train the adapter without it")


def prepare(tensors: dict, config: dict | None, sites: list, max_rank: int) -> dict:
    """{compiled adapter input name: ndarray} for one adapter (see above)."""
    if config is not None:
        _check_config(config)
    by_site, pairs = {}, {}
    for site in sites:
        by_site[_module(site["lora_A"])[0]] = site
    for name, value in tensors.items():
        parsed = _module(name)
        if parsed is None:
            raise AdapterError(f"adapter tensor {name!r} is not a LoRA factor (lora_A / lora_B weight): "
                               "StageML serves LoRA factors only; remove it from the adapter")
        module, factor = parsed
        matches = [m for m in by_site if m == module or m.endswith("." + module) or module.endswith("." + m)]
        if len(matches) != 1:
            raise AdapterError(f"adapter tensor {name!r} targets module {module!r}, which the residual was not "
                               "compiled with LoRA on: compile a model whose LoRA targets that module")
        pairs.setdefault(matches[0], {})[factor] = (name, value)
    inputs = {}
    for module, site in by_site.items():
        k, n = site["in_features"], site["out_features"]
        a = np.zeros((max_rank, k), np.float32)
        b = np.zeros((n, max_rank), np.float32)
        factors = pairs.get(module)
        if factors is not None:
            if set(factors) != {"lora_A", "lora_B"}:
                name = next(iter(factors.values()))[0]
                raise AdapterError(f"adapter tensor {name!r} has no matching "
                                   f"{'lora_B' if 'lora_A' in factors else 'lora_A'}: pass both factors of each layer")
            (a_name, a_value), (b_name, b_value) = factors["lora_A"], factors["lora_B"]
            r = a_value.shape[0] if a_value.ndim == 2 else -1
            if a_value.ndim != 2 or a_value.shape[1] != k:
                raise AdapterError(f"adapter tensor {a_name!r} has shape {list(a_value.shape)}; expected [r, {k}]")
            if b_value.shape != (n, r):
                raise AdapterError(f"adapter tensor {b_name!r} has shape {list(b_value.shape)}; expected [{n}, {r}]")
            if r > max_rank:
                raise AdapterError(f"adapter tensor {a_name!r} has rank {r}, above the residual's maximum rank "
                                   f"{max_rank}: compile with a max rank of at least {r}")
            a[:r] = a_value
            b[:, :r] = b_value * _scaling(config, module, r)
        inputs[site["lora_A"]], inputs[site["lora_B"]] = a, b
    return inputs


def _scaling(config: dict | None, module: str, r: int) -> float:
    """PEFT's scaling for `module` (LoraLayer.update_layer)."""
    if config is None:
        return 1.0
    relative = module.split(_PEFT_PREFIX, 1)[-1]
    expected = _pattern_value(config.get("rank_pattern"), relative, config.get("r", r))
    if expected != r:
        raise AdapterError(f"adapter config gives rank {expected} for {relative!r}, but its lora_A has rank {r}: "
                           "use the adapter_config.json saved with these weights")
    alpha = _pattern_value(config.get("alpha_pattern"), relative, config.get("lora_alpha", 8))
    return alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
