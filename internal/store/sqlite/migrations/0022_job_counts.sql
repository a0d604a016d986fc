-- The jobs by state as one host last counted them for every host serving
-- the database (internal/host/views). One host serves a SQLite file and
-- counts for itself, so it never writes here; the table keeps the two
-- backends' schemas in step. One row; counts is a JSON object, state to
-- jobs.
CREATE TABLE job_counts (
    id       INTEGER PRIMARY KEY CHECK (id = 1),
    taken_ms INTEGER NOT NULL,
    counts   TEXT NOT NULL
);
