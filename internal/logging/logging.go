// Package logging makes the processes' loggers: JSON lines when the output
// is a file or a pipe (for machines and run directories), text on a terminal.
package logging

import (
	"log/slog"
	"os"
)

// New returns a logger writing to f.
func New(f *os.File) *slog.Logger {
	if info, err := f.Stat(); err == nil && info.Mode()&os.ModeCharDevice != 0 {
		return slog.New(slog.NewTextHandler(f, nil))
	}
	return slog.New(slog.NewJSONHandler(f, nil))
}

// IsTerminal reports whether f is a terminal.
func IsTerminal(f *os.File) bool {
	info, err := f.Stat()
	return err == nil && info.Mode()&os.ModeCharDevice != 0
}
