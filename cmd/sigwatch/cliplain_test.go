package main

import (
	"bytes"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/sigwatch/sigwatch/api"
	"github.com/sigwatch/sigwatch/stats"
)

// TestStatsShowsHeld: stats prints every alarm count GET /v1/stats has,
// held among them.
func TestStatsShowsHeld(t *testing.T) {
	var out bytes.Buffer
	printStats(&out, api.Stats{Alarms: &stats.Alarms{AlarmCounts: stats.AlarmCounts{Active: 17, Held: 3, Acked: 1, Flapping: 2}, Mutes: 4}})
	if want := "alarms: active 17  held 3  acked 1  flapping 2  mutes 4\n"; !strings.Contains(out.String(), want) {
		t.Errorf("stats printed:\n%s\nwant %q", out.String(), want)
	}
}

// TestForeignAPIIsNamed: when something other than sigwatch answers on the
// API address, every verb says so in one line and how to point the CLI
// elsewhere, instead of echoing the first line of a web page.
func TestForeignAPIIsNamed(t *testing.T) {
	for _, c := range []struct {
		name, ctype, body string
		code              int
		want              string
	}{
		{"html 404", "text/html", "<!DOCTYPE HTML>\n<html><body>Not Found</body></html>", 404, "answered 404 with an HTML page"},
		{"html 502 without a type", "", "<html>bad gateway</html>", 502, "answered 502 with an HTML page"},
		{"plain text", "text/plain", "404 page not found\n", 404, `answered 404 with "404 page not found"`},
		{"other JSON", "application/json", `{"message":"nope"}`, 401, "answered 401 with JSON that is not sigwatch's"},
		{"nothing", "", "", 500, "answered 500 with an empty body"},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if c.ctype != "" {
				w.Header().Set("Content-Type", c.ctype)
			}
			w.WriteHeader(c.code)
			_, _ = w.Write([]byte(c.body))
		}))
		for _, args := range [][]string{{"stats"}, {"alarm", "ls"}, {"device", "get", "d1"}, {"events"}} {
			var out, errOut bytes.Buffer
			code := run(append(args, "--api", srv.URL), &out, &errOut)
			want := "sigwatch: the API at " + srv.URL + " " + c.want + ": is that sigwatch? (set --api or SIGWATCH_API)\n"
			if code != 1 || errOut.String() != want {
				t.Errorf("%s: sigwatch %s: exit %d, %q; want 1, %q", c.name, strings.Join(args, " "), code, errOut.String(), want)
			}
		}
		srv.Close()
	}
}

