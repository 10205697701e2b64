"""The public API is typed and documented: every public function of cupyconv, cupyconv.settings and cupyconv.cudnn
annotates every parameter and its return and has NumPy-style Parameters (each parameter, in order) and Returns
sections, and the API reference (docs/api.rst) lists every public name, cupyconv.torch's included."""
import inspect
import re
from pathlib import Path

import pytest

import cupyconv
from cupyconv import cudnn, settings

ROOT = Path(__file__).resolve().parent.parent
TYPED_MODULES = (cupyconv, settings, cudnn)


def _public_functions():
    seen = {}
    for module in TYPED_MODULES:
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isfunction(obj):
                seen.setdefault(obj, f"{module.__name__}.{name}")  # the settings re-exported by cupyconv once
    return sorted((qualname, function) for function, qualname in seen.items())


PUBLIC_FUNCTIONS = _public_functions()


def _section(doc: str, title: str) -> list[str]:
    """The entry lines (not indented) of a NumPy-style section of a cleaned docstring."""
    match = re.search(rf"^{title}\n-{{{len(title)}}}\n(.*?)(?=\n\n\S+\n-+\n|\Z)", doc, re.S | re.M)
    return [] if match is None else [line for line in match.group(1).splitlines() if line and not line[0].isspace()]


def test_there_are_public_functions():
    assert len(PUBLIC_FUNCTIONS) > 40


@pytest.mark.parametrize("qualname, function", PUBLIC_FUNCTIONS, ids=[q for q, _ in PUBLIC_FUNCTIONS])
def test_public_function_is_annotated(qualname, function):
    signature = inspect.signature(function)
    missing = [name for name, p in signature.parameters.items() if p.annotation is inspect.Parameter.empty]
    assert not missing, f"{qualname}: parameters without a type annotation: {missing}"
    assert signature.return_annotation is not inspect.Signature.empty, f"{qualname}: no return annotation"


@pytest.mark.parametrize("qualname, function", PUBLIC_FUNCTIONS, ids=[q for q, _ in PUBLIC_FUNCTIONS])
def test_public_function_has_numpy_style_sections(qualname, function):
    doc = inspect.getdoc(function)
    assert doc, f"{qualname} has no docstring"
    parameters = list(inspect.signature(function).parameters)
    documented = [name.strip() for line in _section(doc, "Parameters") for name in line.split(" : ")[0].split(",")]
    assert documented == parameters, f"{qualname}: the Parameters section names {documented}, not {parameters}"
    if inspect.signature(function).return_annotation not in (None, "None"):
        assert _section(doc, "Returns"), f"{qualname} returns a value but has no Returns section"


def test_the_section_parser_can_fail():
    doc = "Do it.\n\nParameters\n----------\nx : array\n    The input.\ny, z : int\n    Sizes.\n\nReturns\n-------\nint"
    assert _section(doc, "Parameters") == ["x : array", "y, z : int"]
    assert _section(doc, "Returns") == ["int"]
    assert _section("Do it.", "Parameters") == []


def _documented_names() -> set[str]:
    text = (ROOT / "docs" / "api.rst").read_text()
    return set(re.findall(r"^\.\. auto(?:function|class|data|module):: (\S+)", text, re.M))


@pytest.mark.parametrize("module_name", ["cupyconv", "cupyconv.settings", "cupyconv.cudnn", "cupyconv.torch"])
def test_the_api_reference_lists_every_public_name(module_name):
    if module_name == "cupyconv.torch":
        pytest.importorskip("torch")
    module = __import__(module_name, fromlist=["__all__"])
    documented = _documented_names()
    missing = []
    for name in module.__all__:
        obj = getattr(module, name)
        places = {f"{module_name}.{name}"}
        if inspect.ismodule(obj):
            places.add(obj.__name__)  # its automodule
        if module is cupyconv and getattr(settings, name, None) is obj:
            places.add(f"cupyconv.settings.{name}")  # documented once, where it lives
        if not places & documented:
            missing.append(name)
    assert not missing, f"docs/api.rst does not list these names of {module_name}.__all__: {missing}"
