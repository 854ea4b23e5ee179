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
gets zero factors: that layer stays the base layer, as in PEFT. An expert
site (LoRA on an MoE layer's expert stack, PEFT's `target_parameters`) holds
E experts' factors in PEFT's flat layout, A [E·r, in] expert-major and
B [out, E·r] with the expert index fastest; each expert's r rows (columns)
are padded to R in place: A [E·R, in], s·B [out, E·R].

A config is checked as PEFT would build it (`_LoraConfig`): r a positive
integer, lora_alpha a finite number, rank_pattern / alpha_pattern dicts of
module patterns to those, the flags booleans; fields StageML does not read
may hold anything. Factors must be finite floating-point tensors. Every
problem is an AdapterError naming the field or tensor.
"""

import json
import math
import os
import re
from typing import Annotated

import numpy as np
from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictFloat, StrictInt,
                      StrictStr, ValidationError)

from stageml.errors import AdapterError
from stageml.runtime.module import as_numpy, numpy_dtype

CONFIG, WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
_FACTOR = re.compile(r"^(?P<module>.+)\.(?P<factor>lora_[AB])(\.[^.]+)?\.weight$")
_SITE_FACTOR = re.compile(r"^(?:(?P<module>.+)\.)?lora_[AB](\.[^.]+)?(\.weight)?$")
_PEFT_PREFIX = "base_model.model."
_SAVE = "save the adapter with PEFT's save_pretrained"


# -- configs ------------------------------------------------------------------

def _finite(value):
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int beyond float's range
        finite = False
    if not finite:
        raise ValueError("not finite")
    return value


# numpy scalars (a config built in Python) count as the Python values they hold
_PLAIN = BeforeValidator(lambda value: value.item() if isinstance(value, np.generic) else value)
_Rank = Annotated[StrictInt, Field(gt=0), _PLAIN]
_Number = Annotated[StrictInt | StrictFloat, AfterValidator(_finite), _PLAIN]
_Flag = Annotated[StrictBool | None, _PLAIN]


class _LoraConfig(BaseModel):
    """The fields of PEFT's LoraConfig that StageML reads, typed as PEFT uses
    them. r left out: the factors' rank. Other fields are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    peft_type: StrictStr = "LORA"
    r: _Rank = None  # (a default is not validated: None only when absent)
    lora_alpha: _Number = 8
    use_rslora: _Flag = False
    rank_pattern: dict[StrictStr, _Rank] | None = None
    alpha_pattern: dict[StrictStr, _Number] | None = None
    use_dora: _Flag = False
    fan_in_fan_out: _Flag = False
    lora_bias: _Flag = False


_EXPECTED = {
    "peft_type": 'the string "LORA"', "r": "a positive integer", "lora_alpha": "a finite number",
    "use_rslora": "true or false", "use_dora": "true or false", "fan_in_fan_out": "true or false",
    "lora_bias": "true or false",
    "rank_pattern": "a dict of module patterns (strings) to positive integer ranks",
    "alpha_pattern": "a dict of module patterns (strings) to finite numbers",
}


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _as_dict(config) -> dict | None:
    """A config (None, a dict, or an object with to_dict such as peft's LoraConfig) as a dict."""
    if config is None or isinstance(config, dict):
        return config
    to_dict = getattr(config, "to_dict", None)
    if not callable(to_dict):
        raise AdapterError(f"an adapter config is a dict or a peft LoraConfig, not a {type(config).__name__}: "
                           "pass one of those")
    try:
        config = to_dict()
    except Exception as e:
        raise AdapterError(f"the adapter config's to_dict() failed ({type(e).__name__}: {e}): "
                           "pass a dict or a peft LoraConfig") from None
    if not isinstance(config, dict):
        raise AdapterError(f"the adapter config's to_dict() returned a {type(config).__name__}, not a dict: "
                           "pass a dict or a peft LoraConfig")
    return config


