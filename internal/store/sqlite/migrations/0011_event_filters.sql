-- Each event names the job it is about ('' for events about none), so a
-- job's events and the events of one kind are read through an index, not
-- by reading the whole log (GET /admin/events?job=…&kind=…). Events
-- written before this name their job in their data; they are filled in.
ALTER TABLE events ADD COLUMN operation_id TEXT NOT NULL DEFAULT '';
ALTER TABLE pending_events ADD COLUMN operation_id TEXT NOT NULL DEFAULT '';
UPDATE events SET operation_id = json_extract(data, '$.operation_id')
WHERE json_valid(data) AND json_type(data, '$.operation_id') = 'text';
CREATE INDEX events_by_operation ON events (operation_id, sequence) WHERE operation_id <> '';
CREATE INDEX events_by_kind ON events (kind, sequence);
