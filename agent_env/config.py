"""Agent configuration: YAML, by content in $SGRPO_AGENT_CONFIG_YAML or in the file named by
$SGRPO_AGENT_CONFIG (OpenRLHF builds the agent with no arguments, so the environment is the only
channel).

Why two variables: a user names a file ($SGRPO_AGENT_CONFIG), but the agent runs in the vLLM
engine actors, which on a cluster sit on nodes that do not have the driver's files. The CLI
reads and validates the file at launch and forwards its *text* to every Ray worker as
$SGRPO_AGENT_CONFIG_YAML; the content wins wherever it is set, and the path stays the fallback
(a single machine, or a file that exists on every node).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

CONFIG_ENV = "SGRPO_AGENT_CONFIG"
# The YAML text itself; set by the CLI for the Ray workers (and by `ray job submit` in
# examples/lib/launch.sh for the driver), preferred over the path.
CONFIG_YAML_ENV = "SGRPO_AGENT_CONFIG_YAML"

SEARCH_BACKENDS = ("local", "web")
SERPER_HOSTS = ("google.serper.dev",)
# Keys that existed once: a config that still sets one gets told what replaced it.
REMOVED_KEYS = {
    "web_cache_path": "the /search proxy caches Serper answers (retriever_server.serve --web-cache)",
}
TEMPLATES = ("search_r1_base", "search_r1_chat", "deep_research", "none")
REWARDS = ("em", "f1", "sub_em", "gaia")


class ConfigError(ValueError):
    """A bad agent configuration; the message names the offending key or value."""


@dataclass(frozen=True)
class AgentConfig:
    """Tool endpoints, episode limits, prompt template and reward (defaults match Search-R1)."""

    retriever_url: str = "http://127.0.0.1:8000/retrieve"
    search_backend: str = "local"
    # retriever_server's /search proxy (it holds SERPER_API_KEY and the shared answer cache)
    web_search_url: str = "http://127.0.0.1:8000/search"
    # None (YAML null): this run has no code tool; a <code> action gets an error observation and
    # counts in code_errors, and no request is sent anywhere (search-only runs without a sandbox)
    sandbox_url: str | None = "http://127.0.0.1:8080/run_code"
    max_turns: int = 4
    topk: int = 3
    max_obs_tokens: int = 500
    # Search-R1 caps every assistant turn (max_response_length=500); OpenRLHF's executor would
    # otherwise give each turn all of the remaining context. None = no per-turn cap.
    max_tokens_per_turn: int | None = None
    template: str = "search_r1_base"
    reward: str = "em"
    format_reward: bool = False
    structure_format_score: float = 0.2
    final_format_score: float = 0.1
    retrieval_score: float = 0.0
    tokenizer: str | None = None
    request_timeout_s: float = 30.0
    code_timeout_s: float = 10.0
    retries: int = 3
    backoff_s: float = 0.5
    batch_window_ms: float = 5.0
    max_batch: int = 64
    max_connections: int = 64
    # Wall-clock cap on one trajectory, in seconds (None: none, as in Search-R1 and OpenRLHF).
    # Past it no tool call starts and one in flight is cut; the episode ends with what it has.
    episode_timeout_s: float | None = None

    def __post_init__(self) -> None:
        choices = {"search_backend": SEARCH_BACKENDS, "template": TEMPLATES, "reward": REWARDS}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name}={getattr(self, name)!r} is not one of {allowed}")
        for name in ("max_turns", "topk", "max_obs_tokens", "max_batch", "max_connections"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.max_tokens_per_turn is not None and int(self.max_tokens_per_turn) < 1:
            raise ConfigError(f"max_tokens_per_turn must be >= 1 or null, got {self.max_tokens_per_turn!r}")
        if self.episode_timeout_s is not None and not float(self.episode_timeout_s) > 0:
            raise ConfigError(f"episode_timeout_s must be > 0 or null, got {self.episode_timeout_s!r}")
        for name in ("request_timeout_s", "code_timeout_s"):
            if not float(getattr(self, name)) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.retries < 0:
            raise ConfigError(f"retries must be >= 0, got {self.retries!r}")
        if urlsplit(self.web_search_url).hostname in SERPER_HOSTS:
            raise ConfigError(f"web_search_url={self.web_search_url!r} is Serper itself; point it at "
                              "retriever_server's /search proxy (python -m retriever_server.serve with "
                              "SERPER_API_KEY in its environment), e.g. http://HOST:8000/search")

    @property
    def allowed_actions(self) -> tuple[str, ...]:
        """Action tags this template offers (code only in the deep-research template)."""
        return ("search", "code", "answer") if self.template == "deep_research" else ("search", "answer")


def config_from_dict(data: dict | None) -> AgentConfig:
    """Build a config, rejecting unknown keys by name (a typo must not silently use a default)."""
    data = dict(data or {})
    removed = sorted(set(data) & set(REMOVED_KEYS))
    if removed:
        raise ConfigError("; ".join(f"agent config key {k!r} was removed: {REMOVED_KEYS[k]}"
                                    for k in removed))
    known = {f.name for f in dataclasses.fields(AgentConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"unknown agent config keys {unknown}; known keys: {sorted(known)}")
    return AgentConfig(**data)


def config_from_yaml(text: str, source: str) -> AgentConfig:
    """Parse and validate YAML text; every error names ``source`` (the file or the variable)."""
    import yaml

    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"agent config {source} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"agent config {source} must be a YAML mapping, got {type(data).__name__}")
    try:
        return config_from_dict(data)
    except (ConfigError, TypeError, ValueError) as exc:
        raise ConfigError(f"agent config {source}: {exc}") from exc


def read_config_file(path: str | os.PathLike) -> str:
    """The text of the agent config file at ``path``; ConfigError naming it when it is missing."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"agent config file {str(p)!r} (from ${CONFIG_ENV} or argument) does not exist")
    return p.read_text()


def config_source() -> tuple[str, str] | None:
    """The agent config this process was given: (YAML text, where it came from), or None for the
    defaults. The content in $SGRPO_AGENT_CONFIG_YAML wins over the file in $SGRPO_AGENT_CONFIG:
    on a worker node the content is what the driver read, while the path may name nothing there."""
    text = os.environ.get(CONFIG_YAML_ENV)
    if text:
        origin = os.environ.get(CONFIG_ENV)
        label = f"${CONFIG_YAML_ENV}" + (f" (the content of {origin!r})" if origin else "")
        return text, label
    path = os.environ.get(CONFIG_ENV)
    if not path:
        return None
    return read_config_file(path), repr(str(Path(path).expanduser()))


def load_config(path: str | os.PathLike | None = None) -> AgentConfig:
    """The YAML at `path`, else the content in $SGRPO_AGENT_CONFIG_YAML, else the file named by
    $SGRPO_AGENT_CONFIG, else the defaults."""
    if path:
        return config_from_yaml(read_config_file(path), repr(str(Path(path).expanduser())))
    source = config_source()
    if source is None:
        return AgentConfig()
    return config_from_yaml(*source)