def _parse_config(config) -> _LoraConfig | None:
    """The checked config, or None for none (see the module doc)."""
    config = _as_dict(config)
    if config is None:
        return None
    try:
        parsed = _LoraConfig.model_validate({k: v for k, v in config.items() if isinstance(k, str)})
    except ValidationError as e:
        loc = e.errors()[0]["loc"]
        field = str(loc[0]) if loc else "?"
        raise AdapterError(f"adapter config's {field} is {_short(config.get(field))}, not "
                           f"{_EXPECTED.get(field, 'what PEFT writes')}: fix it, or {_SAVE}") from None
    if parsed.peft_type != "LORA":
        raise AdapterError(f"adapter config has peft_type {parsed.peft_type!r}: StageML serves LoRA adapters only")
    # (fan_in_fan_out, set for GPT-2's Conv1D layers, changes only how PEFT merges ΔW into a
    # weight stored [in, out]: its lora_A [r, in] and lora_B [out, r] are the usual ones.)
    for flag in ("use_dora", "lora_bias"):
        if getattr(parsed, flag):
            raise AdapterError(f"adapter config sets {flag}, which StageML does not serve: "
                               "train the adapter without it")
    for field in ("rank_pattern", "alpha_pattern"):
        for key in getattr(parsed, field) or {}:
            try:
                re.compile(rf"(.*\.)?({key})$")
            except re.error as e:
                raise AdapterError(f"adapter config's {field} key {key!r} is not a regular expression ({e}): "
                                   f"fix it, or {_SAVE}") from None
    return parsed


def _pattern_value(patterns: dict | None, module: str, default):
    """PEFT's rank_pattern / alpha_pattern lookup (peft.utils.get_pattern_key)."""
    for key, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


# -- tensors ------------------------------------------------------------------

def _module(name: str):
    """('...q_proj', 'lora_A') for a LoRA factor's name, else None."""
    match = _FACTOR.match(name)
    return (match["module"], match["factor"]) if match else None


def _site_module(name: str) -> str:
    """The module of a compiled site's factor: PEFT's name less the factor, or
    (a model that names its factors otherwise) as close to it as the name allows."""
    parsed = _module(name)
    if parsed is not None:
        return parsed[0]
    match = _SITE_FACTOR.match(name)
    return match["module"] if match and match["module"] else name


def _is_float(dtype: np.dtype) -> bool:
    """numpy's floats, and ml_dtypes' (bfloat16, float8_*)."""
    return dtype.kind == "f" or (dtype.kind == "V" and dtype.name.startswith(("bfloat", "float")))


def _array(name, value) -> np.ndarray:
    """Adapter tensor `name` as an ndarray."""
    if not isinstance(name, str):
        raise AdapterError(f"adapter tensor name {_short(name)} is not a string: name tensors as PEFT does "
                           "('...q_proj.lora_A.weight')")
    try:
        return as_numpy(value)
    except Exception as e:
        raise AdapterError(f"adapter tensor {name!r} is not an array ({type(e).__name__}: {e}): "
                           "pass torch tensors or numpy arrays") from None


def _factor(name, value) -> np.ndarray:
    """Adapter tensor `name` as a finite floating-point ndarray."""
    array = _array(name, value)
    if not _is_float(array.dtype):
        raise AdapterError(f"adapter tensor {name!r} has element type {array.dtype}, not a floating-point type: "
                           "pass LoRA factors as float32, float16 or bfloat16")
    wide = array if array.dtype.kind == "f" else array.astype(np.float32)
    if not np.isfinite(wide).all():
        raise AdapterError(f"adapter tensor {name!r} holds NaN or infinite values: pass trained, finite factors")
    return array


def _fill(target: np.ndarray, index, value: np.ndarray, name: str, dtype: str, scaling=None) -> None:
    """target[index] = value, refusing values beyond float32 or the site's `dtype`."""
    with np.errstate(over="ignore", invalid="ignore"):
        target[index] = value
    limit = _max_of(dtype)
    if np.isfinite(target).all() and (limit is None or np.abs(target).max(initial=0) <= limit):
        return
    scaled = "" if scaling is None else f" times PEFT's scaling {scaling:g}"
    fix = "pass smaller factors" if scaling is None else "pass smaller factors or a smaller lora_alpha"
    if dtype != "float32":
        fix += ", or compile the model in float32"
    raise AdapterError(f"adapter tensor {name!r}{scaled} has values beyond the range of {dtype}, the residual's "
                       f"element type there: {fix}")


def _max_of(dtype: str):
    """The largest finite value of element type `dtype`, or None where unknown."""
    try:
        numpy = numpy_dtype(dtype)
        if numpy.kind == "f":
            return float(np.finfo(numpy).max)
        import ml_dtypes
        return float(ml_dtypes.finfo(numpy).max)
    except (TypeError, ValueError, ImportError):
        return None


