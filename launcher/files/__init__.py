"""What the launcher writes, and how: ``rundir`` (the run dir: its layout, lock, marker, state and what --overwrite
may delete), ``fsutil`` (atomic writes; 0700 dirs and 0600 files from creation), ``redact`` (secret values out of
every file written; a path is never rewritten) and ``ranklog`` (a rank's log: private, redacted as written)."""
