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
