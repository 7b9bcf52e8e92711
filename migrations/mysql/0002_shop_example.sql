-- Version 2 created the example shop's tables. They are the example's own now
-- (migrations/shop/), created by the demo and never by the service; a database that ran this
-- version keeps them (docs/operations.md says how to drop them). The version stays, doing
-- nothing, so that the sequence holds, and records the checksum of its first text (first/), as
-- every database that ran that text did.
SELECT 1;
