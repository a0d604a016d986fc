-- The jobs by state as one host last counted them for every host serving
-- the database (internal/host/views): a host that finds the count fresh
-- reads it instead of counting, so N hosts count once a second between
-- them, not N times. One row; counts is a JSON object, state to jobs.
CREATE TABLE job_counts (
    id       INT PRIMARY KEY CHECK (id = 1),
    taken_ms BIGINT NOT NULL,
    counts   TEXT NOT NULL
);
