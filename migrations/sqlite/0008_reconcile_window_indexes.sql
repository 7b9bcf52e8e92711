-- Version 8 indexed the example shop's stock ledger. It is the example's own now
-- (migrations/shop/); the version stays, doing nothing, and records the checksum of its first
-- text (first/), as every database that ran that text did.
SELECT 1;
