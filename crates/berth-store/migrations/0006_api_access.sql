-- `berth serve`: bearer tokens (only their SHA-256 is kept) and the audit log of every
-- mutating request (who, what, when, result; never a request body).
CREATE TABLE api_tokens (
    id          TEXT PRIMARY KEY,
    token_hash  TEXT NOT NULL UNIQUE,
    owner       TEXT NOT NULL,
    scope       TEXT NOT NULL,
    name        TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    revoked_at  TEXT
);

CREATE TABLE audit_log (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    at          TEXT NOT NULL,
    token_id    TEXT NOT NULL,
    owner       TEXT NOT NULL,
    method      TEXT NOT NULL,
    route       TEXT NOT NULL,
    target      TEXT,
    status      INTEGER NOT NULL,
    outcome     TEXT NOT NULL
);
CREATE INDEX audit_log_owner ON audit_log (owner, seq);
