-- Schema 7: the store's own identity, random and fixed at creation. The ledger puts it at the
-- head of every ledger token it issues, so a sandbox found by listing without a row can be
-- told apart as this store's (adoptable where only this Berth home makes sandboxes) or
-- another's.
CREATE TABLE store_identity (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    id TEXT NOT NULL
);
INSERT INTO store_identity (singleton, id) VALUES (1, lower(hex(randomblob(8))));
