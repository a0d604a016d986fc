package postgres

import "github.com/fleet/fleet/internal/store/sqlexec"

// jobFields is a job joined with its document's assignment and version
// and its retained publication outcome, in the order sqlexec scans them.
const jobFields = `j.operation_id, j.position, j.batch_key, j.section, j.document_id, j.input_sha256, j.state,
	d.generation, d.owner, j.worker, j.claim_id, j.lease_expires_at_ms, j.reserved, j.admission_claim_id,
	j.admission, COALESCE((SELECT o.outcome FROM operations o WHERE o.document_id = j.document_id AND o.status = 'published' LIMIT 1), ''),
	j.reason, j.created_at_ms, j.updated_at_ms, d.version, j.claim_host, j.reserve_shard,
	j.attempts, j.max_attempts, j.backoff_base_ms, j.backoff_cap_ms, j.claimable_at_ms, j.last_error`

const jobColumns = `SELECT ` + jobFields + ` FROM jobs j JOIN documents d ON d.id = j.document_id`

// nextQueued is the oldest queued job with the document its batch computes from.
const nextQueued = `SELECT ` + jobFields + `, b.document
	FROM jobs j JOIN documents d ON d.id = j.document_id JOIN batches b ON b.idempotency_key = j.batch_key
	WHERE j.state = 'queued' AND j.claimable_at_ms <= $1 ORDER BY j.claimable_at_ms, j.position LIMIT 1`

const accounting = `SELECT allowance, spent, reserved, calls, cost_per_report FROM accounting WHERE id = 1`

const document = `SELECT id, version, generation, owner, body FROM documents WHERE id = $1`

// Several hosts write at once, so every read of rows a write will change
// locks them (FOR UPDATE; the job and its document together), claims pass
// over rows another host holds (SKIP LOCKED), and appends to the contiguous
// event log, receipt chain and queue positions hold an advisory lock named
// for the schema.
const forUpdate = ` FOR UPDATE OF j, d`

