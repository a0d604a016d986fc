package claims

import "testing"

// TestWhichClaimsCombine: only a first send of a claim that admits fewer
// than 8 jobs waits to be taken with others; a claim of 8 or more, a
// repeat and a claim that does not admit run alone (docs/api.md, "Claims
// that arrive together").
func TestWhichClaimsCombine(t *testing.T) {
	for _, c := range []struct {
		ask  Ask
		want bool
	}{
		{Ask{Max: 1, Admit: true}, true},
		{Ask{Max: 7, Admit: true, Key: "k"}, true},
		{Ask{Max: 8, Admit: true}, false},
		{Ask{Max: 32, Admit: true}, false},
		{Ask{Max: 1, Admit: true, Key: "k", Repeat: true}, false},
		{Ask{Max: 1}, false},
	} {
		if got := combines(c.ask); got != c.want {
			t.Errorf("%+v combines: %v, want %v", c.ask, got, c.want)
		}
	}
}
