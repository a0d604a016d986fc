-- The PostgreSQL form of sqlite/0008_job_pages.sql.
CREATE INDEX jobs_by_section ON jobs (section, position);
CREATE INDEX documents_by_owner ON documents (owner);
