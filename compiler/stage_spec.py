"""Stage specs: which binding time each parameter, buffer and input has.

A spec maps globs over fully qualified names (as in `named_parameters()`) to
binding times. Defaults: weights are static, PEFT's adapter tensors are
adapter-time, forward inputs are dynamic. User globs apply after the defaults,
in order; a user glob that matches nothing is an error.
"""

import fnmatch

from stageml.binding_time import BindingTime
from stageml.errors import StageSpecError

# PEFT's names for adapter tensors.
ADAPTER_PATTERNS = ("*lora_A*", "*lora_B*", "*lora_embedding_A*", "*lora_embedding_B*", "*lora_magnitude_vector*")


def parse_stage_option(text: str) -> tuple[str, BindingTime]:
    """'GLOB=TIME' → (glob, time)."""
    glob, sep, time = text.rpartition("=")
    if not sep or not glob:
        raise StageSpecError(f"stage option {text!r} is not GLOB=TIME: write e.g. --stage '*.lora_*=adapter'")
    return glob, BindingTime.parse(time)


def resolve(names: list[str], weight_names: set[str], spec=None, mutated=frozenset()) -> dict[str, BindingTime]:
    """The binding time of every name in `names`.

    Args:
      names: every argument name, in order.
      weight_names: the names that are parameters, buffers or constants
        (static by default); the rest are forward inputs (dynamic).
      spec: {glob: BindingTime | str} or a list of (glob, time) pairs.
      mutated: buffers the model mutates: request-time state, always dynamic.
    """
    times = {}
    for name in names:
        times[name] = BindingTime.STATIC if name in weight_names else BindingTime.DYNAMIC
        if any(fnmatch.fnmatchcase(name, p) for p in ADAPTER_PATTERNS):
            times[name] = BindingTime.ADAPTER
    pairs = list(spec.items()) if isinstance(spec, dict) else list(spec or [])
    for glob, time in pairs:
        time = BindingTime.parse(time)
        matched = [n for n in names if fnmatch.fnmatchcase(n, glob)]
        if not matched:
            raise StageSpecError(
                f"stage glob {glob!r} matches no parameter, buffer or input: "
                f"use a fully qualified name such as {names[0]!r}" if names else
                f"stage glob {glob!r} matches nothing: the model has no arguments"
            )
        for name in matched:
            if name in mutated and time != BindingTime.DYNAMIC:
                raise StageSpecError(f"buffer {name!r} is mutated by the model, so it is request-time state and "
                                     f"cannot be {time.label}: leave it out of stage glob {glob!r}")
            times[name] = time
    for name in mutated:
        times[name] = BindingTime.DYNAMIC
    return times
