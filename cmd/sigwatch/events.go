package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sigwatch/sigwatch/internal/backoff"
)

// eventsIdle is how long a stream may stay silent before the CLI takes it
// for broken: the API sends a keep-alive every 15s.
const eventsIdle = 45 * time.Second

// cmdEvents is `sigwatch events`: it follows GET /v1/events and prints one
// line per event (or, with --json, each event's body), resuming after the
// last event it printed when the stream breaks.
func cmdEvents(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const use = "usage: sigwatch events [--lost] [--alarms] [--storms] [--system] [--timers] [--invalid] [--device ID] [--since 10m | --last N] [--json]"
	fs := flag.NewFlagSet("events", flag.ContinueOnError)
	c := apiFlags(fs)
	kinds := map[string]*bool{}
	for _, k := range []struct{ name, help string }{
		{"lost", "lost and recovered devices"},
		{"alarms", "alarms raised, repeated, resolved, flapping"},
		{"storms", "group and fleet storms"},
		{"system", "sigwatch's own events (e.g. Redis lost data)"},
		{"timers", "generic timers that fired"},
		{"invalid", "input that could not be used"},
	} {
		kinds[k.name] = fs.Bool(k.name, false, k.help+" (with no kind flag: every kind)")
	}
	device := fs.String("device", "", "only this device's events")
	since := fs.Duration("since", 0, "start with the events of this long ago (e.g. 10m)")
	last := fs.Int("last", 0, "start with the last N events")
	asJSON := fs.Bool("json", false, "print each event's JSON body, one a line")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return errors.New(use)
	}
	q := url.Values{}
	var chosen []string
	for k, on := range kinds {
		if *on {
			chosen = append(chosen, k)
		}
	}
	sort.Strings(chosen)
	if len(chosen) > 0 {
		q.Set("kind", strings.Join(chosen, ","))
	}
	if *device != "" {
		q.Set("device", *device)
	}
	switch {
	case *since > 0 && *last > 0:
		return errors.New("give --since or --last, not both")
	case *since > 0:
		q.Set("since", since.String())
	case *last > 0:
		q.Set("last", strconv.Itoa(*last))
	}
	f := &follower{c: c, query: q, json: *asJSON, out: stdout}
	failures := 0
	for {
		err := f.follow(ctx)
		if ctx.Err() != nil {
			return nil
		}
		var refused *refusedError
		if errors.As(err, &refused) || (f.lastID == "" && !f.connected) {
			return err // nothing read yet, or the API refuses: trying again would not help
		}
		failures++
		fmt.Fprintf(stderr, "sigwatch events: %v; reconnecting\n", err)
		if !backoff.Wait(ctx, min(time.Duration(failures)*time.Second, 5*time.Second)) {
			return nil
		}
	}
}

// refusedError is the API refusing the request itself (a 4xx).
type refusedError struct{ err error }

func (e *refusedError) Error() string { return e.err.Error() }

// follower reads one event stream after another, resuming after lastID.
type follower struct {
	c         *apiClient
	query     url.Values
	json      bool
	out       io.Writer
	lastID    string
	connected bool
}

