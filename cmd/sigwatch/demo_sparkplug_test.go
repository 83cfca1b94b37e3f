package main

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
)

// demoEdgeNodeShown checks, in the output of a demo run with --threshold
// 1s --gateway-every 3s, the Sparkplug B edge node's script: born, none of
// its quiet devices lost while it lives; its connection dies, and the node
// and its 10 devices are lost with reason death in one group storm; it
// reconnects with the next bdSeq and all come back. It returns once the
// rebirth is shown.
func demoEdgeNodeShown(t *testing.T, out *output) {
	t.Helper()
	out.match(t, 20*time.Second, regexp.MustCompile(`(edge node plant-1/edge-1 lost its connection, no DISCONNECT sent: the broker publishes its will, an NDEATH \(bdSeq 0\))`))
	for _, id := range append([]string{"plant-1/edge-1"}, devsOf("plant-1/edge-1/d%02d", 10)...) {
		out.match(t, 30*time.Second, regexp.MustCompile(`(lost  `+regexp.QuoteMeta(id)+`  \(death\))\n`))
	}
	out.match(t, 30*time.Second, regexp.MustCompile(`(storm started: group plant-1/edge-1), \d+ of its 11 devices lost so far`))
	out.match(t, 20*time.Second, regexp.MustCompile(`(edge node plant-1/edge-1 reconnected: its NBIRTH \(bdSeq 1\) and 10 DBIRTHs)`))
	out.match(t, 30*time.Second, regexp.MustCompile(`(recovered  plant-1/edge-1 and its 10 devices)`))
	text := out.String()
	born, died := strings.Index(text, "edge node plant-1/edge-1 born: NBIRTH (bdSeq 0) and 10 DBIRTHs"), strings.Index(text, "edge node plant-1/edge-1 lost its connection")
	if born < 0 {
		t.Errorf("the demo did not say the edge node was born")
	}
	if first := strings.Index(text, "lost  plant-1/edge-1"); first < died {
		t.Errorf("a device of the edge node was lost before its connection died")
	}
	if n := strings.Count(text[died:], "(death)"); n < 11 {
		t.Errorf("%d lost lines with reason death after the node's connection died, want 11", n)
	}
}

func devsOf(format string, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf(format, i)
	}
	return ids
}
