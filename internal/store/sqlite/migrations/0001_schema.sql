-- Fleet's whole authority lives in one database so that one transaction can
-- commit everything a step changes: assignment, document, operation record,
-- job state, reservation, receipt and event.

-- The report resource (SPEC section 6). Every table is keyed by document so
-- several reports and several runs share one database.
CREATE TABLE documents (
    id            TEXT PRIMARY KEY,
    version       INTEGER NOT NULL CHECK (version >= 0),
    body          TEXT NOT NULL,                 -- canonical JSON
    owner         TEXT NOT NULL DEFAULT '',      -- '' = unassigned or revoked
    generation    INTEGER NOT NULL CHECK (generation >= 0),
    updated_at_ms INTEGER NOT NULL
);

-- Every assignment ever made, so an operator can see who held a document at
-- which generation. documents.owner/generation mirror the newest row.
CREATE TABLE assignments (
    document_id TEXT NOT NULL REFERENCES documents (id),
    generation  INTEGER NOT NULL,
    owner       TEXT NOT NULL,
    reason      TEXT NOT NULL,
    at_ms       INTEGER NOT NULL,
    PRIMARY KEY (document_id, generation)
);

-- Retained outcomes, refusals included: an identical request replays the
-- stored bytes; any difference under the same key is a conflict.
CREATE TABLE operations (
    document_id   TEXT NOT NULL REFERENCES documents (id),
    operation_key TEXT NOT NULL,
    binding       TEXT NOT NULL,                 -- canonical JSON: tool, arguments, caller digest
    caller        TEXT NOT NULL,
    status        TEXT NOT NULL,
    outcome       TEXT NOT NULL,                 -- exact response bytes
    deliveries    INTEGER NOT NULL CHECK (deliveries >= 1),
    created_at_ms INTEGER NOT NULL,
    PRIMARY KEY (document_id, operation_key)
);

CREATE TABLE mutations (
    document_id   TEXT NOT NULL REFERENCES documents (id),
    version       INTEGER NOT NULL,
    operation_key TEXT NOT NULL,
    caller        TEXT NOT NULL,
    at_ms         INTEGER NOT NULL,
    PRIMARY KEY (document_id, version)
);
-- An operation mutates its document at most once, whatever the code above does.
CREATE UNIQUE INDEX mutations_by_operation ON mutations (document_id, operation_key);

-- The host's identity and configuration.
CREATE TABLE kernel (
    id            INTEGER PRIMARY KEY CHECK (id = 1),
    public_key    TEXT NOT NULL,                 -- hex Ed25519 public key
    seed          BLOB NOT NULL,                 -- Ed25519 private seed
    created_at_ms INTEGER NOT NULL
);

CREATE TABLE settings (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- Only digests are kept; the tokens live in files under credentials/.
CREATE TABLE credentials (
    name          TEXT PRIMARY KEY,
    role          TEXT NOT NULL CHECK (role IN ('worker', 'operator')),
    sha256        TEXT NOT NULL UNIQUE,
    created_at_ms INTEGER NOT NULL
);

-- The shared allowance (SPEC section 5). The CHECKs are the last line of
-- defence: a bug that would overspend aborts its transaction instead.
CREATE TABLE accounting (
    id              INTEGER PRIMARY KEY CHECK (id = 1),
    allowance       INTEGER NOT NULL CHECK (allowance >= 0),
    spent           INTEGER NOT NULL CHECK (spent >= 0),
    reserved        INTEGER NOT NULL CHECK (reserved >= 0),
    calls           INTEGER NOT NULL CHECK (calls >= 0),
    cost_per_report INTEGER NOT NULL CHECK (cost_per_report >= 1),
    CHECK (spent + reserved <= allowance)
);

-- One batch per POST /admin/reports (or per init); its document text is
-- stored once and shared by the batch's jobs.
CREATE TABLE batches (
    idempotency_key TEXT PRIMARY KEY,
    request_sha256  TEXT NOT NULL,
    document        TEXT NOT NULL,
    created_at_ms   INTEGER NOT NULL
);

CREATE TABLE jobs (
    operation_id        TEXT PRIMARY KEY,
    position            INTEGER NOT NULL UNIQUE,     -- enqueue order
    batch_key           TEXT NOT NULL REFERENCES batches (idempotency_key),
    section             TEXT NOT NULL,
    document_id         TEXT NOT NULL UNIQUE REFERENCES documents (id),
    input_sha256        TEXT NOT NULL,
    state               TEXT NOT NULL CHECK (state IN ('queued', 'claimed', 'running', 'completed',
                            'refused', 'cancelled_before_dispatch', 'cancelled', 'unresolved')),
    -- The current claim is (claim_id, documents.generation): the document's
    -- assignment generation is the fence, kept in one place.
    claim_id            TEXT NOT NULL DEFAULT '',
    worker              TEXT NOT NULL DEFAULT '',
    lease_expires_at_ms INTEGER NOT NULL DEFAULT 0,
    reserved            INTEGER NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    admission_claim_id  TEXT NOT NULL DEFAULT '',    -- the claim whose dispatch was decided
    admission           TEXT NOT NULL DEFAULT '',    -- that decision's response, for repeats
    reason              TEXT NOT NULL DEFAULT '',
    created_at_ms       INTEGER NOT NULL,
    updated_at_ms       INTEGER NOT NULL
);
CREATE INDEX jobs_by_state ON jobs (state, position);
CREATE INDEX jobs_by_lease ON jobs (lease_expires_at_ms) WHERE state IN ('claimed', 'running');

-- Signed receipts (SPEC section 7): body is the full receipt JSON.
CREATE TABLE receipts (
    sequence     INTEGER PRIMARY KEY,
    id           TEXT NOT NULL UNIQUE,
    kind         TEXT NOT NULL,
    operation_id TEXT NOT NULL,
    body         TEXT NOT NULL
);
CREATE INDEX receipts_by_operation ON receipts (operation_id, sequence);

-- The event log (SPEC section 8), contiguous from 1.
CREATE TABLE events (
    sequence     INTEGER PRIMARY KEY,
    timestamp_ms INTEGER NOT NULL,
    kind         TEXT NOT NULL,
    actor        TEXT NOT NULL,
    title        TEXT NOT NULL,
    data         TEXT NOT NULL
);
