"""The README keeps its promises: the two set-up commands, and a measures reference that matches the code."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _script():
    spec = importlib.util.spec_from_file_location(
        "measures_reference", ROOT / "scripts" / "measures_reference.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_starts_with_the_two_commands() -> None:
    """The first two code blocks: install + analyze a bundled sample, install test extras + pytest."""
    blocks = re.findall(r"```bash\n(.*?)```", README, re.S)
    assert blocks[0].strip() == "pip install . && forensics analyze sample_runs/bad_batch"
    assert blocks[1].strip() == "pip install '.[test]' && pytest"
    assert (ROOT / "sample_runs" / "bad_batch").is_dir()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install '.[test]' && pytest" in ci


def test_measures_reference_is_current() -> None:
    """The README's measures section is exactly what the detectors' docstrings say."""
    mod = _script()
    assert mod.readme_section(README) == mod.render(), (
        "run: python scripts/measures_reference.py --write"
    )


def _documented() -> dict[str, set[str]]:
    return {k: {key for key, _ in rows} for k, rows in _script().collect().items()}


def _sample_runs() -> list[Path]:
    root = ROOT / "sample_runs"
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name != "generator")


def test_every_emitted_measure_is_documented() -> None:
    """Every measures key the detectors emit on the sample runs and a few synthetic cases is in the reference."""
    from synthetic import long_frame, run_from_frame

    import forensics

    documented = _documented()
    findings = []
    for path in _sample_runs():
        try:
            findings += forensics.analyze(path).findings
        except forensics.ForensicsError:
            continue  # a sample whose importer is still missing; the sample-run test reports it
    steps = np.arange(3000)
    loss = 2 + 5 / (1 + steps / 100)
    spiky = loss.copy()
    spiky[1500:1503] *= 3
    run = run_from_frame(
        long_frame(
            {
                "loss": (steps, spiky),
                "grad_norm": (steps, np.where((steps > 1499) & (steps < 1503), 9.0, 1.0)),
            }
        )
    )
    findings += forensics.detect(run)
    assert findings
    missing = sorted(
        {
            (f.kind.value, k)
            for f in findings
            for k in f.measures
            if k not in documented.get(f.kind.value, set())
        }
    )
    assert not missing, f"undocumented measures: {missing}"


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
    dets = {d.name: d for d in build(cfg.detectors)}
    assert dets["spikes"].recover_steps == 300
