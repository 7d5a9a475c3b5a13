from django.db import models


class HandledRecord(models.Model):
    """One row per handler run: the handlers' own record, used to prove 'handled twice: 0'."""

    message_id = models.CharField(max_length=255, db_index=True)
    queue_name = models.CharField(max_length=100)
    worker = models.CharField(max_length=255)
    handled_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.message_id} by {self.worker}"
