-- Schema 9: a create, fork or snapshot still under way says so. The call making a row's
-- resource stamps `alive_at` while it runs (about every 30 s), so a sweep tells a slow create
-- (a large fork, a docker commit) from one a crash abandoned: a row at `intent` counts as
-- half-made only once its last sign of life (or its intent, if none) is old.
ALTER TABLE ledger ADD COLUMN alive_at TEXT;
