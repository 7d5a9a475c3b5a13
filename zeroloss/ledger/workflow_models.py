"""A workflow's rows (docs/workflows.md): the workflow, its dependencies, and their fan-in groups.

Its steps are ordinary :class:`~zeroloss.ledger.models.Message` rows (``workflow_id`` set). A
dependency is an edge from an upstream step to a downstream one, settled once when the upstream's
outcome counts for the downstream. A downstream's dependencies are counted in groups of at most
:data:`FANIN_GROUP`, striped (``FanIn``, :func:`fanin_groups`): an outcome decrements its group's
row, and only the outcome that empties a group decrements the step (``Message.waiting_on``) —
concurrent completions of a large group contend on different rows, never all on one.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

#: How many of a step's dependencies share one fan-in row, at most.
FANIN_GROUP = 100
#: Dependencies stored one after another share a row in blocks of this many, and the blocks take
#: the rows in turn: a claim of a few members, or a batch of a hundred, decrements one or a few
#: rows, and the claims several workers make side by side decrement different ones.
FANIN_BLOCK = 8
#: At least this many rows for a large enough step (when it has this many blocks), so that side
#: by side claims find different rows even when the step has fewer than 6,400 dependencies.
FANIN_MIN_GROUPS = 64


def fanin_groups(dependencies: int) -> int:
    """How many fan-in rows a step's ``dependencies`` are counted in (at least one)."""
    blocks = -(-dependencies // FANIN_BLOCK)
    return max(1, -(-dependencies // FANIN_GROUP), min(FANIN_MIN_GROUPS, blocks))


def fanin_group(n: int, groups: int) -> int:
    """The fan-in row of a step's dependency ``n`` (its position among them)."""
    return (n // FANIN_BLOCK) % groups


class Workflow(models.Model):
    """A workflow sent with :class:`zeroloss.Workflow`: its id makes sending it idempotent."""

    workflow_id = models.CharField(_("workflow id"), max_length=255, unique=True)
    #: SHA-256 of its steps as sent (queues, payloads, names, dependencies): a second send of the
    #: same id must carry the same steps.
    fingerprint = models.CharField(_("fingerprint"), max_length=64)
    steps = models.PositiveIntegerField(_("steps"))
    created_at = models.DateTimeField(_("created at"))

    class Meta:
        db_table = "zeroloss_workflow"
        verbose_name = _("workflow")
        verbose_name_plural = _("workflows")
        permissions = [("cancel_workflow", _("Can cancel workflows"))]

    def __str__(self) -> str:
        return self.workflow_id


class Dependency(models.Model):
    """``downstream`` (a message's primary key) waits for ``upstream`` (a message id): two steps of
    one workflow. The upstream by its id: the outcomes that settle it know their messages so."""

    workflow_id = models.CharField(_("workflow id"), max_length=255)
    downstream = models.BigIntegerField(_("downstream step"))
    upstream = models.CharField(_("upstream step"), max_length=255)
    #: Its fan-in group among the downstream's dependencies.
    fanin = models.IntegerField(_("fan-in group"))
    #: NULL until the upstream's outcome was counted for the downstream; then the upstream's
    #: status then (completed, dead or cancelled). Set once: a redriven step does not count twice.
    settled_status = models.CharField(_("settled as"), max_length=16, null=True, blank=True)

    class Meta:
        db_table = "zeroloss_dependency"
        indexes = [
            models.Index(fields=["upstream"], name="zeroloss_dep_upstream_idx"),
            models.Index(fields=["downstream"], name="zeroloss_dep_downstream_idx"),
            models.Index(fields=["workflow_id"], name="zeroloss_dep_workflow_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.downstream} after {self.upstream}"


class FanIn(models.Model):
    """How many dependencies of one group of a step are not yet settled."""

    downstream = models.BigIntegerField(_("downstream step"))
    fanin = models.IntegerField(_("fan-in group"))
    remaining = models.PositiveIntegerField(_("remaining"))

    class Meta:
        db_table = "zeroloss_fanin"
        constraints = [
            models.UniqueConstraint(fields=["downstream", "fanin"], name="zeroloss_fanin_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.downstream} group {self.fanin}: {self.remaining} left"
