package wire

// ScheduleRequest is POST /admin/schedules: a recurring report. Schedule
// is a cron expression in UTC (five fields, or a descriptor such as
// @daily or @every 2h); Report is the report each firing submits, as POST
// /admin/reports takes it but without its idempotency_key (each firing's
// is the schedule's name and the slot).
type ScheduleRequest struct {
	Name     *string         `json:"name"`
	Schedule *string         `json:"schedule"`
	Report   *ReportsRequest `json:"report"`
}

// Schedule is a recurring report as it stands.
type Schedule struct {
	Name        string         `json:"name"`
	Schedule    string         `json:"schedule"`
	Report      ReportsRequest `json:"report"`
	Paused      bool           `json:"paused"`
	NextAtMS    int64          `json:"next_at_ms"`
	Fired       int64          `json:"fired"`
	LastSlotMS  int64          `json:"last_slot_ms"`
	CreatedAtMS int64          `json:"created_at_ms"`
}

// SchedulesList is GET /admin/schedules, by name.
type SchedulesList struct {
	Schedules []Schedule `json:"schedules"`
}
