"""What loading a .pt2 could run, found without loading it.

A .pt2 (torch.export.save) is a zip of JSON and raw tensor bytes, but
torch.export.load (torch 2.13) also unpickles parts of it, and an unpickle
runs whatever code the pickle names:

  - sample inputs (`data/sample_inputs/<model>.pt`), the legacy pickled
    `data/weights/<model>.pt` and `data/constants/<model>.pt`, and the
    top-level `serialized_*` pickles of the pre-2.8 layout (which torch
    reads with zipfile where the PT2 layout fails): `torch.load` with
    weights_only=True first and, where that fails, weights_only=False;
  - weights and tensor constants whose payload config says `use_pickle`,
    and torchbind (`custom_obj_*`) and opaque (`opaque_obj_*`) constants:
    always an unrestricted unpickle;
  - `data/aotinductor/<model>/`: a shared library, loaded as native code.

The first kind is checked by loading the bytes with
`torch.load(weights_only=True)`, the very call torch tries first: where it
succeeds, torch never falls back. (Scanning opcodes with pickletools would
need a copy of torch's allow-list of globals, and drift from it.) The rest
is found from entry names and the JSON payload configs alone. Besides, FX
writes graph input names into the Python source it generates (and runs) for
the graph, unquoted, so every name in a graph must be an identifier.

Entries are read as torch reads them: the PT2 layout with torch's own zip
reader (whose lookups ignore case, so names are matched ignoring case and
names differing only in case are refused), the pre-2.8 one with zipfile.
"""

import io
import json
import zipfile
import zlib

import torch
from torch.export.pt2_archive import PT2ArchiveReader
from torch.export.pt2_archive.constants import (
    AOTINDUCTOR_DIR, CONSTANTS_CONFIG_FILENAME_FORMAT, CONSTANTS_DIR, CUSTOM_OBJ_FILENAME_PREFIX, MODELS_DIR,
    OPAQUE_OBJ_FILENAME_PREFIX, SAMPLE_INPUTS_DIR, WEIGHTS_CONFIG_FILENAME_FORMAT, WEIGHTS_DIR,
)

from stageml.errors import ModelLoadError

# (folder, suffix) of the PT2 entries torch unpickles with weights_only=True first -> what they hold
_SAFE_FIRST = {(SAMPLE_INPUTS_DIR, ".pt"): "sample inputs", (WEIGHTS_DIR, ".pt"): "pickled weights",
               (CONSTANTS_DIR, ".pt"): "pickled constants"}
# the same in the pre-2.8 layout
_LEGACY_SAFE_FIRST = {"serialized_state_dict.pt": "pickled weights", "serialized_state_dict.json": "pickled weights",
                      "serialized_constants.pt": "pickled constants", "serialized_constants.json": "pickled constants",
                      "serialized_example_inputs.pt": "sample inputs"}
_LEGACY_GRAPH = "serialized_exported_program.json"
_ZIP_ERRORS = (OSError, EOFError, ValueError, NotImplementedError, zipfile.BadZipFile, zlib.error)


def check_trusted(path: str, trust_model: bool) -> None:
    """Raises ModelLoadError if loading `path` could run code from it, unless `trust_model`."""
    findings = inspect_archive(path)
    if findings and not trust_model:
        more = f" (and {len(findings) - 1} more)" if len(findings) > 1 else ""
        raise ModelLoadError(f"{path!r} can run code when loaded: {findings[0]}{more}; "
                             "pass --trust-model (trust_model=True) only if you trust where the file came from")