def _load_weights(path: str) -> dict:
    """{name: ndarray} of a safetensors file (bfloat16 as ml_dtypes')."""
    from safetensors.numpy import load_file
    try:
        return load_file(path)
    except TypeError:  # an element type numpy lacks (bfloat16): read it with torch
        from safetensors.torch import load_file
        return {name: as_numpy(value) for name, value in load_file(path).items()}


# -- adapters -----------------------------------------------------------------

def read(source, config=None) -> tuple[dict, dict | None]:
    """({tensor name: ndarray}, config dict or None) from a directory or a dict."""
    if isinstance(source, (str, os.PathLike)):
        directory = os.fspath(source)
        if not os.path.isdir(directory):
            raise AdapterError(f"adapter directory {directory!r} does not exist or is not a directory: "
                               f"pass the directory PEFT's save_pretrained wrote ({CONFIG} and {WEIGHTS})")
        for file in (CONFIG, WEIGHTS):
            if not os.path.isfile(os.path.join(directory, file)):
                raise AdapterError(f"adapter directory {directory!r} has no {file}: {_SAVE}")
        from safetensors import SafetensorError
        try:
            with open(os.path.join(directory, CONFIG), "rb") as f:
                config = json.load(f)
            tensors = _load_weights(os.path.join(directory, WEIGHTS))
        except (OSError, ValueError, RecursionError, SafetensorError) as e:
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise AdapterError(f"adapter in {directory!r} cannot be read ({reason}): "
                               "save it again with PEFT's save_pretrained") from None
        if not isinstance(config, dict):
            raise AdapterError(f"{CONFIG} in {directory!r} is not a JSON object: {_SAVE}")
        return tensors, config
    if not isinstance(source, dict):
        raise AdapterError(f"an adapter is a PEFT directory or a dict of tensors, not a {type(source).__name__}: "
                           "pass one of those")
    return {name: _array(name, value) for name, value in source.items()}, _as_dict(config)


def _matching(modules, module: str) -> list:
    """The modules of `modules` that `module` names: equal, or one a suffix of the other by
    whole components (PEFT's saved names drop the compiled ones' wrappers and prefixes)."""
    return [m for m in modules if m == module or m.endswith("." + module) or module.endswith("." + m)]


