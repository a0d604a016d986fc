//go:build race

package e2e

// raceEnabled: under `go test -race` the host and worker binaries are built
// with the race detector too, so fleet scenarios check the real processes.
const raceEnabled = true
