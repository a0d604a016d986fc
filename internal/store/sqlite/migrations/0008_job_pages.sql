-- Pages of jobs filtered by section or by owner cost the same however long
-- the queue (by state, jobs_by_state serves already).
CREATE INDEX jobs_by_section ON jobs (section, position);
CREATE INDEX documents_by_owner ON documents (owner);
