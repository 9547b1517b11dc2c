"""Write a validated agent config: an example YAML plus KEY=VALUE overrides.

Why: launch scripts take tool URLs from environment variables, but OpenRLHF builds the agent
with no arguments, so the agent reads one YAML file ($SGRPO_AGENT_CONFIG). Rendering it here,
through agent_env's own validation, makes a typo fail before a cluster job is submitted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from agent_env.config import ConfigError, config_from_dict


def parse_override(text: str) -> tuple[str, object]:
    """KEY=VALUE with VALUE read as YAML (so 4 is an int, true a bool, a URL a string)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {text!r} is not KEY=VALUE")
    return key.strip(), yaml.safe_load(value) if value else ""


def render(base: Path, overrides: list[str]) -> dict:
    data = yaml.safe_load(base.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{base} must hold a YAML mapping")
    data.update(parse_override(o) for o in overrides)
    config_from_dict(data)  # raises ConfigError naming the bad key or value
    return data


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", type=Path, required=True, help="example YAML under examples/configs/")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    a = p.parse_args(argv)
    try:
        if not a.base.is_file():
            raise ConfigError(f"agent config {str(a.base)!r} does not exist")
        data = render(a.base, a.overrides)
    except (ConfigError, yaml.YAMLError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(yaml.safe_dump(data, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
