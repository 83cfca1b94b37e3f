package sinks

import (
	"context"
	"fmt"
	"net/http"
	"strings"
)

// maxSection is the most characters Slack takes in a section's text.
const maxSection = 3000

// slack posts one message per raise, flap, ack and resolve to an incoming
// webhook: a plain text fallback (for notifications) and one section of
// mrkdwn. A storm is one message, from its scope alarm.
type slack struct {
	p   poster
	url string // the webhook URL: it is the secret
}

// newSlack returns the driver of the incoming webhook at url.
func newSlack(url string, client *http.Client) *slack {
	return &slack{p: newPoster("slack", client), url: url}
}

type slackMessage struct {
	Text   string       `json:"text"`
	Blocks []slackBlock `json:"blocks"`
}

type slackBlock struct {
	Type string    `json:"type"`
	Text slackText `json:"text"`
}

type slackText struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// wants every alarm notification but repeats, and no storm events.
func (s *slack) wants(n Notification) bool {
	if n.Test {
		return true
	}
	return n.Alarm != nil && n.Alarm.State != stateRepeat
}

func (s *slack) deliver(ctx context.Context, n Notification) error {
	if !s.wants(n) {
		return nil
	}
	return s.p.postJSON(ctx, s.url, slackMessageOf(n), nil)
}

// slackMessageOf writes n as a Slack message.
func slackMessageOf(n Notification) slackMessage {
	if n.Test {
		text := "Test from sigwatch: this is a test notification, not an alarm."
		return slackMessage{Text: text, Blocks: []slackBlock{section(
			":white_check_mark: *Test from sigwatch*\nThis is a test notification, not an alarm (test " + mrkdwnEscape(n.ID) + ").")}}
	}
	a := n.Alarm
	icon := ":red_circle:"
	switch a.State {
	case stateFlapping:
		icon = ":large_orange_circle:"
	case Acked:
		icon = ":large_yellow_circle:"
	case stateResolved:
		icon = ":large_green_circle:"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s *%s*", icon, mrkdwnEscape(summary(n)))
	fmt.Fprintf(&b, "\nState: %s", a.State)
	if a.Reason != "" {
		fmt.Fprintf(&b, " (%s)", mrkdwnEscape(a.Reason))
	}
	if a.Count > 0 {
		fmt.Fprintf(&b, ", notification %d", a.Count)
	}
	if scope(a) == scopeDevice && a.Group != "" {
		fmt.Fprintf(&b, "\nGroup: %s", mrkdwnEscape(a.Group))
	}
	text := b.String()
	if scope(a) != scopeDevice && lostDevices(n) > 0 {
		text += "\nDevices: " + slackDevices(n, maxSection-len(text)-len("\nDevices: "))
	}
	return slackMessage{Text: mrkdwnEscape(summary(n)), Blocks: []slackBlock{section(clip(text, maxSection))}}
}

// slackDevices lists a scope alarm's devices in at most room bytes,
// counting those it leaves out in "and N more".
func slackDevices(n Notification, room int) string {
	code := func(d string) string { return "`" + mrkdwnEscape(strings.ReplaceAll(d, "`", "'")) + "`" }
	for len(n.Devices) > 0 {
		if list := deviceList(n, code); len(list) <= room {
			return list
		}
		n.Devices, n.More = n.Devices[:len(n.Devices)-1], n.More+1
	}
	return deviceList(n, code)
}

func section(mrkdwn string) slackBlock {
	return slackBlock{Type: "section", Text: slackText{Type: "mrkdwn", Text: mrkdwn}}
}

// mrkdwnEscape escapes the three characters Slack's mrkdwn gives meaning
// to, so that a device id cannot become a link or a mention.
func mrkdwnEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

// slack is a driver.
var _ driver = (*slack)(nil)
