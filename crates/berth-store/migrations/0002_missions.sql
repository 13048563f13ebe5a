-- Missions: the authority's record of each mission, the ordered events that produced it, and
-- the durable facts of every attempt (agent and validator results, reasons, timings).
CREATE TABLE missions (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    owner       TEXT NOT NULL,
    spec_json   TEXT NOT NULL,
    record_json TEXT NOT NULL,
    state       TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    created_at  TEXT NOT NULL,
    updated_at  TEXT NOT NULL
);
CREATE INDEX missions_owner ON missions (owner, created_at);

CREATE TABLE mission_events (
    mission_id TEXT NOT NULL REFERENCES missions (id),
    seq        INTEGER NOT NULL,
    event_json TEXT NOT NULL,
    at         TEXT NOT NULL,
    PRIMARY KEY (mission_id, seq)
);

CREATE TABLE attempt_facts (
    mission_id  TEXT NOT NULL REFERENCES missions (id),
    attempt_key TEXT NOT NULL,
    kind        TEXT NOT NULL,
    detail_json TEXT NOT NULL,
    at          TEXT NOT NULL
);
CREATE INDEX attempt_facts_mission ON attempt_facts (mission_id, attempt_key);