def prepare(tensors: dict, config: dict | None, sites: list, max_rank: int, unread=()) -> dict:
    """{compiled adapter input name: ndarray} for one adapter (see above). Factors of a module
    whose compiled factors are `unread` (a module the forward never runs) change nothing and
    are left out."""
    parsed = _parse_config(config)
    if not isinstance(tensors, dict):
        raise AdapterError(f"adapter tensors are a dict of name to tensor, not a {type(tensors).__name__}: "
                           "pass a dict")
    by_site, exact, pairs = {}, {}, {}
    inert = {_site_module(name) for name in unread}
    patterns = {}  # module -> the name PEFT's rank_pattern / alpha_pattern match for it
    for site in sites:
        module = _site_module(site["lora_A"])
        by_site[module] = site
        patterns[module] = _parameter_path(site["parameter"]) if site.get("parameter") else module
        exact[site["lora_A"]], exact[site["lora_B"]] = (module, "lora_A"), (module, "lora_B")
    for name, value in tensors.items():
        value = _factor(name, value)
        if name in exact:
            matches, factor = [exact[name][0]], exact[name][1]
        else:
            parsed_name = _module(name)
            if parsed_name is None:
                raise AdapterError(f"adapter tensor {name!r} is not a LoRA factor (lora_A / lora_B weight): "
                                   "StageML serves LoRA factors only; remove it from the adapter")
            module, factor = parsed_name
            matches = _matching(by_site, module)
            if not matches and _matching(inert, module):
                continue
            if len(matches) != 1:
                raise AdapterError(f"adapter tensor {name!r} targets module {module!r}, which the residual was not "
                                   "compiled with LoRA on: compile a model whose LoRA targets that module")
        factors = pairs.setdefault(matches[0], {})
        if factor in factors:
            raise AdapterError(f"adapter tensors {factors[factor][0]!r} and {name!r} are both the {factor} of "
                               f"module {matches[0]!r}: pass one of them")
        factors[factor] = (name, value)
    inputs = {}
    for module, site in by_site.items():
        k, n = site["in_features"], site["out_features"]
        experts = site.get("experts", 0)
        e = max(experts, 1)  # a dense site is one expert
        dtype = site.get("dtype", "float32")
        a = np.zeros((e * max_rank, k), np.float32)
        b = np.zeros((n, max_rank * e), np.float32)
        factors = pairs.get(module)
        if factors is not None:
            if set(factors) != {"lora_A", "lora_B"}:
                name = next(iter(factors.values()))[0]
                raise AdapterError(f"adapter tensor {name!r} has no matching "
                                   f"{'lora_B' if 'lora_A' in factors else 'lora_A'}: pass both factors of each layer")
            (a_name, a_value), (b_name, b_value) = factors["lora_A"], factors["lora_B"]
            rows = "E*r" if experts else "r"
            r = a_value.shape[0] // e if a_value.ndim == 2 and a_value.shape[0] % e == 0 else -1
            configured = _configured_rank(parsed, patterns[module])
            if experts and configured and a_value.ndim == 2 and a_value.shape[0] != e * configured:
                raise AdapterError(f"adapter tensor {a_name!r} has {a_value.shape[0]} rows, {configured} per expert "
                                   f"(its config's rank) for {a_value.shape[0] / configured:g} experts, but the "
                                   f"residual's layer has {experts}: pass an adapter trained for this model")
            if r < 0 or a_value.shape[1] != k:
                raise AdapterError(f"adapter tensor {a_name!r} has shape {list(a_value.shape)}; expected [{rows}, {k}]"
                                   + (f" for the residual's {experts} experts" if experts else ""))
            if r == 0:
                raise AdapterError(f"adapter tensor {a_name!r} has rank 0 (shape {list(a_value.shape)}): "
                                   "a LoRA factor has rank at least 1; leave the layer out of the adapter instead")
            if b_value.shape != (n, e * r):
                raise AdapterError(f"adapter tensor {b_name!r} has shape {list(b_value.shape)}; "
                                   f"expected [{n}, {e * r}]")
            if r > max_rank:
                raise AdapterError(f"adapter tensor {a_name!r} has rank {r}, above the residual's maximum rank "
                                   f"{max_rank}: compile with a max rank of at least {r}")
            # PEFT's expert layout: A's rows expert-major (E, r), B's columns expert fastest (r, E)
            _fill(a.reshape(e, max_rank, k), (slice(None), slice(None, r)), a_value.reshape(e, r, k), a_name, dtype)
            wide = b_value if b_value.dtype in (np.float32, np.float64) else b_value.astype(np.float32)
            scaling = _scaling(parsed, patterns[module], r)
            with np.errstate(over="ignore", invalid="ignore"):
                scaled = wide * scaling
            _fill(b.reshape(n, max_rank, e), (slice(None), slice(None, r)), scaled.reshape(n, r, e), b_name, dtype,
                  scaling)
        inputs[site["lora_A"]], inputs[site["lora_B"]] = a, b
    return inputs


def _parameter_path(parameter: str) -> str:
    """The name PEFT matches its patterns against for LoRA on `parameter` (target_parameters):
    the parameter's path in the model, without PEFT's wrappers (`base_layer.`)."""
    return re.sub(r"(?:^|(?<=\.))base_layer\.", "", parameter.split(_PEFT_PREFIX, 1)[-1])


def _configured_rank(config: _LoraConfig | None, module: str) -> int | None:
    """The rank `config` gives `module` (after rank_pattern), or None without one."""
    if config is None:
        return None
    return _pattern_value(config.rank_pattern, module.split(_PEFT_PREFIX, 1)[-1], config.r)


def _scaling(config: _LoraConfig | None, module: str, r: int) -> float:
    """PEFT's scaling for `module` (LoraLayer.update_layer)."""
    if config is None:
        return 1.0
    relative = module.split(_PEFT_PREFIX, 1)[-1]
    expected = _configured_rank(config, module) or r
    if expected != r:
        raise AdapterError(f"adapter config gives rank {expected} for {relative!r}, but its lora_A has rank {r}: "
                           "use the adapter_config.json saved with these weights")
    alpha = _pattern_value(config.alpha_pattern, relative, config.lora_alpha)
    return alpha / math.sqrt(r) if config.use_rslora else alpha / r
