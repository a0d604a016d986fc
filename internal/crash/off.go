//go:build !crashpoints

package crash

// Enabled reports whether this binary has crash points.
const Enabled = false

// At does nothing outside crash-point builds.
func At(string) {}

// Lost is nil outside crash-point builds.
func Lost(string) error { return nil }
