"""Stage specs: which binding time each parameter, buffer and input has.

A spec maps globs over fully qualified names (as in `named_parameters()`) to
binding times. Defaults: weights are static, PEFT's adapter tensors are
adapter-time, forward inputs are dynamic. User globs apply after the defaults,
in order; a user glob that matches nothing is an error, and so is one that
gives a forward input (known only per request) or a buffer the model mutates
a time other than dynamic.
"""

import fnmatch

from stageml.binding_time import BindingTime
from stageml.errors import StageSpecError

# PEFT's names for adapter tensors.
ADAPTER_PATTERNS = ("*lora_A*", "*lora_B*", "*lora_embedding_A*", "*lora_embedding_B*", "*lora_magnitude_vector*")


def parse_stage_option(text: str) -> tuple[str, BindingTime]:
    """'GLOB=TIME' → (glob, time)."""
    if not isinstance(text, str):
        raise StageSpecError(f"stage option {text!r} is not a string GLOB=TIME: write e.g. --stage '*.lora_*=adapter'")
    glob, sep, time = text.rpartition("=")
    if not sep or not glob:
        raise StageSpecError(f"stage option {text!r} is not GLOB=TIME: write e.g. --stage '*.lora_*=adapter'")
    return glob, BindingTime.parse(time)


def resolve(names: list[str], weight_names: set[str] | None, spec=None, mutated=frozenset()) -> dict[str, BindingTime]:
    """The binding time of every name in `names`.

    Args:
      names: every argument name, in order.
      weight_names: the names that are parameters, buffers or constants
        (static by default); the rest are forward inputs (dynamic), which no
        glob may make static or adapter-time. None where they are unknown
        (stageml-opt on an IR file): then every name counts as an input for
        the defaults and any glob may set any time.
      spec: {glob: BindingTime | str} or a list of (glob, time) pairs.
      mutated: buffers the model mutates: request-time state, always dynamic.
    """
    known = weight_names is not None  # which names are forward inputs
    weight_names = weight_names or set()
    times = {}
    for name in names:
        if known and name not in weight_names:
            times[name] = BindingTime.DYNAMIC
        elif any(fnmatch.fnmatchcase(name, p) for p in ADAPTER_PATTERNS):
            times[name] = BindingTime.ADAPTER
        else:
            times[name] = BindingTime.STATIC if name in weight_names else BindingTime.DYNAMIC
    for glob, time in _pairs(spec):
        time = BindingTime.parse(time)
        matched = [n for n in names if fnmatch.fnmatchcase(n, glob)]
        if not matched:
            raise StageSpecError(
                f"stage glob {glob!r} matches no parameter, buffer or input: "
                f"use a fully qualified name such as {names[0]!r}" if names else
                f"stage glob {glob!r} matches nothing: the model has no arguments"
            )
        for name in matched:
            if time == BindingTime.DYNAMIC:
                pass
            elif name in mutated:
                raise StageSpecError(f"buffer {name!r} is mutated by the model, so it is request-time state and "
                                     f"cannot be {time.label}: leave it out of stage glob {glob!r}")
            elif known and name not in weight_names:
                raise StageSpecError(f"stage glob {glob!r} makes forward input {name!r} {time.label}, but a forward "
                                     "input is known only per request (dynamic): narrow the glob to parameters and "
                                     "buffers, or make the input a buffer of the model")
            times[name] = time
    for name in mutated:
        times[name] = BindingTime.DYNAMIC
    return times


def _pairs(spec) -> list:
    """[(glob, time)] of a spec: a dict, or (glob, time) pairs."""
    if spec is None:
        return []
    if isinstance(spec, (str, bytes)):
        raise StageSpecError(f"stage spec {spec!r} is a string, not a dict or list of (glob, time) pairs: "
                             "pass e.g. {'*.lora_*': 'adapter'}")
    try:
        pairs = list(spec.items()) if isinstance(spec, dict) else [tuple(p) for p in spec]
    except TypeError:
        raise StageSpecError(f"stage spec {spec!r} is not a dict or list of (glob, time) pairs: "
                             "pass e.g. {'*.lora_*': 'adapter'}") from None
    for pair in pairs:
        if len(pair) != 2 or not isinstance(pair[0], str):
            raise StageSpecError(f"stage spec entry {pair!r} is not a (glob, time) pair with a string glob: "
                                 "pass e.g. ('*.lora_*', 'adapter')")
    return pairs
