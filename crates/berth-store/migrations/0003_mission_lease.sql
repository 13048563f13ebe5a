-- One runner per mission: a lease with an expiry and a fencing token. Every event append names
-- the fence it holds, so a runner whose lease was taken over can no longer write.
ALTER TABLE missions ADD COLUMN lease_holder TEXT;
ALTER TABLE missions ADD COLUMN lease_fence INTEGER NOT NULL DEFAULT 0;
ALTER TABLE missions ADD COLUMN lease_expires_at TEXT;
