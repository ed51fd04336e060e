"""The registry of placement policies: ``placement_policy`` name -> ``evidence.Policy``.

A new policy is one module (a ``Policy`` subclass: ``name`` and a pure ``decide(Evidence) -> Decision``) and
one ``register`` line below (or a site's or a test's own ``register`` call). Everything that lists policies
reads this registry: the config's ``placement_policy`` choices (``config.sections``, kept up to date from
here: the config layer may not import this one), ``rounds.Round.policy``, ``replay.runner.modes`` and the
benchmarks.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

from slurm_coloc.config import sections
from slurm_coloc.errors import ConfigError
from slurm_coloc.placement.evidence import Policy
from slurm_coloc.placement.gate import GATE
from slurm_coloc.placement.throughput import THROUGHPUT

POLICIES: Dict[str, Policy] = {}


def register(policy: Policy) -> Policy:
    """Add ``policy`` under its ``name`` (replacing one of that name) and make the name a valid
    ``placement_policy``; returns it.

    Raises:
        ValueError: the policy has no name.
    """
    if not policy.name:
        raise ValueError(f"placement policy {policy!r} has no name")
    POLICIES[policy.name] = policy
    if policy.name not in sections.PLACEMENT_POLICIES:
        sections.PLACEMENT_POLICIES.append(policy.name)
    return policy


def unregister(name: str) -> None:
    """Remove the policy ``name`` (a test's own); no change when it is not registered."""
    POLICIES.pop(name, None)
    if name in sections.PLACEMENT_POLICIES:
        sections.PLACEMENT_POLICIES.remove(name)


def names() -> Tuple[str, ...]:
    """The registered policies' names, in registration order."""
    return tuple(POLICIES)


def get(name: str) -> Policy:
    """The policy ``name``.

    Raises:
        ConfigError: no such policy (one line listing the registered names).
    """
    try:
        return POLICIES[name]
    except KeyError:
        raise ConfigError(f"config key 'placement_policy': {name!r} is not one of "
                          f"{', '.join(POLICIES)}") from None


def sharing_policies() -> List[str]:
    """The names of the policies that judge by the sharing model (``Policy.sharing_model``)."""
    return [n for n, p in POLICIES.items() if p.sharing_model]


register(GATE)
register(THROUGHPUT)
