-- The cleanup ledger: one row per sandbox Berth ever asked a provider to create.
-- The row is written (state 'intent') before the provider is called, so a crash at any point
-- leaves something a sweep can find.
CREATE TABLE ledger (
    berth_id             TEXT PRIMARY KEY,
    provider             TEXT NOT NULL,
    native_id            TEXT,
    owner                TEXT NOT NULL,
    run_id               TEXT NOT NULL,
    ledger_token         TEXT NOT NULL UNIQUE,
    labels_json          TEXT NOT NULL,
    origin               TEXT NOT NULL,
    expires_at           TEXT,
    state                TEXT NOT NULL CHECK (state IN (
                             'intent', 'created', 'create_failed', 'destroy_requested',
                             'destroy_accepted', 'destroy_failed', 'verified_gone')),
    created_at           TEXT NOT NULL,
    create_returned_at   TEXT,
    destroy_requested_at TEXT,
    verified_gone_at     TEXT,
    last_error_kind      TEXT,
    last_error           TEXT,
    updated_at           TEXT NOT NULL
);
CREATE INDEX ledger_owner_state ON ledger (owner, state);
CREATE INDEX ledger_run ON ledger (run_id);
