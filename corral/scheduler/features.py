"""Node features for ``constraint`` (``sbatch --constraint``): a feature ``F`` is a node
label key ``F`` (or a label whose value is ``F``), ``key=value`` a label with that value;
``&`` joins features that must all hold, ``|`` separates alternatives. Pure: no I/O."""

from __future__ import annotations

import re

_FEATURE = re.compile(r"[A-Za-z0-9_.:-]+(=[A-Za-z0-9_.:-]+)?")


def parse_constraint(text: str) -> tuple[tuple[str, ...], ...]:
    """``a100&ib|h100`` → ((a100, ib), (h100,)): any group whose features all hold."""
    groups = []
    for alternative in str(text).split("|"):
        features = tuple(f.strip() for f in alternative.replace(",", "&").split("&"))
        if not features or any(not _FEATURE.fullmatch(f) for f in features):
            raise ValueError(f"{text!r} is not a constraint: node features (label keys or key=value) joined "
                             "by '&' (all) or '|' (any), e.g. a100&ib or switch=leaf0|switch=leaf1")
        groups.append(features)
    return tuple(groups)


def has_features(labels: dict[str, str] | tuple[tuple[str, str], ...], constraint: str | None) -> bool:
    if not constraint:
        return True
    have = dict(labels)
    return any(all(_holds(have, f) for f in group) for group in parse_constraint(constraint))


def _holds(labels: dict[str, str], feature: str) -> bool:
    key, sep, value = feature.partition("=")
    if sep:
        return labels.get(key) == value
    return key in labels or feature in labels.values()


