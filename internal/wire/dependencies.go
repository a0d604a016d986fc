package wire

// DependencyOutput is one dependency's published output as a dependent
// job's input names it: its section, job and document, the version it
// published and the SHA-256 of that version's body (canonical JSON), which
// the dependent's input_sha256 covers.
type DependencyOutput struct {
	Section      string `json:"section"`
	OperationID  string `json:"operation_id"`
	DocumentID   string `json:"document_id"`
	Version      int64  `json:"version"`
	OutputSHA256 string `json:"output_sha256"`
}

// Dependency is a job another waits for, as it stands: a blocked job is
// held by those not completed, and says why.
type Dependency struct {
	OperationID string   `json:"operation_id"`
	Section     string   `json:"section"`
	State       JobState `json:"state"`
	// Reason is why it stands where it does (its last reason), for one
	// that did not complete.
	Reason string `json:"reason,omitempty"`
}

// Report is GET /admin/reports/{key}: one submitted report's sections, in
// submission order, with what each waits for.
type Report struct {
	Key         string          `json:"key"`
	CreatedAtMS int64           `json:"created_at_ms"`
	Sections    []ReportSection `json:"sections"`
}

// ReportSection is one job of a report as it stands.
type ReportSection struct {
	OperationID string   `json:"operation_id"`
	Section     string   `json:"section"`
	State       JobState `json:"state"`
	Reason      string   `json:"reason"`
	Tenant      string   `json:"tenant"`
	// After is the sections of the report it waits for; WaitingOn how
	// many of them have not completed.
	After     []string `json:"after"`
	WaitingOn int64    `json:"waiting_on"`
}

// ReportCancellation is POST /admin/reports/{key}/cancel: the report's
// jobs cancelled (blocked, queued, claimed or running ones) and those
// left as they were (finished already), by operation id.
type ReportCancellation struct {
	Cancelled []string `json:"cancelled"`
	Unchanged []string `json:"unchanged"`
}
