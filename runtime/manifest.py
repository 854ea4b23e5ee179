"""The residual's manifest (`residual.json`): its schema, and its checks.

The manifest names the module (.vmfb) and parameter archive (.irpa) beside
it, each with its size and SHA-256, and repeats what the module says of its
own entry points (compiler/passes/entry_reflection.py). Reading one checks,
before anything is loaded: the schema (every field's type and range), that
each file is a plain name inside the manifest's own directory, and that
each file has the recorded size and hash. Any failure is an ArtifactError
naming the file.
"""

import hashlib
import json
import os
from typing import Annotated, Literal

import pydantic
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from stageml.errors import ArtifactError

FORMAT = "stageml-residual/4"
# The keys of an entry function's iree.reflection (compiler/passes/entry_reflection.py).
REFLECTED_ENTRY, REFLECTED_TENANTS, REFLECTED_GENERATION = "stageml.entry", "stageml.tenants", "stageml.generation"

Count = Annotated[int, Field(ge=0, le=1 << 62)]
Positive = Annotated[int, Field(ge=1, le=1 << 62)]
Index = Annotated[int, Field(ge=-(1 << 62), le=1 << 62)]
Name = Annotated[str, Field(min_length=1, max_length=4096)]
DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8",
          "uint64", "uint32", "uint16", "uint8", "bool")


def _plain_name(name: str) -> str:
    """A file name inside the manifest's directory: no directory part, not "." or ".."."""
    if name in (".", "..") or any(c in name for c in "/\\\x00") or not 0 < len(name) <= 255:
        raise ValueError(f"{name!r} is not a plain file name")
    return name



class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class DimRange(_Strict):
    min: Count
    max: Count | None = None


class ValueRange(_Strict):
    min: Index
    max: Index


class InputDim(_Strict):
    input: Name
    axis: Count


class Term(_Strict):
    coefficient: Index
    dims: list[InputDim]


class Polynomial(_Strict):
    """A result dimension: the sum of the terms (each a coefficient times input dimensions),
    floor-divided by the divisor (compiler/facts.py's bt.sizes)."""
    terms: list[Term]
    divisor: Positive

    def of(self, shapes: dict):
        """Its value for the inputs' `shapes` ({input name: shape}; ints or torch SymInts)."""
        total = 0
        for term in self.terms:
            product = term.coefficient
            for dim in term.dims:
                product = product * shapes[dim.input][dim.axis]
            total = total + product
        return total // self.divisor


class Value(_Strict):
    """An argument or result of an entry point (compiler/facts.py's facts, shape and dtype)."""
    name: Name
    kind: Literal["parameter", "state", "resident", "input", "slot", "output", "routing", "measure"]
    shape: list[Count | None]
    dtype: Literal[DTYPES]
    result: Count | None = None
    dims: list[DimRange] | None = None
    range: ValueRange | None = None
    sites: list[Name] | None = None  # a routing or measure result's sites (their lora_A names)
    sizes: list[Count | Polynomial] | None = None  # an output's dimensions from its inputs' (bt.sizes)


class EntryPoint(_Strict):
    symbol: Name
    stage: Literal["adapter", "dynamic"]
    program: Name
    arguments: list[Value]
    results: list[Value]


class Generation(_Strict):
    """A generation step's module (compiler/generation.py): its KV cache's sequence slots and
    positions, and the names of its inputs."""
    sequences: Positive
    max_seq: Positive
    eos: list[Count]  # the model's end-of-sequence token ids
    tokens: Name
    slots: Name
    positions: Name
    cache_bytes: Count | None = None  # the cache buffers' bytes on the device (None: not recorded)


class Site(_Strict):
    lora_A: Name
    lora_B: Name
    in_features: Positive
    out_features: Positive
    rank: Count
    scaling: float
    dtype: Literal["float32", "float16", "bfloat16"]
    experts: Count
    parameter: Name | None = None  # an expert site's stack (the parameter PEFT's target_parameters names)


class Tenants(_Strict):
    max_adapters: Positive
    max_rank: Positive
    sites: list[Site]
    unread: list[Name] = []  # adapter-time arguments nothing reads: LoRA on modules the forward never runs


class File(_Strict):
    name: Annotated[str, AfterValidator(_plain_name)]
    size: Count
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class Files(_Strict):
    module: File
    parameters: File


class Target(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", frozen=True)
    name: Name
    device: Name
    features: list[str] = []


class Manifest(_Strict):
    format: Literal[FORMAT]
    target: Target
    device: Name
    files: Files
    parameter_scope: Name
    default_adapter_prefix: str
    entry_points: list[EntryPoint]
    tenants: Tenants | None = None
    generation: Generation | None = None
    report: dict
    versions: dict[str, str]


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def file_entry(path: str, name: str) -> dict:
    """The manifest's record of the file at `path`, to be found under `name`."""
    return {"name": name, "size": os.path.getsize(path), "sha256": sha256(path)}


def _first_error(error: pydantic.ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "the top level"
    return f"{where}: {first['msg']}"


def validate(data, what: str):
    """`data` (parsed JSON) as a Manifest; `what` names it in the error."""
    try:
        return Manifest.model_validate(data)
    except pydantic.ValidationError as e:
        raise ArtifactError(f"{what} is not a valid {FORMAT} manifest ({_first_error(e)}): "
                            "recompile the model with stagemlc") from None


def artifact_files(vmfb_path: str) -> dict:
    """{"module", "parameters", "manifest"}: the paths of the artifact whose module
    is `vmfb_path` (".vmfb" is added when the name lacks it)."""
    path = os.path.abspath(os.fspath(vmfb_path))
    stem = path[:-5] if path.endswith(".vmfb") else path
    return {"module": stem + ".vmfb", "parameters": stem + ".irpa", "manifest": stem + ".json"}


def read(vmfb_path: str) -> tuple[Manifest, dict]:
    """(the validated manifest beside `vmfb_path`, its JSON as read)."""
    path = artifact_files(vmfb_path)["manifest"]
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())
    except FileNotFoundError:
        raise ArtifactError(f"manifest {path!r} is missing: keep the .json that stagemlc wrote beside the .vmfb") from None
    except (OSError, ValueError, RecursionError):
        raise ArtifactError(f"manifest {path!r} is unreadable or not JSON: recompile the model with stagemlc") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else None
        raise ArtifactError(f"manifest {path!r} is not a {FORMAT} manifest (format {found!r}): "
                            "recompile the model with this StageML")
    return validate(data, f"manifest {path!r}"), data


def locate(manifest_path: str, entry: File, what: str) -> str:
    """The path of the file `entry` names, beside the manifest."""
    path = os.path.join(os.path.dirname(os.path.abspath(manifest_path)), entry.name)
    if not os.path.isfile(path):
        raise ArtifactError(f"{what} {path!r} is missing: keep the files stagemlc wrote together")
    return path


def verify(path: str, entry: File, what: str, data: bytes | None = None) -> None:
    """Checks that the file at `path` (or `data`, its contents as read) has `entry`'s size and hash."""
    size = len(data) if data is not None else os.path.getsize(path)
    digest = hashlib.sha256(data).hexdigest() if data is not None else sha256(path)
    if size != entry.size or digest != entry.sha256:
        raise ArtifactError(f"{what} {path!r} does not match its manifest (its size or SHA-256 differ: it is "
                            "corrupt, or from another compile): save or copy the whole artifact again")
