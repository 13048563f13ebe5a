-- Snapshots are ledger rows too: 'sandbox' rows are destroyed through the provider's destroy,
-- 'snapshot' rows (named by their key) through its keyed snapshot deletion.
ALTER TABLE ledger ADD COLUMN kind TEXT NOT NULL DEFAULT 'sandbox' CHECK (kind IN ('sandbox', 'snapshot'));
