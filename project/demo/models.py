from django.db import models


class HandledRecord(models.Model):
    """One row per handler run: the handlers' own record, used to prove 'handled twice: 0'."""

    message_id = models.CharField(max_length=255, db_index=True)
    queue_name = models.CharField(max_length=100)
    worker = models.CharField(max_length=255)
    handled_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.message_id} by {self.worker}"


class OrderedRun(models.Model):
    """One run of the ``demo.ordered`` handler: when it started and, if it got there, finished.

    Written outside any transaction at both ends, so a run killed half-way is still on record.
    The ordering tests read it to prove no message ran while an earlier one of its key was
    unfinished.
    """

    message_id = models.CharField(max_length=255, db_index=True)
    ordering_key = models.CharField(max_length=255)
    worker = models.CharField(max_length=255)
    started = models.FloatField()
    finished = models.FloatField(null=True)

    def __str__(self) -> str:
        return f"{self.message_id} ({self.ordering_key}) by {self.worker}"
