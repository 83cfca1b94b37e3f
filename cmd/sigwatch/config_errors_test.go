package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigErrorsInUsersWords: a typo or a value of the wrong kind, in
// the file or the environment, is refused with the key as the user wrote
// it (file and line, or the variable), the key likely meant, and what the
// value should look like; never a Go type name.
func TestConfigErrorsInUsersWords(t *testing.T) {
	files := []struct{ yaml, want string }{
		{"redis:\n  adrs: [x]\n", "c.yaml:2: redis.adrs is not a setting: did you mean redis.addrs?"},
		{"thresholds:\n  defualt: 1m\n", "c.yaml:2: thresholds.defualt is not a setting: did you mean thresholds.default?"},
		{"redis:\n  url: nats://x\n", "c.yaml:2: redis.url is not a setting: did you mean nats.url?"},
		{"mqtt:\n  qos: 1\n  clientid: a\n", "c.yaml:3: mqtt.clientid is not a setting: did you mean mqtt.client_id?"},
		{"redis:\n  foo: 1\n", "c.yaml:2: redis.foo is not a setting (redis has addrs, username, password, db, prefix, tls, sentinel)"},
		{"thresholds:\n  default: 30\n", "c.yaml:2: thresholds.default: 30 is not a duration: add a unit, e.g. 30s"},
		{"thresholds:\n  types:\n    tracker: 2\n", "c.yaml:3: thresholds.types.tracker: 2 is not a duration: add a unit, e.g. 2s"},
		{"scanner:\n  lease_ttl: soon\n", "c.yaml:2: scanner.lease_ttl: soon is not a duration: write it like 30s, 5m or 1h30m"},
		{"mqtt:\n  qos: high\n", `c.yaml:2: mqtt.qos: want a whole number, got the text "high"`},
		{"redis:\n  addrs: 127.0.0.1:6379\n", `c.yaml:2: redis.addrs: want a list, e.g. [a, b], got the text "127.0.0.1:6379"`},
		{"storm:\n  enabled: yes\n", `c.yaml:2: storm.enabled: want true or false, got the text "yes"`},
		{"alarm:\n  rate: [1]\n", "c.yaml:2: alarm.rate: want a number, got a list"},
		{"redis: 5\n", "c.yaml:1: redis: want a section of keys (one key: value per line below it), got the number 5"},
	}
	for _, c := range files {
		p := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(p, []byte(c.yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := LoadConfig(p, nil)
		if got := strings.ReplaceAll(errString(err), p, "c.yaml"); got != c.want {
			t.Errorf("config %q:\n got %s\nwant %s", c.yaml, got, c.want)
		}
	}
	envs := []struct{ kv, want string }{
		{"SIGWATCH_REDIS_ADRS=x", "SIGWATCH_REDIS_ADRS is not a setting: did you mean SIGWATCH_REDIS_ADDRS?"},
		{"SIGWATCH_MQTT_CLIENTID=x", "SIGWATCH_MQTT_CLIENTID is not a setting: did you mean SIGWATCH_MQTT_CLIENT_ID?"},
		{"SIGWATCH_CONFG=x", "SIGWATCH_CONFG is not a setting: did you mean SIGWATCH_CONFIG?"},
		{"SIGWATCH_COLOUR=x", "SIGWATCH_COLOUR is not a setting: a setting's variable is its key in capitals, e.g. SIGWATCH_REDIS_ADDRS for redis.addrs"},
		{"SIGWATCH_THRESHOLDS_DEFAULT=30", "SIGWATCH_THRESHOLDS_DEFAULT=30: not a duration: add a unit, e.g. 30s"},
		{"SIGWATCH_THRESHOLDS_TYPES=tracker=2", "SIGWATCH_THRESHOLDS_TYPES=tracker=2: tracker: not a duration: add a unit, e.g. 2s"},
		{"SIGWATCH_MQTT_QOS=high", "SIGWATCH_MQTT_QOS=high: not a whole number"},
		{"SIGWATCH_STORM_ENABLED=yes please", "SIGWATCH_STORM_ENABLED=yes please: not true or false"},
		{"SIGWATCH_ALARM_RATE=lots", "SIGWATCH_ALARM_RATE=lots: not a number"},
		// Values of the right kind that cannot work name the key and the value.
		{"SIGWATCH_THRESHOLDS_DEFAULT=-5s", "config: thresholds.default -5s must be positive and at most 8784h (366 days)"},
		{"SIGWATCH_INGEST_OUTAGE_AFTER=0s", "config: ingest.outage_after 0s must be positive, e.g. 3s"},
		{"SIGWATCH_INGEST_BATCH=0", "config: ingest.batch 0 must be at least 1"},
		{"SIGWATCH_NATS_MAX_AGE=-1h", "config: nats.max_age must not be negative (0: the default or no limit)"},
		{"SIGWATCH_REDIS_ADDRS=", "config: redis.addrs is empty: list the Redis to use, e.g. [127.0.0.1:6379]"},
	}
	for _, c := range envs {
		_, err := LoadConfig("", []string{c.kv})
		if got := errString(err); got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.kv, got, c.want)
		}
	}
	// The variables sigwatch reads for other purposes are not settings and
	// pass; the others that are not settings stop the start.
	if _, err := LoadConfig("", []string{"SIGWATCH_API=http://x", "SIGWATCH_CONFIG=", "SIGWATCH_TEST_CLOCK_SKEW=1s"}); err != nil {
		t.Errorf("variables that are not settings: %v", err)
	}
	var out, errOut bytes.Buffer
	t.Setenv("SIGWATCH_REDIS_ADRS", "10.0.0.1:6379")
	if code := run([]string{"config", "check"}, &out, &errOut); code != 1 ||
		errOut.String() != "sigwatch: SIGWATCH_REDIS_ADRS is not a setting: did you mean SIGWATCH_REDIS_ADDRS?\n" {
		t.Errorf("config check with SIGWATCH_REDIS_ADRS: exit %d, %q; want 1 and the refusal", code, errOut.String())
	}
}

