"""The transactional batch's guard (PostgreSQL): a handler's raw COMMIT cannot commit its batch.

A batch's transaction inserts one row here; a deferred constraint trigger checks at commit
that zeroloss itself authorised it (``zeroloss.batch_commit``, set by the batch's last
statement). A handler that runs ``COMMIT`` on the batch's connection gets an error instead,
and the whole batch rolls back: no effect lands without its acknowledgement. Unlogged: a row
lives only inside one transaction, so it never needs to survive a crash.
"""

from django.db import migrations

CREATE = [
    "CREATE UNLOGGED TABLE IF NOT EXISTS zeroloss_batch_guard (txid bigint PRIMARY KEY)",
    """CREATE OR REPLACE FUNCTION zeroloss_batch_guard_check() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('zeroloss.batch_commit', true) IS DISTINCT FROM NEW.txid::text THEN
        RAISE EXCEPTION 'a transactional handler committed its batch''s transaction'
            USING ERRCODE = '25000',
                  HINT = 'zeroloss commits a transactional batch itself, with its acknowledgements; '
                         'a handler must not run COMMIT or ROLLBACK (use transaction.atomic() for a savepoint).';
    END IF;
    RETURN NULL;
END $$""",
    "DROP TRIGGER IF EXISTS zeroloss_batch_guard_commit ON zeroloss_batch_guard",
    "CREATE CONSTRAINT TRIGGER zeroloss_batch_guard_commit AFTER INSERT ON zeroloss_batch_guard "
    "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION zeroloss_batch_guard_check()",
]
DROP = [
    "DROP TABLE IF EXISTS zeroloss_batch_guard",
    "DROP FUNCTION IF EXISTS zeroloss_batch_guard_check()",
]


def _run(statements: list[str]):  # type: ignore[no-untyped-def]
    def run(apps, schema_editor):  # type: ignore[no-untyped-def]
        if schema_editor.connection.vendor != "postgresql":
            return
        with schema_editor.connection.cursor() as cursor:
            for sql in statements:
                cursor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("zeroloss", "0002_ordering_priority_results_dedup")]

    operations = [migrations.RunPython(_run(CREATE), _run(DROP), elidable=False)]
