-- Each event names the job it is about ('' for events about none), so a
-- job's events and the events of one kind are read through an index, not
-- by reading the whole log (GET /admin/events?job=…&kind=…). Events
-- written before this name their job in their data (always JSON a host
-- wrote); they are filled in.
ALTER TABLE events ADD COLUMN operation_id TEXT NOT NULL DEFAULT '';
ALTER TABLE pending_events ADD COLUMN operation_id TEXT NOT NULL DEFAULT '';
UPDATE events SET operation_id = data::jsonb ->> 'operation_id'
WHERE data LIKE '%"operation_id":"%' AND jsonb_typeof(data::jsonb -> 'operation_id') = 'string';
CREATE INDEX events_by_operation ON events (operation_id, sequence) WHERE operation_id <> '';
CREATE INDEX events_by_kind ON events (kind, sequence);
