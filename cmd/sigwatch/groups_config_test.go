package main

import (
	"strings"
	"testing"
)

// TestGroupLevelConfig: mqtt.group_level is -1 (none) by default, set by
// SIGWATCH_MQTT_GROUP_LEVEL, and may not share a level with the id or the
// type.
func TestGroupLevelConfig(t *testing.T) {
	if def := DefaultConfig(); def.MQTT.GroupLevel != -1 {
		t.Errorf("default mqtt.group_level = %d, want -1", def.MQTT.GroupLevel)
	}
	cfg, err := LoadConfig("", []string{"SIGWATCH_MQTT_TOPICS=sites/+/+/signal", "SIGWATCH_MQTT_ID_LEVEL=2", "SIGWATCH_MQTT_GROUP_LEVEL=1"})
	if err != nil || cfg.MQTT.GroupLevel != 1 {
		t.Fatalf("SIGWATCH_MQTT_GROUP_LEVEL=1: group_level %d, %v; want 1", cfg.MQTT.GroupLevel, err)
	}
	for _, env := range [][]string{
		{"SIGWATCH_MQTT_ID_LEVEL=1", "SIGWATCH_MQTT_GROUP_LEVEL=1"},
		{"SIGWATCH_MQTT_ID_LEVEL=2", "SIGWATCH_MQTT_TYPE_LEVEL=1", "SIGWATCH_MQTT_GROUP_LEVEL=1"},
	} {
		if _, err := LoadConfig("", env); err == nil || !strings.Contains(err.Error(), "mqtt.group_level") {
			t.Errorf("%v: %v, want a refusal naming mqtt.group_level", env, err)
		}
	}
}
