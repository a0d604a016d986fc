package main

import (
	"testing"
	"time"
)

// 128 workers finish jobs in bursts larger than River's default
// subscription buffer, which drops what it cannot take; every completion
// must still be counted, or the run never ends.
func TestBurnCountsEveryCompletion(t *testing.T) {
	quiet = 15 * time.Second
	if err := run(3000, 128, "NORMAL"); err != nil {
		t.Fatal(err)
	}
}
