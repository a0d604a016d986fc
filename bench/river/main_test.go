package main

import (
	"testing"
	"time"
)

// Many workers finish jobs faster than one subscriber reads their events
// in bursts; every completion must still be counted, or the run never
// ends (River drops events past its subscription's buffer).
func TestBurnCountsEveryCompletion(t *testing.T) {
	quiet = 15 * time.Second
	if err := run(3000, 128, "NORMAL"); err != nil {
		t.Fatal(err)
	}
}
