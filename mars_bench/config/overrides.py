"""Command-line overrides checked before Hydra composes them: text Hydra cannot parse, a value of the wrong type
for its schema field, an unknown setting or group option, each one ``ConfigError`` line instead of Hydra's
multi-line error; and ``Launch``, what the command line chose beyond the job's config, read from Hydra once by the
CLI and handed down."""
from __future__ import annotations

from dataclasses import MISSING, dataclass
from typing import Any

from mars_bench.config.schema import Config
from mars_bench.base.errors import ConfigError


@dataclass(frozen=True)
class Launch:
    """What the command line chose beyond the job's own config, read once by the CLI (``cli.app``) and handed down:
    ``variants``, the composed config of every ``interleave`` entry (the CLI composes them from this job's
    overrides plus the entry's; empty without ``interleave``), and ``sweep``, the name that groups the job's runs
    (the chosen ``sweep`` or ``experiment`` config, else ``multirun`` / ``run``; the W&B group)."""
    variants: tuple = ()
    sweep: str = "run"


def _type_words(tp: Any) -> str:
    import typing

    args = [a for a in typing.get_args(tp) if a is not type(None)]
    optional = len(args) < len(typing.get_args(tp))
    base = args[0] if optional and len(args) == 1 else tp
    words = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(base, "a value")
    return words + (" or null" if optional else "")


def _field_types(node=None, prefix: str = "") -> dict:
    import typing
    from dataclasses import fields, is_dataclass

    out = {}
    hints = typing.get_type_hints(node or Config)
    for f in fields(node or Config):
        tp = hints[f.name]
        factory = f.default_factory if f.default_factory is not MISSING else None
        if is_dataclass(tp) or (factory is not None and is_dataclass(factory)):   # e.g. rule: RuleConfig
            out.update(_field_types(tp if is_dataclass(tp) else factory, f"{prefix}{f.name}."))
        elif factory is not None and isinstance(factory(), dict):                 # e.g. stats: a plain dict
            out.update({f"{prefix}{f.name}.{k}": Any for k in factory()})
        else:
            out[f"{prefix}{f.name}"] = tp
    return out


def _engine_settings(conf) -> dict[str, set[str]]:
    """engine name -> the settings its YAML (conf/engine/<name>.yaml) declares under ``engine``: its own, beside
    ``name`` and ``version`` (the schema's); their values are checked by the engine's package."""
    import yaml

    out = {}
    for path in conf.glob("engine/*.yaml"):
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        node = data.get("engine") if isinstance(data.get("engine"), dict) else data
        out[path.stem] = {k for k in node if isinstance(k, str)} | {"name", "version"}
    return out


def check_overrides(argv: list[str], conf_dir: str | None = None) -> None:
    """Command-line overrides that Hydra would refuse with a multi-line error (unparsable text, a value of the
    wrong type, an unknown group option) become one ConfigError line, before Hydra composes anything."""
    from pathlib import Path

    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    conf = Path(conf_dir) if conf_dir else Path(__file__).resolve().parents[1] / "conf"   # shipped in the package
    parser, types = OverridesParser.create(), _field_types()
    declared = _engine_settings(conf)
    types.update({f"engine.{k}": Any for keys in declared.values() for k in keys})
    chosen = [a.split("=", 1)[1] for a in argv if a.split("=", 1)[0].lstrip("+") == "engine" and "=" in a]
    chosen = chosen[-1] if chosen else "native"
    groups = {p.name for p in conf.iterdir() if p.is_dir()}   # config groups: the folders of conf/
    base = OmegaConf.structured(Config)
    for arg in argv:
        if arg.startswith("-") or "=" not in arg or arg.lstrip("+~").startswith("hydra"):
            continue
        try:
            o = parser.parse_overrides([arg])[0]
        except Exception as e:  # noqa: BLE001 - Hydra's grammar errors: one line
            first = " ".join(str(e).split("\n")[0].split())
            raise ConfigError(f"cannot read the override {arg!r} ({first}); allowed: key=value, with "
                              "non-ASCII or special characters inside quotes: key='value'") from None
        key = o.key_or_group
        if o.is_delete() or "/" in key:
            continue
        values = list(o.sweep_iterator()) if o.is_sweep_override() else [o.value()]
        if key in groups:
            options = sorted(p.stem for p in (conf / key).glob("*.yaml"))   # a group option 
            for v in values:
                if v not in options:
                    raise ConfigError(f"{key}={v!r}; allowed: {', '.join(options)}")
            continue
        if key.startswith("engine.") and key != "engine.name":   # an engine's own settings: its package checks them
            setting = key.split(".")[1]
            if chosen in declared and setting not in declared[chosen]:
                owners = sorted(n for n, keys in declared.items() if setting in keys)
                if owners:
                    raise ConfigError(f"{key} is a setting of engine={' / '.join(owners)}; allowed with "
                                      f"engine={chosen}: {', '.join(sorted(declared[chosen]))}")
            elif chosen in declared:
                continue
        if key not in types:
            if not o.is_add():
                raise ConfigError(f"unknown setting {key!r} in {arg!r}; allowed: {', '.join(sorted(types))}")
            continue
        for v in values:
            try:
                OmegaConf.update(base, key, v, merge=True)
            except OmegaConfBaseException:
                raise ConfigError(f"{key}={v!r}; allowed: {_type_words(types[key])}") from None
