"""What confines a job in slurmctld's record, as sbatch options for its OOM rerun (pure).

A job's confinement is every part of its request that limits where, under which rules and with what else it
may run: reservation, excluded and required nodes, QOS, account, WCKey, node features (``--constraint``,
``--prefer``, ``--batch``, ``--cluster-constraint``), licenses, GRES other than shards, container, SELinux
context, MCS label, network and ``--contiguous``/``--exclusive``. The OOM rerun (``hooks/rerun.py``) is a new
job root submits, so it carries each of these or is not submitted at all.

Field names are those of ``squeue --json`` in 22.05 (openapi v0.0.38) and 26.05 (data_parser v0.0.45), read
through ``slurm/jsonfields.py``. What cannot be carried faithfully is named in ``uncarried``: GRES per job,
task or socket and CPUs or memory per GRES (the rerun asks a whole GPU per node), a burst buffer, the other
components of a heterogeneous job.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from slurm_coloc.slurm.jsonfields import integer, text

#: (JSON field, sbatch option): text fields carried verbatim as ``<option>=<value>``, one argv word each.
TEXT_OPTIONS: Tuple[Tuple[str, str], ...] = (
    ("resv_name", "--reservation"), ("excluded_nodes", "--exclude"), ("required_nodes", "--nodelist"),
    ("qos", "--qos"), ("features", "--constraint"), ("prefer", "--prefer"), ("batch_features", "--batch"),
    ("cluster_features", "--cluster-constraint"), ("licenses", "--licenses"), ("wckey", "--wckey"),
    ("mcs_label", "--mcs-label"), ("container", "--container"), ("selinux_context", "--context"),
    ("network", "--network"),
)
#: GRES per job/task/socket and CPUs/memory per GRES: the rerun asks for its GPU per node, beside which
#: these cannot be rebuilt faithfully (``cpu:N`` in ``tres_per_task`` is ``--cpus-per-task``, carried).
_TRES_ELSEWHERE = ("tres_per_job", "tres_per_task", "tres_per_socket", "cpus_per_tres", "memory_per_tres")


@dataclass(frozen=True)
class Confinement:
    """A job's confinement as sbatch option words (values verbatim), its non-shard GRES (``("nic:1",)``), and
    one phrase per part the rerun cannot carry.
    """

    options: Tuple[str, ...]
    other_gres: Tuple[str, ...]
    uncarried: Tuple[str, ...]


def _value(j: Mapping[str, Any], key: str) -> str:
    """A text field with Slurm's "not set" spellings (``(null)``, WCKey's ``*`` default marker) removed."""
    v = text(j, key).strip()
    if key == "wckey" and v.startswith("*"):
        return ""  # "*name": the user's default WCKey, applied again by slurmctld
    return "" if v in ("(null)", "None") else v


def _gres_entries(tres: str) -> List[Tuple[str, str]]:
    """``"gres:shard:2,gres/nic:1"`` -> ``[("shard", "shard:2"), ("nic", "nic:1")]`` (name, ``--gres`` word);
    entries other than GRES (``cpu:2``) are skipped."""
    out = []
    for part in tres.split(","):
        part = part.strip().replace("gres/", "gres:", 1)
        if part.startswith("gres:") and len(part) > 5:
            word = part[5:]
            out.append((word.split(":", 1)[0], word))
    return out


def _exclusive(j: Mapping[str, Any]) -> bool:
    """Whether the record says the job asked for its nodes exclusively: 22.05 ``shared: "none"`` (read from a
    real ``--exclusive`` job), a data_parser ``shared``/``exclusive`` list holding ``none``/``true``/``user``/
    ``mcs``. 26.05 prints ``shared: []`` for an ``--exclusive`` job too (scontrol's text says
    ``Exclusive=NODE``): there the record does not tell, and the rerun is not exclusive."""
    shared, excl = j.get("shared"), j.get("exclusive")
    words = [shared] if isinstance(shared, str) else list(shared) if isinstance(shared, list) else []
    words += [excl] if isinstance(excl, str) else list(excl) if isinstance(excl, list) else []
    return any(str(w).lower() in ("none", "exclusive", "true", "user", "mcs") for w in words)


def confinement_of(j: Mapping[str, Any], rerun_gres: Sequence[str] = ("shard",)) -> Confinement:
    """The confinement of one ``squeue --json`` ``jobs[]`` entry (22.05 or 26.05 schema), as the rerun carries
    it.

    ``rerun_gres``: the GRES names the rerun replaces by its own request (the shards of a whole GPU).
    """
    options = [f"{opt}={v}" for key, opt in TEXT_OPTIONS for v in [_value(j, key)] if v]
    if j.get("contiguous") is True:
        options.append("--contiguous")
    if _exclusive(j):
        options.append("--exclusive")
    entries = _gres_entries(text(j, "tres_per_node"))
    other = tuple(word for name, word in entries if name not in rerun_gres)
    uncarried = [f"{key} {word}" for key in _TRES_ELSEWHERE[:3] for _, word in _gres_entries(text(j, key))]
    uncarried += [f"{key} {v}" for key in _TRES_ELSEWHERE[3:] for v in [_value(j, key)] if v]
    if _value(j, "burst_buffer"):
        uncarried.append("a burst buffer")
    if integer(j, "het_job_id"):
        uncarried.append("the other components of a heterogeneous job")
    return Confinement(tuple(options), other, tuple(uncarried))


def refusal(c: Confinement) -> Optional[str]:
    """The reason a rerun is refused for ``c`` (one line), or None when everything can be carried."""
    if not c.uncarried:
        return None
    return "the rerun could not carry what the job asked for (" + "; ".join(c.uncarried) + "): not rerun"
