"""The package's layers (CONTRIBUTING.md, "Layers"): every module imports only from its own layer
or the ones below it, so the dependency arrows all point down. Reads the imports with ``ast``
(imports inside functions included, and a string that names a package module, as
``importlib.import_module`` takes it), so a leak fails here before anyone trips over a cycle.
"""
import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "jetspec_kernels"

# Lowest first. A name covers the module or package of that name (dotted, relative to
# jetspec_kernels); the longest match wins, so "ops._reference" sits below "ops".
LAYERS = [
    ("limits", "python_ref", "_C"),        # numbers, the spec, the extension: no package imports
    ("device_guard", "backend_error"),     # what backend choice and backends share: the CUDA
                                           # device guard, BackendUnavailableError
    ("checks",),                           # argument checks
    ("tree",),                             # result types (Tree, Verdict, Commit)
    ("launch_plan",),                      # SM count, split-KV rules (both backends)
    ("ops._reference", "triton", "cuda"),  # the backends
    ("backend",),                          # backend choice (imports the backends on first use)
    ("ops",),                              # the public ops: contract checks, then dispatch
    ("adaptive",),                         # adaptive tree budget
    ("tp",),                               # tensor parallelism over torch.distributed
    ("models",),                           # Qwen3 target, draft head
    ("decode",),                           # the decoding loops
    ("",),                                 # jetspec_kernels/__init__.py: the public API
    ("train", "demo", "demo_random", "generate_cli", "cli_common", "__main__"),  # tools
]


def layer_of(module: str) -> int:
    """Layer index of ``module`` (dotted, relative to the package; "" is the package root)."""
    best, best_len = None, -1
    for i, names in enumerate(LAYERS):
        for name in names:
            covers = module == name or (name and module.startswith(name + "."))
            if covers and len(name) > best_len:
                best, best_len = i, len(name)
    if best is None:
        raise KeyError(module)
    return best


def _is_module(dotted: str) -> bool:
    if dotted in ("_C", "python_ref"):
        return True
    path = PKG.joinpath(*dotted.split(".")) if dotted else PKG
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _names_a_module(text: str) -> bool:
    """Whether ``text`` is the absolute dotted name of a module of the package."""
    dotted = text.removeprefix("jetspec_kernels.")
    if dotted == text or not dotted.replace(".", "").replace("_", "").isalnum():
        return False
    return _is_module(dotted)


def _modules():
    """(dotted name relative to the package, is a package, path) of every module."""
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(PKG).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        yield ".".join(parts), is_pkg, path


def imports_of(module: str, is_pkg: bool, source: str) -> set[str]:
    """The package modules that ``source`` (the text of ``module``) imports, relative dotted."""
    here = module.split(".") if module else []
    base = here if is_pkg else here[:-1]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
            froms = []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                stem = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join(stem + ([node.module] if node.module else []))
                targets = []
                froms = [(target, a.name) for a in node.names]
            else:
                targets = []
                froms = [(node.module or "", a.name) for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            targets = [node.value] if _names_a_module(node.value) else []
            froms = []
        else:
            continue
        for t in targets:
            if t == "jetspec_kernels" or t.startswith("jetspec_kernels."):
                found.add(t.removeprefix("jetspec_kernels").lstrip("."))
        for target, name in froms:
            if node.level == 0:
                if target != "jetspec_kernels" and not target.startswith("jetspec_kernels."):
                    continue
                target = target.removeprefix("jetspec_kernels").lstrip(".")
            sub = f"{target}.{name}" if target else name
            found.add(sub if _is_module(sub) else target)
    return found


def test_every_module_has_a_layer():
    for module, _, path in _modules():
        try:
            layer_of(module)
        except KeyError:
            pytest.fail(f"{path.relative_to(PKG.parent)}: no layer in tests/test_layers.py "
                        "LAYERS (and CONTRIBUTING.md's picture); place it deliberately")


def test_no_module_imports_a_layer_above_it():
    leaks = []
    for module, is_pkg, path in _modules():
        mine = layer_of(module)
        for dep in sorted(imports_of(module, is_pkg, path.read_text())):
            if layer_of(dep) > mine:
                leaks.append(f"{module or '__init__'} ({LAYERS[mine]}) imports {dep or 'the root'} "
                             f"({LAYERS[layer_of(dep)]})")
    assert not leaks, "imports that point up a layer:\n" + "\n".join(leaks)


def test_no_module_imports_another_modules_private_names():
    """A name another module needs gets a real name (e.g. ops.draft_tree.tree_from_checked_topk,
    not ``_build``); ``_C`` is the extension's name."""
    found = []
    for module, _, path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                found += [f"{module}: {a.name}" for a in node.names
                          if a.name.startswith("_") and a.name != "_C"]
    assert not found, "private names imported across modules:\n" + "\n".join(found)


def test_the_check_sees_imports():
    """The parser finds relative, absolute and in-function imports (so the check above can fail)."""
    src = ("from .. import checks\nfrom ..ops.draft_tree import draft_tree\nimport jetspec_kernels as jk\n"
           "def f():\n    from ..decode import generate\n    from . import _util\n")
    assert imports_of("cuda.pack_mask", False, src) == {"checks", "ops.draft_tree", "", "decode",
                                                        "cuda"}
    assert imports_of("ops", True, "from . import _reference\n") == {"ops._reference"}
    loads = 'M = {"cuda": "jetspec_kernels.cuda", "x": "jetspec_kernels.no_such_module"}\n'
    assert imports_of("backend", False, loads) == {"cuda"}
    assert layer_of("ops._reference") < layer_of("ops.draft_tree") < layer_of("decode.loop")
