package sinks

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/testenv"
)

// slackSection is the mrkdwn of a message's one section.
func slackSection(t *testing.T, m testenv.SlackMessage) string {
	t.Helper()
	if len(m.Blocks) != 1 {
		t.Fatalf("got %d blocks, want 1 section", len(m.Blocks))
	}
	var b slackBlock
	if err := json.Unmarshal(m.Blocks[0], &b); err != nil || b.Type != "section" || b.Text.Type != "mrkdwn" {
		t.Fatalf("block %s: want a mrkdwn section (%v)", m.Blocks[0], err)
	}
	return b.Text.Text
}

// TestSlackOneMessagePerChange: raise → repeat → ack → resolve is three
// messages (no repeat), each with a fallback text and a section.
func TestSlackOneMessagePerChange(t *testing.T) {
	sl := testenv.NewSlack(t, testenv.SlackOptions{Rate: 10})
	d := newSlack(sl.WebhookURL("alarms"), testClient(t, 2*time.Second))
	send(t, d, lifecycle()...)

	msgs := sl.Messages()
	if len(msgs) != 3 || len(sl.Calls()) != 3 {
		t.Fatalf("got %d messages in %d calls, want 3", len(msgs), len(sl.Calls()))
	}
	want := []string{"is lost since", "acknowledged", "resolved (recovered)"}
	for i, m := range msgs {
		sec := slackSection(t, m)
		if !strings.Contains(m.Text, "dev-1") || !strings.Contains(m.Text, want[i]) || !strings.Contains(sec, want[i]) {
			t.Errorf("message %d: got text %q, section %q; want %q", i, m.Text, sec, want[i])
		}
	}
}

// TestSlackStormIsOneMessage: a group alarm over 1,000 devices is one
// message listing 50 and "and 950 more"; the storm event is not sent.
func TestSlackStormIsOneMessage(t *testing.T) {
	sl := testenv.NewSlack(t, testenv.SlackOptions{})
	d := newSlack(sl.WebhookURL("alarms"), testClient(t, 2*time.Second))
	send(t, d, stormNote(), groupNote(1000))

	msgs := sl.Messages()
	if len(msgs) != 1 {
		t.Fatalf("got %d messages, want 1", len(msgs))
	}
	sec := slackSection(t, msgs[0])
	if got := strings.Count(sec, "`gw-7-dev-"); got != 50 || !strings.Contains(sec, "and 950 more") || !strings.Contains(sec, "1000 devices lost") {
		t.Errorf("got %d devices in %q", got, sec)
	}
}

// TestSlackSectionStaysWithinLimit: long device ids are cut from the list
// into the count, so that the section stays within Slack's 3,000.
func TestSlackSectionStaysWithinLimit(t *testing.T) {
	n := groupNote(1000)
	for i := range n.Devices {
		n.Devices[i] = strings.Repeat("x", 200) + n.Devices[i]
	}
	sec := slackMessageOf(n).Blocks[0].Text.Text
	if len(sec) > maxSection || !strings.Contains(sec, " more") {
		t.Errorf("got %d bytes: %q", len(sec), sec)
	}
}

// TestSlackTestIsMarked: a test message says so, and escapes what it shows.
func TestSlackTestIsMarked(t *testing.T) {
	sl := testenv.NewSlack(t, testenv.SlackOptions{})
	d := newSlack(sl.WebhookURL("alarms"), testClient(t, 2*time.Second))
	send(t, d, Notification{ID: "<!channel>", Test: true})
	m := sl.Messages()
	if len(m) != 1 || !strings.Contains(m[0].Text, "Test from sigwatch") {
		t.Fatalf("got %+v", m)
	}
	if sec := slackSection(t, m[0]); !strings.Contains(sec, "Test from sigwatch") || strings.Contains(sec, "<!channel>") {
		t.Errorf("section: got %q", sec)
	}
}
