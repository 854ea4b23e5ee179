""".pt2 files that could run code when loaded are refused unless trusted; ordinary ones load."""

import io
import json
import pathlib
import pickle
import zipfile

import pytest
import torch
from torch._export.serde.schema import SCHEMA_VERSION
from torch.export import Dim

from models import peft_llama
from stageml.compiler import frontend, model_file
from stageml.errors import ModelLoadError

TRUST_FIX = r"pass --trust-model \(trust_model=True\) only if you trust where the file came from"


class Payload:
    """Unpickling it touches `marker`: what a tampered file's pickle could do, harmlessly."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (pathlib.Path(self.marker),)


class Buffered(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)
        self.register_buffer("scale", torch.ones(4))
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, x, bias):
        self.calls.add_(1)
        return self.fc(x) * self.scale + bias


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> str:
    """An ordinary torch.export.save file: buffers (one mutated), a dynamic batch dimension."""
    path = tmp_path_factory.mktemp("saved") / "model.pt2"
    program = torch.export.export(Buffered(), (torch.randn(2, 8), torch.randn(4)),
                                  dynamic_shapes=({0: Dim("batch", max=64)}, None))
    torch.export.save(program, str(path))
    return str(path)


def _tampered(saved, tmp_path, edit) -> str:
    """A copy of `saved` after `edit` changed its entries ({name below the root folder: bytes}) in place."""
    with zipfile.ZipFile(saved) as archive:
        root = archive.namelist()[0].split("/")[0]
        entries = {n.split("/", 1)[1]: archive.read(n) for n in archive.namelist()}
    edit(entries)
    path = tmp_path / "tampered.pt2"
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in entries.items():
            archive.writestr(f"{root}/{name}", data)
    return str(path)


def _payload_pickle(tmp_path) -> bytes:
    buffer = io.BytesIO()
    torch.save((Payload(tmp_path / "marker"),), buffer)
    return buffer.getvalue()


def _edit_config(entries, name, edit):
    config = json.loads(entries[name])
    edit(config["config"])
    entries[name] = json.dumps(config).encode()


def _assert_refused(path, tmp_path, entry):
    with pytest.raises(ModelLoadError, match=rf"can run code when loaded: .*{entry}.*; {TRUST_FIX}$"):
        frontend.load_exported(path)
    assert not (tmp_path / "marker").exists()
    model_file.check_trusted(path, trust_model=True)
    assert not (tmp_path / "marker").exists()


def test_ordinary_model_passes(saved):
    assert model_file.inspect_archive(saved) == []
    model_file.check_trusted(saved, trust_model=False)
    program = frontend.load_exported(saved)
    assert {"fc.weight", "scale", "calls"} <= set(program.state_dict)


def test_peft_model_passes(tmp_path):
    program = torch.export.export(peft_llama(), (torch.randint(0, 128, (2, 7)),), strict=False,
                                  dynamic_shapes=({0: Dim("batch", max=8), 1: Dim("seq", max=64)},))
    torch.export.save(program, str(tmp_path / "peft.pt2"))
    assert model_file.inspect_archive(str(tmp_path / "peft.pt2")) == []


def test_sample_inputs_with_a_payload(saved, tmp_path):
    def edit(entries):
        entries["data/sample_inputs/model.pt"] = _payload_pickle(tmp_path)
    path = _tampered(saved, tmp_path, edit)
    _assert_refused(path, tmp_path, r"sample inputs 'data/sample_inputs/model.pt' do not load with weights_only=True")
    frontend.load_exported(path, trust_model=True)  # torch's fallback unpickle runs it: the file is a real attack
    assert (tmp_path / "marker").exists()


def test_entry_names_are_matched_ignoring_case(saved, tmp_path):
    """torch's zip reader finds 'data/sample_inputs/model.pt' under any case."""
    def edit(entries):
        del entries["data/sample_inputs/model.pt"]
        entries["data/SAMPLE_INPUTS/model.pt"] = _payload_pickle(tmp_path)
    _assert_refused(_tampered(saved, tmp_path, edit), tmp_path, "sample inputs 'data/SAMPLE_INPUTS/model.pt'")


def test_names_differing_only_in_case_are_refused(saved, tmp_path):
    def edit(entries):
        entries["DATA/sample_inputs/model.pt"] = _payload_pickle(tmp_path)
    with pytest.raises(ModelLoadError, match="holds entries 'data/sample_inputs/model.pt' and "
                                             "'DATA/sample_inputs/model.pt', which torch's loader does not tell apart"):
        model_file.check_trusted(_tampered(saved, tmp_path, edit), trust_model=True)


def test_weight_stored_with_use_pickle(saved, tmp_path):
    def edit(entries):
        _edit_config(entries, "data/weights/model_weights_config.json",
                     lambda config: config["fc.weight"].update(use_pickle=True, path_name="weight_9"))
        entries["data/weights/weight_9"] = _payload_pickle(tmp_path)
    _assert_refused(_tampered(saved, tmp_path, edit), tmp_path, "weight 'fc.weight' is stored with use_pickle")


