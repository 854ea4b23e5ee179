import pytest

import stageml
from stageml import BindingTime
from stageml.compiler.stage_spec import parse_stage_option, resolve


def test_order_and_join():
    assert BindingTime.STATIC < BindingTime.ADAPTER < BindingTime.DYNAMIC
    assert BindingTime.STATIC.join(BindingTime.ADAPTER) is BindingTime.ADAPTER
    assert BindingTime.DYNAMIC.join(BindingTime.STATIC) is BindingTime.DYNAMIC
    assert BindingTime.STATIC.join() is BindingTime.STATIC


@pytest.mark.parametrize("name,time", [("static", BindingTime.STATIC), ("Adapter", BindingTime.ADAPTER),
                                       (" dynamic ", BindingTime.DYNAMIC)])
def test_parse(name, time):
    assert BindingTime.parse(name) is time


def test_parse_unknown_name_is_an_error():
    with pytest.raises(stageml.StageMLError, match="unknown binding time 'later'"):
        BindingTime.parse("later")


def test_default_spec():
    names = ["fc.weight", "fc.lora_A.default.weight", "x"]
    times = resolve(names, {"fc.weight", "fc.lora_A.default.weight"})
    assert times == {"fc.weight": BindingTime.STATIC, "fc.lora_A.default.weight": BindingTime.ADAPTER,
                     "x": BindingTime.DYNAMIC}


def test_user_globs_override_defaults_in_order():
    names = ["a.weight", "b.weight", "x"]
    times = resolve(names, {"a.weight", "b.weight"}, [("*.weight", "adapter"), ("b.*", "dynamic")])
    assert times["a.weight"] is BindingTime.ADAPTER and times["b.weight"] is BindingTime.DYNAMIC


def test_glob_matching_nothing_is_an_error():
    with pytest.raises(stageml.StageMLError, match="'nope.*' matches no parameter"):
        resolve(["fc.weight"], {"fc.weight"}, {"nope.*": "static"})


def test_stage_option_syntax():
    assert parse_stage_option("*.lora_*=adapter") == ("*.lora_*", BindingTime.ADAPTER)
    with pytest.raises(stageml.StageMLError, match="not GLOB=TIME"):
        parse_stage_option("fc.weight")
