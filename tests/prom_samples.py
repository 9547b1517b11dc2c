"""Prometheus text read with ``prometheus_client``'s own parser, for the tests of both services'
``/metrics``: a scrape becomes ``{(sample name, frozenset of label pairs): value}``."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

Key = tuple[str, frozenset]


def samples(text: str) -> dict[Key, float]:
    """Every sample of the exposition; the parser raises on text Prometheus would refuse."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(text: str, name: str, **labels: str) -> float | None:
    """The sample ``name{labels}`` (None when absent)."""
    return samples(text).get((name, frozenset(labels.items())))


def families(text: str) -> dict[str, str]:
    """Metric family name → its type (counter, gauge, histogram)."""
    return {f.name: f.type for f in text_string_to_metric_families(text)}