def inspect_archive(path: str) -> list[str]:
    """What in the .pt2 at `path` torch.export.load would unpickle unrestricted or run, one phrase each."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            damaged = archive.testzip()  # torch's reader checks no CRC: a flipped byte would load
            if damaged is not None:
                raise ModelLoadError(f"{path!r} is damaged: its entry {damaged!r} fails its checksum; "
                                     "export and save the model again")
            if any(n.endswith("data.pkl") for n in names) and not any(n.endswith("archive_format") for n in names):
                raise ModelLoadError(f"{path!r} is a pickled model (torch.save), not an ExportedProgram: "
                                     "save it with torch.export.save(torch.export.export(model, args), path)")
            findings = [f"{_LEGACY_SAFE_FIRST[n]} {n!r} do not load with weights_only=True" for n in names
                        if n in _LEGACY_SAFE_FIRST and not _loads_weights_only(archive.read(n))]
            if _LEGACY_GRAPH in names:
                findings += _graph_findings(_LEGACY_GRAPH, _json(path, _LEGACY_GRAPH, archive.read(_LEGACY_GRAPH)))
    except _ZIP_ERRORS as e:
        raise ModelLoadError(f"{path!r} is not a readable zip archive ({e}): write it with torch.export.save") from None
    return findings + _pt2_findings(path)


def _pt2_findings(path: str) -> list[str]:
    try:
        reader = PT2ArchiveReader(path)
        names = reader.get_file_names()
    except (RuntimeError, AssertionError):
        return []  # not the PT2 layout: torch.export.load does not read it as one either
    seen = {}
    for name in names:
        if name.lower() in seen:
            raise ModelLoadError(f"{path!r} holds entries {seen[name.lower()]!r} and {name!r}, which torch's "
                                 "loader does not tell apart: write it again with torch.export.save")
        seen[name.lower()] = name
    try:
        return [finding for name in names for finding in _entry_findings(path, reader, name)]
    except RuntimeError as e:  # torch's reader: a bad record
        raise ModelLoadError(f"{path!r} is a corrupt archive ({str(e).splitlines()[0]}): "
                             "write it again with torch.export.save") from None


def _entry_findings(path: str, reader: PT2ArchiveReader, name: str) -> list[str]:
    key = name.lower()
    what = next((w for (folder, suffix), w in _SAFE_FIRST.items() if key.startswith(folder) and key.endswith(suffix)),
                None)
    if what:
        return [] if _loads_weights_only(reader.read_bytes(name)) else [
            f"{what} {name!r} do not load with weights_only=True"]
    if _matches(key, WEIGHTS_CONFIG_FILENAME_FORMAT):
        return [f"weight {fqn!r} is stored with use_pickle"
                for fqn, meta in _payload_config(path, name, reader.read_bytes(name)).items() if meta.get("use_pickle")]
    if _matches(key, CONSTANTS_CONFIG_FILENAME_FORMAT):
        return [f for fqn, meta in _payload_config(path, name, reader.read_bytes(name)).items()
                if (f := _constant_finding(fqn, meta))]
    if key.startswith(MODELS_DIR):
        return _graph_findings(name, _json(path, name, reader.read_bytes(name)))
    if key.startswith(AOTINDUCTOR_DIR):
        return [f"AOTInductor entry {name!r} is native code that torch.export.load loads"]
    return []


def _matches(key: str, filename_format: str) -> bool:
    prefix, suffix = filename_format.split("{}")
    return key.startswith(prefix) and key.endswith(suffix)


def _constant_finding(fqn: str, meta: dict) -> str | None:
    if meta["path_name"].startswith(CUSTOM_OBJ_FILENAME_PREFIX):
        return f"torchbind constant {fqn!r} is a pickled TorchScript object"
    if meta["path_name"].startswith(OPAQUE_OBJ_FILENAME_PREFIX):
        return f"opaque constant {fqn!r} is a pickled Python object"
    return f"constant {fqn!r} is stored with use_pickle" if meta.get("use_pickle") else None


def _loads_weights_only(data: bytes) -> bool:
    """Whether torch's restricted unpickler loads `data` (torch skips empty payloads)."""
    if not data:
        return True
    try:
        torch.load(io.BytesIO(data), weights_only=True)
    except Exception:  # what torch.export.load catches before it retries with weights_only=False
        return False
    return True


def _json(path: str, name: str, data: bytes):
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        raise ModelLoadError(f"entry {name!r} of {path!r} is not valid JSON: "
                             "write it again with torch.export.save") from None


def _payload_config(path: str, name: str, data: bytes) -> dict:
    """{fqn: payload meta} of a weights or constants config."""
    config = _json(path, name, data)
    config = config.get("config") if isinstance(config, dict) else None
    if not isinstance(config, dict) or not all(isinstance(m, dict) and isinstance(m.get("path_name"), str)
                                               for m in config.values()):
        raise ModelLoadError(f"entry {name!r} of {path!r} is not a payload config: "
                             "write it again with torch.export.save")
    return config


def _graph_findings(name: str, graph) -> list[str]:
    return [f"graph name {n!r} in {name!r} is not a Python identifier, and FX would run it as code"
            for n in _code_names(graph) if n and not n.isidentifier()]


def _code_names(tree) -> list[str]:
    """The graph names in a model's JSON that FX writes into Python source, once each: every `name`,
    `as_name` and `forward_arg_names` entry (tensor, symbol, subgraph and argument names)."""
    names, stack = [], [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            for key, value in item.items():
                if key in ("name", "as_name"):
                    names.append(value)
                elif key == "forward_arg_names" and isinstance(value, list):
                    names.extend(value)
                else:
                    stack.append(value)
    return list(dict.fromkeys(n for n in names if isinstance(n, str)))
