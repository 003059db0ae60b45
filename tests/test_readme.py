"""The README keeps its promises: the two set-up commands, CI running them, and a measures
reference generated from forensics/measures.py."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _script():
    spec = importlib.util.spec_from_file_location(
        "measures_reference", ROOT / "scripts" / "measures_reference.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_starts_with_the_two_commands() -> None:
    """The first two code blocks: install + analyze a bundled sample, install the test extras +
    pytest."""
    blocks = re.findall(r"```bash\n(.*?)```", README, re.S)
    assert blocks[0].strip() == "pip install . && forensics analyze sample_runs/bad_batch"
    assert blocks[1].strip() == "pip install -e '.[test]' && pytest"
    assert (ROOT / "sample_runs" / "bad_batch").is_dir()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install -e '.[test]' && pytest" in ci


def test_ci_runs_the_linters_after_the_tests() -> None:
    """.ci/run: the README's test command first, then ruff check, ruff format --check, mypy."""
    ci = (ROOT / ".ci" / "run").read_text()
    order = [
        ci.index("pip install -e '.[test]' && pytest"),
        ci.index("ruff check ."),
        ci.index("ruff format --check ."),
        ci.index("mypy forensics"),
    ]
    assert order == sorted(order)
    hooks = (ROOT / ".pre-commit-config.yaml").read_text()
    for cmd in ("ruff check", "ruff format --check", "mypy forensics"):
        assert cmd in hooks, cmd


def test_measures_reference_is_current() -> None:
    """The README's measures section is exactly what forensics/measures.py declares."""
    mod = _script()
    assert mod.readme_section(README) == mod.render(), (
        "run: python scripts/measures_reference.py --write"
    )


def test_configuration_example_is_valid(tmp_path: Path) -> None:
    """The README's [tool.forensics] example loads and every detector accepts its settings."""
    from forensics.config import load
    from forensics.detectors import build

    (block,) = [
        b for b in re.findall(r"```toml\n(.*?)```", README, re.S) if "[tool.forensics]" in b
    ]
    (tmp_path / "pyproject.toml").write_text(block)
    cfg = load(cwd=tmp_path)
    assert cfg.ignore == {"plateau"} and cfg.fail_on == "critical" and cfg.checkpoint_every == 1000
    dets = {d.name: d for d in build(cfg.params)}
    assert dets["spikes"].params.recover_steps == 300


def test_readme_example_output_is_the_current_output() -> None:
    """The "What it looks like" block is what `forensics analyze sample_runs/param_norm_jump`
    prints now: every finding sentence it shows, and the rollback line, as the analysis gives
    them (compared with the terminal's wrapping taken out). It had kept "back within 5 steps"
    after the recovery rule moved that spike's recovery to 6."""
    from forensics.pipeline import analyze_run, read_run

    start = README.index("$ forensics analyze sample_runs/param_norm_jump\n")
    block = README[start : README.index("```", start)]
    flat = " ".join(block.split())
    diag = analyze_run(read_run(ROOT / "sample_runs" / "param_norm_jump"))
    shown = [f for f in diag.ranked() if f.severity.value != "info"][:5]
    assert len(shown) == 5
    for f in shown:
        assert " ".join(f.summary.split()) in flat, f.summary
    (plan,) = [r for r in diag.rollbacks if r.rollback]
    assert " ".join(plan.sentence().split()) in flat
    # The closing count of notes, by kind, as the terminal prints it now.
    import io

    from rich.console import Console

    from forensics.summary import print_summary

    out = io.StringIO()
    print_summary(diag, console=Console(file=out, width=400))
    (notes_line,) = [ln for ln in out.getvalue().splitlines() if "informational note" in ln]
    assert notes_line in block