// TestHealthcheckSpeaksPlainly: healthcheck's refusals are one line, like
// every verb's: nothing listening, and a 503 naming the readiness problems.
func TestHealthcheckSpeaksPlainly(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String() + "/readyz"
	ln.Close()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"ready":false,"problems":["redis: connection refused","nats: not connected"]}`))
	}))
	t.Cleanup(srv.Close)
	for _, c := range []struct{ url, want string }{
		{closed, "sigwatch: nothing answers at " + closed + ": is sigwatch running?\n"},
		{srv.URL + "/readyz", "sigwatch: not ready: redis: connection refused; nats: not connected\n"},
		{"::nope", "sigwatch: healthcheck URL \"::nope\": want e.g. http://127.0.0.1:8080/readyz\n"},
	} {
		var out, errOut bytes.Buffer
		if code := run([]string{"healthcheck", c.url}, &out, &errOut); code != 1 || errOut.String() != c.want {
			t.Errorf("healthcheck %s: exit %d, %q; want 1, %q", c.url, code, errOut.String(), c.want)
		}
	}
}

// TestUnknownCommandSuggests: a typo of a command is answered with the
// command it is nearest to; something unlike any gets the usage.
func TestUnknownCommandSuggests(t *testing.T) {
	for _, c := range []struct{ arg, want string }{
		{"alarms", "sigwatch: unknown command \"alarms\": did you mean alarm? (sigwatch help lists them all)\n"},
		{"stat", "sigwatch: unknown command \"stat\": did you mean stats? (sigwatch help lists them all)\n"},
		{"devcie", "sigwatch: unknown command \"devcie\": did you mean device? (sigwatch help lists them all)\n"},
		{"frobnicate", "sigwatch: unknown command \"frobnicate\"\n\n" + usage},
	} {
		var out, errOut bytes.Buffer
		if code := run([]string{c.arg, "ls"}, &out, &errOut); code != 2 || errOut.String() != c.want {
			t.Errorf("sigwatch %s: exit %d, %q; want 2, %q", c.arg, code, errOut.String(), c.want)
		}
	}
}

// TestBadFlagSaidOnce: every verb refuses an unknown flag with one line
// naming it, followed by that verb's flags; --help prints them to stdout.
func TestBadFlagSaidOnce(t *testing.T) {
	for _, c := range []struct {
		args []string
		verb string
	}{
		{[]string{"config", "check", "--confg", "x"}, "config check"},
		{[]string{"run", "--confg", "x"}, "run"},
		{[]string{"simulate", "--nope"}, "simulate"},
		{[]string{"stats", "--nope"}, "stats"},
		{[]string{"events", "--nope"}, "events"},
		{[]string{"alarm", "ls", "--nope"}, "alarm ls"},
		{[]string{"device", "ls", "--nope"}, "device ls"},
		{[]string{"device", "get", "d1", "--nope"}, "device"},
		{[]string{"mute", "ls", "--nope"}, "mute"},
		{[]string{"storm", "ls", "--nope"}, "storm"},
		{[]string{"timer", "get", "q", "t", "--nope"}, "timer"},
		{[]string{"shards", "status", "--nope"}, "shards status"},
		{[]string{"shards", "double", "--nope"}, "shards double"},
	} {
		var out, errOut bytes.Buffer
		code := run(c.args, &out, &errOut)
		flagName := c.args[len(c.args)-1]
		if flagName == "x" {
			flagName = c.args[len(c.args)-2]
		}
		e := errOut.String()
		first, rest, _ := strings.Cut(e, "\n")
		if code != 2 || first != "sigwatch: flag provided but not defined: -"+strings.TrimLeft(flagName, "-") ||
			strings.Count(e, "not defined") != 1 || !strings.HasPrefix(rest, "usage of sigwatch "+c.verb+":\n  -") {
			t.Errorf("sigwatch %s: exit %d, stderr:\n%s\nwant 2, the refusal once, then the flags of %s", strings.Join(c.args, " "), code, e, c.verb)
		}
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"stats", "--help"}, &out, &errOut); code != 0 || !strings.HasPrefix(out.String(), "usage of sigwatch stats:\n") || errOut.Len() != 0 {
		t.Errorf("stats --help: exit %d, %q, %q; want 0 and the flags on stdout", code, out.String(), errOut.String())
	}
}

// TestConfigCheckShowsThresholds: config check names the silence
// thresholds it checked, the default and each type's.
func TestConfigCheckShowsThresholds(t *testing.T) {
	t.Setenv("SIGWATCH_CONFIG", "")
	t.Setenv("SIGWATCH_THRESHOLDS_DEFAULT", "45s")
	t.Setenv("SIGWATCH_THRESHOLDS_TYPES", "tag=10m,beacon=5m")
	var out, errOut bytes.Buffer
	if code := run([]string{"config", "check"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d, %s", code, errOut.String())
	}
	want := "silence: lost after 45s of silence (thresholds.default); by type (thresholds.types): beacon 5m0s, tag 10m0s\n"
	if !strings.Contains(out.String(), want) {
		t.Errorf("config check printed:\n%s\nwant %q", out.String(), want)
	}
}

// TestReadmeListsEventsFlags: README's CLI row of events names every flag
// `events --help` has, beyond those every API verb takes.
func TestReadmeListsEventsFlags(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var row string
	for _, l := range strings.Split(string(readme), "\n") {
		if strings.HasPrefix(l, "| `events ") {
			row = l
		}
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"events", "--help"}, &out, &errOut); code != 0 || row == "" {
		t.Fatalf("events --help: exit %d, %s; README row %q", code, errOut.String(), row)
	}
	for _, l := range strings.Split(out.String(), "\n") {
		name, ok := strings.CutPrefix(l, "  -")
		if !ok {
			continue
		}
		name, _, _ = strings.Cut(name, " ")
		if !slices.Contains([]string{"api", "token", "timeout", "ca", "cert", "key"}, name) && !strings.Contains(row, "[--"+name) && !strings.Contains(row, "| --"+name) {
			t.Errorf("README's events row does not name --%s: %s", name, row)
		}
	}
}
