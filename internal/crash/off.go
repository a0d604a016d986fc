//go:build !crashpoints

package crash

import "time"

// Enabled reports whether this binary has crash points.
const Enabled = false

// At does nothing outside crash-point builds.
func At(string) {}

// Lost is nil outside crash-point builds.
func Lost(string) error { return nil }

// Clock is nil outside crash-point builds: the host keeps its clock.
func Clock() func() time.Time { return nil }
