-- Which instance gave a pass its final status: the instance that ran it, or, for a pass left
-- running by a process that died, the instance that next took the lease and marked it failed.
-- Each instance's metrics count the passes it closed (and the rows its own passes moved), so
-- that a sum over the instances counts every pass once. Passes closed before this column
-- have none: no running process closed them.
ALTER TABLE archive_run ADD COLUMN closed_by VARCHAR(128);