// follow reads the stream until it breaks or ctx ends.
func (f *follower) follow(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := f.c.request(ctx, http.MethodGet, "/v1/events?"+f.query.Encode(), nil)
	if err != nil {
		return &refusedError{err}
	}
	if f.lastID != "" {
		req.Header.Set("Last-Event-ID", f.lastID)
	}
	// Only the answer's start has a deadline; the stream itself has none.
	watchdog := time.AfterFunc(*f.c.timeout, cancel)
	resp, err := f.c.hc.Do(req)
	if err != nil {
		if !watchdog.Stop() {
			return fmt.Errorf("no answer from the API at %s to GET /v1/events within %v (--timeout, SIGWATCH_TIMEOUT)", *f.c.base, *f.c.timeout)
		}
		return f.c.transportError(ctx, http.MethodGet, "/v1/events", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		watchdog.Stop()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		if resp.StatusCode < 500 {
			return &refusedError{f.c.refusal(resp, b)}
		}
		return f.c.refusal(resp, b)
	}
	f.connected = true
	watchdog.Reset(eventsIdle)
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	var id, name, data string
	for sc.Scan() {
		watchdog.Reset(eventsIdle)
		line := sc.Text()
		switch {
		case line == "":
			if data != "" {
				f.print(name, data)
				if id != "" {
					f.lastID = id
				}
			}
			id, name, data = "", "", ""
		case strings.HasPrefix(line, "id: "):
			id = line[4:]
		case strings.HasPrefix(line, "event: "):
			name = line[7:]
		case strings.HasPrefix(line, "data: "):
			data = line[6:]
		}
	}
	if ctx.Err() != nil && !watchdog.Stop() {
		return fmt.Errorf("the event stream was silent for %v", eventsIdle)
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("the event stream broke: %v", err)
	}
	return errors.New("the event stream ended")
}

// print writes one event.
func (f *follower) print(name, data string) {
	if f.json {
		fmt.Fprintln(f.out, data)
		return
	}
	fmt.Fprintln(f.out, eventLine(name, []byte(data)))
}

// eventBody holds the fields of every event kind that a line shows.
type eventBody struct {
	Device      string          `json:"device"`
	Type        string          `json:"type"`
	Group       string          `json:"group"`
	Deadline    int64           `json:"deadline"`
	LastSeen    int64           `json:"last_seen"`
	FiredAt     int64           `json:"fired_at"`
	LostAt      int64           `json:"lost_at"`
	RecoveredAt int64           `json:"recovered_at"`
	State       string          `json:"state"`
	Reason      string          `json:"reason"`
	Count       int             `json:"count"`
	At          int64           `json:"at"`
	Scope       string          `json:"scope"`
	Devices     int64           `json:"devices"`
	Watched     int64           `json:"watched"`
	Kind        string          `json:"kind"`
	Details     map[string]any  `json:"details"`
	Queue       string          `json:"queue"`
	Timer       string          `json:"timer"`
	Topic       string          `json:"topic"`
	Payload     json.RawMessage `json:"payload"`
}

// eventLine is the human line of one event:
// "15:04:05  lost       pump-1  type=pump  silent 31.2s".
func eventLine(name string, data []byte) string {
	var b eventBody
	if err := json.Unmarshal(data, &b); err != nil {
		return fmt.Sprintf("%s  %-10s %s", localTime(time.Now()), name, data)
	}
	at, who, what := b.At, b.Device, ""
	typed := func() string {
		s := "type=" + orDash(b.Type)
		if b.Group != "" {
			s += "  group=" + b.Group
		}
		return s
	}
	switch name {
	case "lost":
		at = b.FiredAt
		what = fmt.Sprintf("%s  silent %s", typed(), msAgo(b.FiredAt-b.LastSeen))
		if b.Reason != "" {
			what += "  reason=" + b.Reason
		}
	case "recovered":
		at = b.RecoveredAt
		what = fmt.Sprintf("%s  back after %s lost", typed(), msAgo(b.RecoveredAt-b.LostAt))
	case "alarm":
		name = "alarm " + b.State
		if who == "" {
			who = b.Scope + " storm"
			if b.Group != "" {
				who = "group " + b.Group + " storm"
			}
		}
		what = typed()
		if b.Count > 0 {
			what += fmt.Sprintf("  count=%d", b.Count)
		}
		if b.Reason != "" {
			what += "  reason=" + b.Reason
		}
	case "storm":
		name = "storm " + b.State
		who = b.Scope
		if b.Group != "" {
			who = "group " + b.Group
		}
		what = fmt.Sprintf("%d of %d lost", b.Devices, b.Watched)
		if b.State == "ended" { // the count as it ended, not the most lost in it
			what = fmt.Sprintf("%d of %d still lost", b.Devices, b.Watched)
		}
	case "system":
		who = b.Kind
		var kv []string
		for k, v := range b.Details {
			kv = append(kv, fmt.Sprintf("%s=%v", k, v))
		}
		sort.Strings(kv)
		what = strings.Join(kv, "  ")
	case "timer":
		at = b.FiredAt
		who = b.Queue + "/" + b.Timer
		what = "late " + msAgo(b.FiredAt-b.Deadline)
		if len(b.Payload) > 0 && string(b.Payload) != "null" {
			what += "  payload " + string(b.Payload)
		}
	case "invalid":
		who = b.Reason
		what = "topic " + strconv.Quote(b.Topic)
	}
	when := time.Now()
	if at > 0 {
		when = time.UnixMilli(at)
	}
	return strings.TrimRight(fmt.Sprintf("%s  %-15s %s  %s", localTime(when), name, who, what), " ")
}
