"""The layout docs/architecture.md promises: op modules share one template and no private names, and every
code name the note mentions exists."""
import ast
import re
from pathlib import Path

import pytest

from cupyconv import _device

ROOT = Path(__file__).resolve().parent.parent
OPS_DIR = ROOT / "cupyconv" / "ops"
SECTIONS = ("# CPU path", "# GPU path", "# Public API")


@pytest.mark.parametrize("op", _device.OPS)
def test_op_modules_import_no_private_name_of_a_sibling(op):
    tree = ast.parse((OPS_DIR / f"{op}.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module in _device.OPS:
            private = [alias.name for alias in node.names if alias.name.startswith("_")]
            assert not private, f"ops/{op}.py imports {private} from ops/{node.module}.py"


@pytest.mark.parametrize("op", _device.OPS)
def test_op_modules_follow_the_template(op):
    text = (OPS_DIR / f"{op}.py").read_text()
    positions = [text.find(f"\n{section}") for section in SECTIONS]
    assert all(p >= 0 for p in positions) and positions == sorted(positions), \
        f"ops/{op}.py must have the sections {SECTIONS} in that order"
    tree = ast.parse(text)
    defined = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    defined |= {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assert {"KERNELS", "instantiations"} <= defined
    gpu = {name for name in defined if name.endswith("_gpu")}
    assert gpu, f"ops/{op}.py has no <op>_gpu function"
    # Settings are read from cupyconv.settings, never kept or set in an op module.
    assert not {name for name in defined if re.match(r"(set|get)_", name)}


def _code_names(text: str) -> set[str]:
    """Identifiers in code blocks and `backticks` that look like code: snake_case with an underscore or
    CamelCase (the last part of a dotted name)."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M))
    names = set()
    for span in blocks + inline:
        span = re.sub(r"[\w.]*<[a-z]+>[\w.]*", " ", span)  # templates like <op>_backward_gpu name no one thing
        for token in re.findall(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*", span):
            last = token.split(".")[-1]
            if "_" in last.strip("_") or re.fullmatch(r"[A-Z][a-z]+[A-Z]\w*", last):
                names.add(last)
    return names


def test_the_architecture_note_names_only_what_exists():
    note = (ROOT / "docs" / "architecture.md").read_text()
    sources = "\n".join(p.read_text() for pattern in ("cupyconv/**/*.py", "raw_kernels/*", "tests/**/*.py",
                                                      "benchmarks/*.py") for p in ROOT.glob(pattern))
    missing = sorted(name for name in _code_names(note) if not re.search(rf"\b{re.escape(name)}\b", sources))
    assert not missing, f"docs/architecture.md names what the code does not have: {missing}"
