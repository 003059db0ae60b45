"""User configuration: ``[tool.forensics]`` in ./pyproject.toml, or ./forensics.toml.

Recognised keys::

    [tool.forensics]
    ignore = ["plateau"]              # finding kinds to drop
    fail_on = "critical"              # default for --fail-on
    checkpoint_every = 1000           # for rollback advice when the log does not say
    batch_size = 512                  # samples per step, for sample-indexed x axes
    aliases = { "my/odd_loss" = "loss" }

    [tool.forensics.detectors.spikes]  # any parameter of forensics/params.py
    recover_steps = 300

In ``forensics.toml`` the same keys sit at the top level (or under [tool.forensics]).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forensics.errors import ConfigError

if TYPE_CHECKING:
    from forensics.params import Params

# forensics.params (about 20 frozen dataclasses, 12-16 ms to import) and forensics.findings are
# imported when a configuration file is checked or the parameters are asked for: a command
# that reads no configuration (export, metrics) does without them.

FAIL_ON = ("warning", "critical", "fatal")


@dataclass
class Config:
    ignore: set[str] = field(default_factory=set)
    fail_on: str | None = None
    checkpoint_every: int | None = None
    batch_size: int | None = None
    aliases: dict[str, str] = field(default_factory=dict)
    detectors: dict[str, dict[str, Any]] = field(default_factory=dict)
    source: str | None = None  # the file it came from

    @property
    def params(self) -> Params:
        """Every detector's parameters: the configured ones checked against their declarations."""
        from forensics.params import resolve

        return resolve(self.detectors)


def _check_kinds(kinds: list[str] | set[str], where: str) -> set[str]:
    from forensics.findings import FindingKind

    known = {k.value for k in FindingKind}
    bad = [k for k in kinds if k not in known]
    if bad:
        raise ConfigError(
            f"{where}: unknown finding kind(s) {', '.join(bad)}; "
            f"known kinds: {', '.join(sorted(known))}"
        )
    return set(kinds)


def from_mapping(data: dict[str, Any], where: str) -> Config:
    allowed = {"ignore", "fail_on", "checkpoint_every", "batch_size", "aliases", "detectors"}
    extra = set(data) - allowed
    if extra:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(sorted(extra))}; "
            f"allowed: {', '.join(sorted(allowed))}"
        )
    cfg = Config(source=where)
    ignore = data.get("ignore", [])
    if not isinstance(ignore, list) or not all(isinstance(k, str) for k in ignore):
        raise ConfigError(
            f'{where}: ignore must be a list of finding kinds, e.g. ignore = ["plateau"]'
        )
    cfg.ignore = _check_kinds(ignore, where)
    fail_on = data.get("fail_on")
    if fail_on is not None and fail_on not in FAIL_ON:
        raise ConfigError(f"{where}: fail_on must be one of {', '.join(FAIL_ON)}")
    cfg.fail_on = fail_on
    for key in ("checkpoint_every", "batch_size"):
        v = data.get(key)
        if v is not None and (not isinstance(v, int) or v <= 0):
            raise ConfigError(f"{where}: {key} must be a positive integer")
        setattr(cfg, key, v)
    aliases = data.get("aliases", {})
    if not isinstance(aliases, dict) or not all(isinstance(v, str) for v in aliases.values()):
        raise ConfigError(f"{where}: aliases must be a table of raw tag = canonical name")
    from forensics.schema import check_aliases

    check_aliases(aliases)
    cfg.aliases = dict(aliases)
    dets = data.get("detectors", {})
    if not isinstance(dets, dict) or not all(isinstance(v, dict) for v in dets.values()):
        raise ConfigError(f"{where}: detectors must hold one table per detector")
    cfg.detectors = {k: dict(v) for k, v in dets.items()}
    from forensics.params import resolve

    try:
        resolve(cfg.detectors)  # every problem at once, when the file loads
    except ConfigError as exc:
        lines = str(exc).splitlines()
        raise ConfigError("\n".join(f"{where}: {line}" for line in lines)) from None
    return cfg


def load(cwd: Path | None = None, explicit: Path | None = None) -> Config:
    """The configuration in force: an explicit file, else ./forensics.toml, else
    ./pyproject.toml."""
    cwd = cwd or Path.cwd()
    candidates = [explicit] if explicit else [cwd / "forensics.toml", cwd / "pyproject.toml"]
    for path in candidates:
        if path is None or not path.is_file():
            if explicit:
                raise ConfigError(f"{explicit}: no such configuration file")
            continue
        import tomllib  # (only when a file is there: a few ms of every start otherwise)

        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: not valid TOML ({exc})") from None
        section = data.get("tool", {}).get("forensics")
        if section is None and path.name != "pyproject.toml":
            section = data
        if section is None:
            continue
        return from_mapping(section, str(path))
    return Config()


def parse_alias(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        raw, sep, canon = item.rpartition("=")
        if not sep or not raw or not canon:
            raise ConfigError(f"--alias {item!r}: expected raw_tag=canonical_name")
        out[raw] = canon
    from forensics.schema import check_aliases

    check_aliases(out)
    return out
