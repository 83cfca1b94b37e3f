package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestShippedConfigLoads keeps deploy/sigwatch.yaml in step with Config:
// unknown keys are refused, so a stale example would fail here, and every
// value it shows is the default, so it documents what sigwatch runs with.
func TestShippedConfigLoads(t *testing.T) {
	cfg, err := LoadConfig("../../deploy/sigwatch.yaml", nil)
	if err != nil {
		t.Fatalf("deploy/sigwatch.yaml: %v", err)
	}
	if def := DefaultConfig(); !reflect.DeepEqual(cfg, def) {
		t.Errorf("deploy/sigwatch.yaml:\n got %+v\nwant the defaults %+v", cfg, def)
	}
}

func TestEnvOverrides(t *testing.T) {
	cfg, err := LoadConfig("", []string{
		"SIGWATCH_REDIS_ADDRS=a:1, b:2",
		"SIGWATCH_THRESHOLDS_DEFAULT=90s",
		"SIGWATCH_THRESHOLDS_TYPES=tracker=2m,meter=15m",
		"SIGWATCH_MQTT_TYPE_LEVEL=2",
		"SIGWATCH_HTTP_TOKEN=s3cret",
		"OTHER=ignored",
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cfg.Redis.Addrs, ","); got != "a:1,b:2" {
		t.Errorf("redis.addrs = %q, want a:1,b:2", got)
	}
	if cfg.Thresholds.Default != 90*time.Second || cfg.Thresholds.Types["tracker"] != 2*time.Minute {
		t.Errorf("thresholds = %+v, want default 90s, tracker 2m", cfg.Thresholds)
	}
	if cfg.MQTT.TypeLevel != 2 || cfg.HTTP.Token != "s3cret" {
		t.Errorf("type_level %d token %q, want 2 and s3cret", cfg.MQTT.TypeLevel, cfg.HTTP.Token)
	}
}

func TestConfigRefusals(t *testing.T) {
	cases := map[string]string{
		"http:\n  addr: 0.0.0.0:8080\n":        "http.token",
		"shards:\n  initial: 12\n":             "power of two",
		"timestamp:\n  mode: client\n":         "timestamp.mode",
		"roles: [ingest, alarmist]\n":          "unknown role",
		"thresholds:\n  default: 0s\n":         "thresholds.default",
		"redis:\n  adresses: [x]\n":            "adresses",
		"nats:\n  mode: exactly-once-please\n": "nats.mode",
		"nats:\n  mode: core\n":                "alarm role needs nats.mode jetstream",
		"alarm:\n  backoff: 0.5\n":             "alarm.backoff",
		"alarm:\n  max_interval: 1m\n":         "alarm.max_interval",
		"alarm:\n  flap_window: 0s\n":          "alarm.flap_window",
	}
	for yaml, want := range cases {
		p := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := LoadConfig(p, nil)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("config %q: got error %v, want one mentioning %q", yaml, err, want)
		}
	}
	// An exposed API with a token is fine.
	if _, err := LoadConfig("", []string{"SIGWATCH_HTTP_ADDR=0.0.0.0:8080", "SIGWATCH_HTTP_TOKEN=t"}); err != nil {
		t.Errorf("exposed API with token: %v", err)
	}
}

