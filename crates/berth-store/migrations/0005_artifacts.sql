-- Artifact publication: one claim per bundle, recorded (durably) before any object is written,
-- moving pending -> uploaded (every object present and verified) -> indexed (rows below
-- written), or -> expired (given up after its retry window).
CREATE TABLE publications (
    bundle_id      TEXT PRIMARY KEY,
    schema_version INTEGER NOT NULL,
    mission_id     TEXT NOT NULL,
    task_id        TEXT NOT NULL,
    attempt_key    TEXT NOT NULL,
    accepted       INTEGER NOT NULL,
    state          TEXT NOT NULL,
    manifest_json  TEXT NOT NULL,
    last_error     TEXT,
    created_at     TEXT NOT NULL,
    updated_at     TEXT NOT NULL
);
CREATE INDEX publications_attempt ON publications (attempt_key);
CREATE INDEX publications_state ON publications (state);

-- The index: one row per file of an indexed bundle, queryable by any coordinate.
CREATE TABLE artifacts (
    bundle_id   TEXT NOT NULL REFERENCES publications (bundle_id),
    path        TEXT NOT NULL,
    mission_id  TEXT NOT NULL,
    task_id     TEXT NOT NULL,
    attempt_key TEXT NOT NULL,
    accepted    INTEGER NOT NULL,
    mime        TEXT NOT NULL,
    size        INTEGER NOT NULL,
    blake3      TEXT NOT NULL,
    sha256      TEXT NOT NULL,
    object_key  TEXT NOT NULL,
    indexed_at  TEXT NOT NULL,
    PRIMARY KEY (bundle_id, path)
);
CREATE INDEX artifacts_mission ON artifacts (mission_id, task_id, attempt_key);
CREATE INDEX artifacts_mime ON artifacts (mime);