// TestConfigCheckSaysWhatItChecked: without a file, `config check` checks
// the defaults with the environment and says so; with one, it names it;
// either way it names the variables applied, the roles and the servers.
func TestConfigCheckSaysWhatItChecked(t *testing.T) {
	var out, errOut bytes.Buffer
	t.Setenv("SIGWATCH_CONFIG", "")
	t.Setenv("SIGWATCH_REDIS_ADDRS", "10.0.0.1:6379")
	t.Setenv("SIGWATCH_MQTT_CLIENT_ID", "sw-a")
	if code := run([]string{"config", "check"}, &out, &errOut); code != 0 {
		t.Fatalf("config check: exit %d, %s", code, errOut.String())
	}
	want := []string{
		"checked: no file (--config or SIGWATCH_CONFIG): the defaults, with SIGWATCH_MQTT_CLIENT_ID, SIGWATCH_REDIS_ADDRS from the environment\n",
		"roles:   ingest, scanner, alarm, api\n",
		"silence: lost after 30s of silence (thresholds.default)\n",
		"redis:   10.0.0.1:6379 (key prefix sw)\n",
		"nats:    nats://127.0.0.1:4222 (jetstream)\n",
		"mqtt:    tcp://127.0.0.1:1883 as client id sw-a, topics devices/+/signal\n",
		"http:    listens on 127.0.0.1:8080 (http); no token: whoever reaches it may do everything\n",
		"ok: the configuration is valid (nothing was connected to)\n",
	}
	if got := out.String(); got != strings.Join(want, "") {
		t.Errorf("config check without a file:\n got %q\nwant %q", got, strings.Join(want, ""))
	}
	if strings.Contains(out.String(), ": ok") {
		t.Errorf("config check without a file printed %q", ": ok")
	}
	out.Reset()
	if code := run([]string{"config", "check", "--config", "../../deploy/sigwatch.yaml"}, &out, &errOut); code != 0 ||
		!strings.HasPrefix(out.String(), "checked: ../../deploy/sigwatch.yaml, with SIGWATCH_MQTT_CLIENT_ID, SIGWATCH_REDIS_ADDRS from the environment\n") {
		t.Errorf("config check with a file: exit %d, %q", code, out.String())
	}
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// TestSecretVariablesAreNotSettings: a SIGWATCH_* variable the file names
// for a token's secret is read as that secret, not refused as a setting;
// a misspelt one beside it still is.
func TestSecretVariablesAreNotSettings(t *testing.T) {
	p := filepath.Join(t.TempDir(), "sigwatch.yaml")
	yaml := "http:\n  tokens:\n    - {name: dash, role: viewer, token_env: SIGWATCH_HTTP_VIEWER_TOKEN}\n"
	if err := os.WriteFile(p, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SIGWATCH_HTTP_VIEWER_TOKEN", "viewer-0123456789abcdef")
	if _, err := LoadConfig(p, []string{"SIGWATCH_HTTP_VIEWER_TOKEN=viewer-0123456789abcdef"}); err != nil {
		t.Errorf("a token's variable: %v", err)
	}
	_, err := LoadConfig(p, []string{"SIGWATCH_HTTP_VIEWER_TOKEN=viewer-0123456789abcdef", "SIGWATCH_HTTP_TOKN=x"})
	if err == nil || !strings.Contains(err.Error(), "SIGWATCH_HTTP_TOKN is not a setting") {
		t.Errorf("a misspelt variable: %v", err)
	}
}