// mqtt.qos runs as configured: 0, 1 and 2 are kept (0 is not "unset"), an
// absent key means 1, and anything else is refused with what to use.
func TestMQTTQoSRule(t *testing.T) {
	for yaml, want := range map[string]int{"": 1, "mqtt:\n  qos: 0\n": 0, "mqtt:\n  qos: 1\n": 1, "mqtt:\n  qos: 2\n": 2} {
		p := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := LoadConfig(p, nil)
		if err != nil || cfg.MQTT.QoS != want {
			t.Errorf("config %q: got qos %d, error %v; want qos %d", yaml, cfg.MQTT.QoS, err, want)
		}
	}
	if cfg, err := LoadConfig("", []string{"SIGWATCH_MQTT_QOS=0"}); err != nil || cfg.MQTT.QoS != 0 {
		t.Errorf("SIGWATCH_MQTT_QOS=0: got qos %d, error %v; want qos 0", cfg.MQTT.QoS, err)
	}
	for _, q := range []string{"3", "-1"} {
		_, err := LoadConfig("", []string{"SIGWATCH_MQTT_QOS=" + q})
		if err == nil || !strings.Contains(err.Error(), "mqtt.qos "+q+": use 1 (the default) or 2") {
			t.Errorf("mqtt.qos %s: got error %v, want a refusal saying which to use", q, err)
		}
	}
}

// mqtt.protocol takes 3.1.1 (the default) or 5, written as YAML writes
// them (5 is a number there) or in the environment; anything else is
// refused with the choices.
func TestMQTTProtocol(t *testing.T) {
	for yaml, want := range map[string]string{"": "3.1.1", "mqtt:\n  protocol: 5\n": "5", "mqtt:\n  protocol: \"5\"\n": "5", "mqtt:\n  protocol: 3.1.1\n": "3.1.1"} {
		p := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := LoadConfig(p, nil)
		if err != nil || cfg.MQTT.Protocol != want {
			t.Errorf("config %q: got protocol %q, error %v; want %q", yaml, cfg.MQTT.Protocol, err, want)
		}
	}
	if cfg, err := LoadConfig("", []string{"SIGWATCH_MQTT_PROTOCOL=5"}); err != nil || cfg.MQTT.Protocol != "5" {
		t.Errorf("SIGWATCH_MQTT_PROTOCOL=5: got %q, error %v", cfg.MQTT.Protocol, err)
	}
	_, err := LoadConfig("", []string{"SIGWATCH_MQTT_PROTOCOL=4"})
	if err == nil || !strings.Contains(err.Error(), `mqtt.protocol "4": use "3.1.1" (the default) or "5"`) {
		t.Errorf("mqtt.protocol 4: got error %v, want a refusal naming the choices", err)
	}
}

// A sink that cannot work is refused at start, naming its key.
func TestSinkConfigRefusals(t *testing.T) {
	for yaml, want := range map[string]string{
		"sinks:\n  - {name: a, type: email}\n":                                                                                   `sinks[0].type: "email": use alertmanager, pagerduty, slack or webhook`,
		"sinks:\n  - {name: a, type: slack, url: \"https://hooks.slack.com/x\"}\n":                                               "sinks[0].url: a slack URL is a secret: give it through url_env or url_file",
		"sinks:\n  - {name: a, type: webhook, url_env: U}\n":                                                                     "sinks[0].secrets_env: a webhook sink signs what it sends",
		"sinks:\n  - {name: a, type: pagerduty}\n":                                                                               "sinks[0].routing_key_env: a PagerDuty sink needs its routing key",
		"sinks:\n  - {name: a, type: alertmanager}\n":                                                                            "sinks[0].url: an Alertmanager sink needs its address",
		"sinks:\n  - {name: \"a.b\", type: alertmanager, url: \"http://am:9093\"}\n":                                             `sinks[0].name: "a.b": use 1-64 letters, digits, '-' or '_'`,
		"sinks:\n  - {name: a, type: alertmanager, url: \"http://am\"}\n  - {name: a, type: alertmanager, url: \"http://am\"}\n": `sinks[1].name: "a" is used by two sinks`,
		"sinks:\n  - {name: a, type: alertmanager, url: \"http://am\", rate: -1}\n":                                              "sinks[0].rate: -1: use 0",
		"sinks:\n  - {name: a, type: alertmanager, url: \"http://am\", colour: red}\n":                                           "sinks",
	} {
		p := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := LoadConfig(p, nil)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("config %q: got %v, want an error with %q", yaml, err, want)
		}
	}
}
