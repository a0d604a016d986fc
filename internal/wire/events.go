package wire

import "encoding/json"

// EventKind names an event.
type EventKind string

const (
	EventStarted         EventKind = "fleet.started"
	EventHostStarted     EventKind = "fleet.host_started"
	EventHostStopped     EventKind = "fleet.host_stopped"
	EventHostRestarted   EventKind = "fleet.host_restarted"
	EventWorkerStarted   EventKind = "fleet.worker_started"
	EventEnqueued        EventKind = "fleet.enqueued"
	EventClaimed         EventKind = "fleet.claimed"
	EventAllowed         EventKind = "call.allowed"
	EventDenied          EventKind = "call.denied"
	EventPublished       EventKind = "fleet.published"
	EventSuperseded      EventKind = "fleet.superseded"
	EventVersionConflict EventKind = "fleet.version_conflict"
	EventRejected        EventKind = "fleet.rejected"
	EventCredential      EventKind = "fleet.credential"
	EventRetry           EventKind = "fleet.retry_scheduled"
	EventFailed          EventKind = "fleet.failed"
	EventReplayed        EventKind = "fleet.replayed"
	EventCancelled       EventKind = "fleet.cancelled"
	EventLeaseExpired    EventKind = "fleet.lease_expired"
	EventRequeued        EventKind = "fleet.requeued"
	EventReleased        EventKind = "fleet.released"
	EventUnblocked       EventKind = "fleet.unblocked"
	EventReconciled      EventKind = "fleet.reconciled"
	EventAssigned        EventKind = "fleet.assigned"
	EventAllowanceSet    EventKind = "fleet.allowance_changed"
	EventClaimsPaused    EventKind = "fleet.claims_paused"
	EventClaimsResumed   EventKind = "fleet.claims_resumed"
	EventTenantAdded     EventKind = "tenant.added"
	EventTenantAllowance EventKind = "tenant.allowance_changed"
	EventTenantWeight    EventKind = "tenant.weight_changed"
	EventPeriodStarted   EventKind = "tenant.period_started"
	EventScheduleChanged EventKind = "schedule.changed"
	EventScheduleFired   EventKind = "schedule.fired"
)

// EventKinds is every kind above, the values GET /admin/events?kind= takes.
var EventKinds = []EventKind{EventStarted, EventHostStarted, EventHostStopped, EventHostRestarted,
	EventWorkerStarted, EventEnqueued, EventClaimed, EventAllowed, EventDenied, EventPublished,
	EventSuperseded, EventVersionConflict, EventRejected, EventCredential, EventRetry, EventFailed,
	EventReplayed, EventCancelled, EventLeaseExpired, EventRequeued, EventReleased, EventUnblocked, EventReconciled,
	EventAssigned, EventAllowanceSet, EventClaimsPaused, EventClaimsResumed, EventTenantAdded, EventTenantAllowance,
	EventTenantWeight, EventPeriodStarted, EventScheduleChanged, EventScheduleFired}

// FaultLoseAck marks the publication event whose acknowledgement the
// lose_ack_index fault dropped.
const FaultLoseAck = "lose_ack"

// Event is one entry of the event log, numbered contiguously from 1.
type Event struct {
	Sequence    int64     `json:"sequence"`
	TimestampMS int64     `json:"timestamp_ms"`
	Kind        EventKind `json:"kind"`
	// OperationID is the job the event is about, "" (left out) when it
	// is about none; its data names the job too.
	OperationID string          `json:"operation_id,omitempty"`
	Actor       string          `json:"actor"`
	Title       string          `json:"title"`
	Data        json.RawMessage `json:"data"`
}

// EventPage is GET /admin/events.
type EventPage struct {
	Events []Event `json:"events"`
}

// EventQuery is GET /admin/events with before, kind or job: the newest
// Limit events in (After, Before) of Kind about Job ("" for any).
type EventQuery struct {
	After, Before int64
	Kind          EventKind
	Job           string
	Limit         int
}
