-- The KEYS and properties of a dead-lettered or invalid delivery, as JSON, kept beside its body:
-- replay sends an invalid delivery again with them, so that a route fixed to read its key from a
-- KEY or property the refusing route did not read finds it. NULL for every other row, and for
-- rows logged before this column (replay then rebuilds the message from its logged key).
ALTER TABLE delivery_log ADD COLUMN kept_headers TEXT NULL;
