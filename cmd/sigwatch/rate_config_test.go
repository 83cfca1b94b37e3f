package main

import (
	"strings"
	"testing"
)

// TestAlarmRateConfig proves the rate limit keys: unlimited by default,
// set from SIGWATCH_ALARM_RATE and SIGWATCH_ALARM_RATE_TOTAL, and a negative
// rate refused with a message that says what to set.
func TestAlarmRateConfig(t *testing.T) {
	if def := DefaultConfig().Alarm; def.Rate != 0 || def.RateTotal != 0 {
		t.Errorf("default alarm.rate %v, alarm.rate_total %v, want 0 (unlimited)", def.Rate, def.RateTotal)
	}
	cfg, err := LoadConfig("", []string{"SIGWATCH_ALARM_RATE=10", "SIGWATCH_ALARM_RATE_TOTAL=2.5"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Alarm.Rate != 10 || cfg.Alarm.RateTotal != 2.5 {
		t.Errorf("alarm.rate %v, alarm.rate_total %v, want 10 and 2.5", cfg.Alarm.Rate, cfg.Alarm.RateTotal)
	}
	for _, kv := range []string{"SIGWATCH_ALARM_RATE=-1", "SIGWATCH_ALARM_RATE_TOTAL=-0.5", "SIGWATCH_ALARM_RATE=NaN", "SIGWATCH_ALARM_RATE=+Inf", "SIGWATCH_ALARM_RATE_TOTAL=0.0001", "SIGWATCH_ALARM_RATE=2000"} {
		key := strings.ToLower(strings.TrimPrefix(strings.Split(kv, "=")[0], "SIGWATCH_ALARM_"))
		_, err := LoadConfig("", []string{kv})
		if err == nil || !strings.Contains(err.Error(), "alarm."+key) || !strings.Contains(err.Error(), ">= 0") || !strings.Contains(err.Error(), "between 0.001 and 1000") {
			t.Errorf("%s: got %v, want a refusal naming alarm.%s, >= 0 and the bounds", kv, err, key)
		}
	}
}