// queries is PostgreSQL's SQL; what it shares with SQLite's is portable.
var queries = sqlexec.Queries{
	LockLog:    `SELECT pg_advisory_xact_lock(hashtext(current_schema() || '/log'))`,
	TryLockLog: `SELECT pg_try_advisory_xact_lock(hashtext(current_schema() || '/log'))`,
	Savepoint:  "SAVEPOINT ",
	RollbackTo: "ROLLBACK TO SAVEPOINT ",

	SettingList: `SELECT name, value FROM settings`,
	SettingPut:  `INSERT INTO settings (name, value) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET value = excluded.value`,

	HostGet:  `SELECT id, instance, url, started_at_ms, seen_at_ms, serving FROM hosts WHERE id = $1`,
	HostList: `SELECT id, instance, url, started_at_ms, seen_at_ms, serving FROM hosts ORDER BY id`,
	HostPut: `INSERT INTO hosts (id, instance, url, started_at_ms, seen_at_ms, serving) VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (id) DO UPDATE SET instance = excluded.instance, url = excluded.url,
		started_at_ms = excluded.started_at_ms, seen_at_ms = excluded.seen_at_ms, serving = excluded.serving`,
	HostSeen: `UPDATE hosts SET seen_at_ms = $1 WHERE id = $2 AND instance = $3 RETURNING serving`,
	// A record another transaction holds (its host renewing, or a peer
	// retiring it) is passed over rather than waited for.
	HostRetire: `UPDATE hosts SET serving = 0 WHERE id = (SELECT id FROM hosts
		WHERE id = $1 AND instance = $2 AND seen_at_ms = $3 AND serving = 1 FOR UPDATE SKIP LOCKED)`,

	KernelInsert: `INSERT INTO kernel (id, public_key, seed, created_at_ms) VALUES (1, $1, $2, $3)`,
	KernelGet:    `SELECT public_key, seed FROM kernel WHERE id = 1`,

	CredentialInsert: `INSERT INTO credentials (name, role, sha256, created_at_ms) VALUES ($1, $2, $3, $4)`,
	CredentialGet:    `SELECT role, sha256, created_at_ms, revoked_at_ms FROM credentials WHERE name = $1`,
	CredentialList:   `SELECT name, role, sha256, created_at_ms, revoked_at_ms FROM credentials ORDER BY name`,
	CredentialUpdate: `UPDATE credentials SET sha256 = $1, revoked_at_ms = $2 WHERE name = $3`,

	// The allowance's writes are accounting.go's, over its shards; reads
	// sum them through the accounting view.
	AccountingGet: accounting,

	BatchInsert: `INSERT INTO batches (idempotency_key, request_sha256, document, created_at_ms) VALUES ($1, $2, $3, $4)`,
	BatchGet:    `SELECT request_sha256, document, created_at_ms FROM batches WHERE idempotency_key = $1`,

	JobMaxPosition: `SELECT COALESCE(MAX(position), 0) FROM jobs`,
	JobInsert: `INSERT INTO jobs (operation_id, position, batch_key, section, document_id, input_sha256, state, created_at_ms, updated_at_ms,
		claimable_at_ms, max_attempts, backoff_base_ms, backoff_cap_ms)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8, $8, $9, $10, $11)`,
	JobGet:          jobColumns + ` WHERE j.operation_id = $1`,
	JobGetForUpdate: jobColumns + ` WHERE j.operation_id = $1` + forUpdate,
	JobNextQueued:   nextQueued + forUpdate + ` SKIP LOCKED`,
	JobUpdate: `UPDATE jobs SET state = $1, claim_id = $2, worker = $3, lease_expires_at_ms = $4, reserved = $5,
		admission_claim_id = $6, admission = $7, reason = $8, updated_at_ms = $9, claim_host = $10, reserve_shard = $11,
		attempts = $12, claimable_at_ms = $13, last_error = $14 WHERE operation_id = $15`,
	JobList:                 jobColumns + ` ORDER BY j.position`,
	JobPage:                 jobColumns,
	JobListByBatch:          `SELECT operation_id FROM jobs WHERE batch_key = $1 ORDER BY position`,
	JobListExpired:          jobColumns + ` WHERE j.state IN ('claimed', 'running') AND j.lease_expires_at_ms < $1 ORDER BY j.position`,
	JobListExpiredForUpdate: jobColumns + ` WHERE j.state IN ('claimed', 'running') AND j.lease_expires_at_ms < $1 ORDER BY j.position` + forUpdate + ` SKIP LOCKED`,
	JobListClaimedUnder: jobColumns + ` WHERE d.owner = $1 AND j.worker = $1 AND j.state = 'claimed'
		AND substr(j.claim_id, 1, length($2::text)) = $2::text ORDER BY j.position` + forUpdate,
	JobListClaimedBy: jobColumns + ` WHERE j.state = 'claimed' AND j.claim_host IN (SELECT jsonb_array_elements_text($1::jsonb))
		ORDER BY j.position` + forUpdate + ` SKIP LOCKED`,
	JobPending:      `SELECT COUNT(*) FROM (SELECT 1 FROM jobs WHERE state IN ('queued', 'claimed', 'running') LIMIT 1) AS p`,
	JobCountByState: `SELECT state, COUNT(*) FROM jobs GROUP BY state`,

	DocumentInsert:       `INSERT INTO documents (id, version, body, owner, generation, updated_at_ms) VALUES ($1, 0, 'null', '', 0, $2)`,
	DocumentGet:          document,
	DocumentGetForUpdate: document + ` FOR UPDATE`,
	DocumentSetOwner: `UPDATE documents SET owner = $1, generation = generation + 1, updated_at_ms = $2
		WHERE id = $3 RETURNING generation`,
	DocumentSetOwnerIfGeneration: `UPDATE documents SET owner = $1, generation = generation + 1, updated_at_ms = $2
		WHERE id = $3 AND generation = $4 RETURNING generation`,
	DocumentWrite: `UPDATE documents SET body = $1, version = $2, updated_at_ms = $3 WHERE id = $4`,
	AttemptInsert: `INSERT INTO job_attempts (operation_id, attempt, claim_id, worker, generation, reason, retryable, outcome, cost, answer, at_ms)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`,
	AttemptList: `SELECT attempt, claim_id, worker, generation, reason, retryable, outcome, cost, answer, at_ms
		FROM job_attempts WHERE operation_id = $1 ORDER BY attempt`,
	AssignmentInsert: `INSERT INTO assignments (document_id, generation, owner, reason, at_ms) VALUES ($1, $2, $3, $4, $5)`,

	AssignmentList:             `SELECT generation, owner, reason, at_ms FROM assignments WHERE document_id = $1 ORDER BY generation`,
	MutationInsert:             `INSERT INTO mutations (document_id, version, operation_key, caller, at_ms) VALUES ($1, $2, $3, $4, $5)`,
	MutationList:               `SELECT version, operation_key, caller, at_ms FROM mutations WHERE document_id = $1 ORDER BY version`,
	MutationCount:              `SELECT COUNT(*) FROM mutations WHERE document_id = $1`,
	MutationTotal:              `SELECT COUNT(*) FROM mutations`,
	MutationCountByDocument:    `SELECT document_id, COUNT(*) FROM mutations GROUP BY document_id`,
	MutationRepeatedOperations: `SELECT COUNT(*) FROM (SELECT 1 FROM mutations GROUP BY document_id, operation_key HAVING COUNT(*) > 1) AS dup`,

	OperationGet: `SELECT binding, caller, status, outcome, deliveries, created_at_ms FROM operations
		WHERE document_id = $1 AND operation_key = $2`,
	OperationCountDelivery: `UPDATE operations SET deliveries = deliveries + 1 WHERE document_id = $1 AND operation_key = $2`,
	OperationInsert: `INSERT INTO operations (document_id, operation_key, binding, caller, status, outcome, deliveries, created_at_ms)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
	OperationList: `SELECT document_id, operation_key, caller, status, outcome, deliveries FROM operations
		WHERE document_id = $1 ORDER BY created_at_ms, operation_key`,

	ReceiptHead:            `SELECT sequence, id FROM receipts ORDER BY sequence DESC LIMIT 1`,
	ReceiptInsert:          `INSERT INTO receipts (sequence, id, kind, operation_id, body) VALUES `, // rows follow
	ReceiptGet:             `SELECT body FROM receipts WHERE id = $1`,
	ReceiptList:            `SELECT body FROM receipts ORDER BY sequence`,
	ReceiptListByOperation: `SELECT body FROM receipts WHERE operation_id = $1 ORDER BY sequence`,
	ReceiptNewestByOperation: `SELECT DISTINCT ON (operation_id) operation_id, id FROM receipts
		ORDER BY operation_id, sequence DESC`,

	EventInsert: `INSERT INTO events (sequence, timestamp_ms, kind, actor, title, data) VALUES `, // rows follow
	EventLast:   `SELECT COALESCE(MAX(sequence), 0) FROM events`,
	EventList: `SELECT sequence, timestamp_ms, kind, actor, title, data FROM events
		WHERE sequence > $1 ORDER BY sequence LIMIT $2`,
	EventHead: `SELECT COUNT(*), COALESCE(MAX(sequence), 0) FROM events`,

	PendingEventInsert:   `INSERT INTO pending_events (timestamp_ms, kind, actor, title, data) VALUES `, // rows follow
	PendingReceiptInsert: `INSERT INTO pending_receipts (receipt_id, body) VALUES `,                     // rows follow
	PendingEventList:     `SELECT id, timestamp_ms, kind, actor, title, data FROM pending_events ORDER BY id LIMIT $1`,
	PendingReceiptList:   `SELECT id, body FROM pending_receipts ORDER BY id LIMIT $1`,
	PendingEventDelete:   `DELETE FROM pending_events WHERE id IN `,                      // ids follow
	PendingEventLeft:     `SELECT id FROM pending_events WHERE id IN `,                   // ids follow
	PendingReceiptLeft:   `SELECT id FROM pending_receipts WHERE id IN `,                 // ids follow
	ReceiptGetMany:       `SELECT body FROM receipts WHERE id IN `,                       // ids follow
	ReceiptIDsOf:         `SELECT operation_id, id FROM receipts WHERE operation_id IN `, // operation ids follow
	PendingReceiptDelete: `DELETE FROM pending_receipts WHERE id IN `,                    // ids follow
}
