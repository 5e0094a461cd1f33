"""The runtime never imports the training recipe: ``train/`` only remakes the shipped tiny models,
and what ``--tiny`` and the demo need (the loader, the byte tokenizer, the acceptance table) lives
beside the models and the decoding loop."""
import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "jetspec_kernels"


def test_no_module_outside_train_imports_train():
    from test_layers import imports_of
    found = []
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(PKG).with_suffix("").parts)
        if parts[0] == "train":
            continue
        is_pkg = parts[-1] == "__init__"
        module = ".".join(parts[:-1] if is_pkg else parts)
        deps = imports_of(module, is_pkg, path.read_text())
        found += [f"{module} imports {d}" for d in deps if d == "train" or d.startswith("train.")]
    assert not found, "\n".join(found)


def test_generate_tiny_runs_without_the_training_package():
    """``jetspec generate --tiny`` end to end in a fresh interpreter; jetspec_kernels.train is never
    imported (checked in sys.modules after the run)."""
    code = (
        "import sys\n"
        "from jetspec_kernels.__main__ import main\n"
        "import jetspec_kernels.demo\n"
        "rc = main(['generate', '--tiny', '--prompt', 'def f(x):', '--max-new-tokens', '4',\n"
        "           '--budget', '4', '--backend', 'reference', '--device', 'cpu'])\n"
        "assert rc == 0, rc\n"
        "leaked = sorted(m for m in sys.modules if m.startswith('jetspec_kernels.train'))\n"
        "print('LEAKED', leaked)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "LEAKED []" in out.stdout, out.stdout
