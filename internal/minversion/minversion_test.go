package minversion

import "testing"

// TestAtLeast compares the versions Redis and nats-server report with the
// oldest sigwatch works with.
func TestAtLeast(t *testing.T) {
	for _, c := range []struct {
		found, need string
		newer, ok   bool
	}{
		{"6.2.0", "6.2", true, true},
		{"6.2.14", "6.2", true, true},
		{"7.0.15", "6.2", true, true},
		{"6.0.16", "6.2", false, true},
		{"5.0.7", "6.2", false, true},
		{"10.0.0", "6.2", true, true},
		{"2.9.10", "2.10", false, true},
		{"v2.9.10", "2.10", false, true},
		{"2.10.0", "2.10", true, true},
		{"2.10.0-beta.1", "2.10", true, true},
		{"2.15.2", "2.10", true, true},
		{"3.0", "2.10", true, true},
		{"2", "2.10", false, true},
		{"", "2.10", false, false},
		{"unknown", "6.2", false, false},
	} {
		newer, ok := AtLeast(c.found, c.need)
		if newer != c.newer || ok != c.ok {
			t.Errorf("AtLeast(%q, %q) = %v, %v; want %v, %v", c.found, c.need, newer, ok, c.newer, c.ok)
		}
	}
}