@pytest.mark.parametrize("path_name, use_pickle, finding", [
    ("opaque_obj_0", True, "opaque constant 'c' is a pickled Python object"),
    ("custom_obj_0", True, "torchbind constant 'c' is a pickled TorchScript object"),
    ("tensor_0", True, "constant 'c' is stored with use_pickle"),
])
def test_pickled_constants(saved, tmp_path, path_name, use_pickle, finding):
    def edit(entries):
        _edit_config(entries, "data/constants/model_constants_config.json", lambda config: config.update(
            c={"path_name": path_name, "is_param": False, "use_pickle": use_pickle, "tensor_meta": None}))
        entries[f"data/constants/{path_name}"] = pickle.dumps(Payload(tmp_path / "marker"))
    _assert_refused(_tampered(saved, tmp_path, edit), tmp_path, finding)


def test_aotinductor_library(saved, tmp_path):
    def edit(entries):
        entries["data/aotinductor/model/model.so"] = b"\x7fELF"
    _assert_refused(_tampered(saved, tmp_path, edit), tmp_path,
                    "AOTInductor entry 'data/aotinductor/model/model.so' is native code")


def test_graph_name_that_is_code(saved, tmp_path):
    """FX writes graph input names into the `def forward(...)` it generates and runs at load."""
    code = f"bias=__import__('pathlib').Path({str(tmp_path / 'marker')!r}).touch()"

    def edit(entries):
        entries["models/model.json"] = entries["models/model.json"].replace(b'"bias"', json.dumps(code).encode())
    path = _tampered(saved, tmp_path, edit)
    _assert_refused(path, tmp_path, "graph name .* in 'models/model.json' is not a Python identifier")
    frontend.load_exported(path, trust_model=True)
    assert (tmp_path / "marker").exists()


def test_pre_2_8_layout_with_a_payload(saved, tmp_path):
    """torch reads this layout, with zipfile, where the PT2 one fails."""
    path = tmp_path / "legacy.pt2"
    with zipfile.ZipFile(saved) as archive, zipfile.ZipFile(path, "w") as legacy:
        legacy.writestr("version", ".".join(map(str, SCHEMA_VERSION)))
        graph = archive.read(next(n for n in archive.namelist() if n.endswith("/models/model.json")))
        legacy.writestr("serialized_exported_program.json", graph.replace(b'"bias"', b'"bias=0"'))
        legacy.writestr("serialized_state_dict.pt", b"")
        legacy.writestr("serialized_constants.pt", b"")
        legacy.writestr("serialized_example_inputs.pt", _payload_pickle(tmp_path))
    _assert_refused(str(path), tmp_path, "sample inputs 'serialized_example_inputs.pt' do not load")
    assert "graph name 'bias=0' in 'serialized_exported_program.json' is not a Python identifier, " \
           "and FX would run it as code" in model_file.inspect_archive(str(path))


@pytest.mark.parametrize("damage", ["central directory", "truncated", "not a zip"])
def test_unreadable_archives(saved, tmp_path, damage):
    data = open(saved, "rb").read()
    directory = int.from_bytes(data[data.rfind(b"PK\x05\x06") + 16:][:4], "little")  # the end record's offset
    data = {"central directory": lambda: data[:directory] + b"PK\x00\x00" + data[directory + 4:],
            "truncated": lambda: data[:len(data) // 2],
            "not a zip": lambda: b"not a model\n" * 100}[damage]()
    (tmp_path / "bad.pt2").write_bytes(data)
    for trust_model in (False, True):
        with pytest.raises(ModelLoadError, match="is not a readable zip archive .*: write it with torch.export.save"):
            frontend.load_exported(str(tmp_path / "bad.pt2"), trust_model)


def test_pickled_module_is_refused_even_when_trusted(tmp_path):
    torch.save(Buffered(), tmp_path / "pickled.pt")
    with pytest.raises(ModelLoadError, match=r"is a pickled model \(torch.save\), not an ExportedProgram"):
        frontend.load_exported(str(tmp_path / "pickled.pt"), trust_model=True)


def test_a_flipped_byte_in_a_stored_weight_is_refused(saved, tmp_path):
    # torch's reader checks no CRC: without the check a flipped weight byte would compile.
    with zipfile.ZipFile(saved) as archive:
        entry = next(i for i in archive.infolist() if "/data/weights/" in i.filename and i.file_size > 16)
    data = bytearray(pathlib.Path(saved).read_bytes())
    with open(saved, "rb") as f:  # the entry's bytes start after its local header and name and extra field
        f.seek(entry.header_offset + 26)
        name_length, extra_length = (int.from_bytes(f.read(2), "little") for _ in range(2))
    data[entry.header_offset + 30 + name_length + extra_length + entry.file_size // 2] ^= 0x01
    damaged = tmp_path / "damaged.pt2"
    damaged.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match=f"its entry '{entry.filename}' fails its checksum"):
        model_file.check_trusted(str(damaged), True)
