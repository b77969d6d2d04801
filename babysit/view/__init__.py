"""Runs as a person watches them: the status rows, the status table, `status --watch` and `babysit run`'s foreground."""
