package ingest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// StatusConfig is the mqtt.status section: topics where a device (or its
// MQTT will) says it is online or offline, as Tasmota (tele/<id>/LWT),
// Zigbee2MQTT (<base>/<id>/availability) and Home Assistant availability
// topics do. Offline declares the device lost (after its type's
// thresholds.confirm_after); online counts as a signal. A payload is one
// of the words, or a JSON object whose "state" is one.
type StatusConfig struct {
	Topics    []string `yaml:"topics"`     // MQTT filters; none: off
	IDLevel   int      `yaml:"id_level"`   // the level carrying the device id
	TypeLevel int      `yaml:"type_level"` // the level carrying its type, -1: none
	Online    []string `yaml:"online"`     // payloads that mean online (case does not matter)
	Offline   []string `yaml:"offline"`    // payloads that mean offline
}

// DefaultStatusConfig is the mqtt.status section when nothing is configured.
func DefaultStatusConfig() StatusConfig {
	return StatusConfig{IDLevel: 1, TypeLevel: -1, Online: []string{"online", "true", "1", "connected"},
		Offline: []string{"offline", "false", "0", "disconnected"}}
}

// Validate refuses status settings that cannot work; without topics,
// nothing is used.
func (c StatusConfig) Validate() error {
	if len(c.Topics) == 0 {
		return nil
	}
	var errs []error
	if c.IDLevel < 0 {
		errs = append(errs, errors.New("mqtt.status.id_level must be >= 0"))
	}
	if c.TypeLevel == c.IDLevel {
		errs = append(errs, errors.New("mqtt.status.type_level must differ from mqtt.status.id_level (use -1 for none)"))
	}
	if len(c.Online) == 0 || len(c.Offline) == 0 {
		errs = append(errs, errors.New("mqtt.status.online and mqtt.status.offline need at least one payload each"))
	}
	for _, w := range c.Online {
		if slices.ContainsFunc(c.Offline, func(o string) bool { return strings.EqualFold(o, w) }) {
			errs = append(errs, fmt.Errorf("mqtt.status: %q is both online and offline", w))
		}
	}
	for _, f := range c.Topics {
		if strings.HasPrefix(f, "$share/") {
			errs = append(errs, fmt.Errorf("mqtt.status.topics %q: give the filter itself; mqtt.shared_group shares it", f))
		}
	}
	return errors.Join(errs...)
}

// ErrBadStatus refuses a status payload that is neither online nor offline.
var ErrBadStatus = &InvalidError{Reason: "bad_status", Msg: "status payload is neither an online nor an offline word (mqtt.status.online, mqtt.status.offline)"}

// ParseStatus reads a status payload: a word, or a JSON object whose
// "state" is one (Zigbee2MQTT). online says which.
func ParseStatus(payload []byte, c *StatusConfig) (online bool, err error) {
	word := string(bytes.TrimSpace(payload))
	if strings.HasPrefix(word, "{") {
		var v struct {
			State string `json:"state"`
		}
		if json.Unmarshal(payload, &v) != nil {
			return false, ErrBadStatus
		}
		word = v.State
	}
	is := func(w string) bool { return strings.EqualFold(w, word) }
	switch {
	case word == "":
		return false, ErrBadStatus
	case slices.ContainsFunc(c.Online, is):
		return true, nil
	case slices.ContainsFunc(c.Offline, is):
		return false, nil
	}
	return false, ErrBadStatus
}

// statusTopic says whether topic is under one of the status filters.
func (o *Options) statusTopic(topic string) bool {
	for _, f := range o.Status.Topics {
		if topicMatches(f, topic) {
			return true
		}
	}
	return false
}

// connTopic says whether topic is under one of the connection event filters.
func (o *Options) connTopic(topic string) bool {
	for _, f := range o.Connections.Topics {
		if topicMatches(f, topic) {
			return true
		}
	}
	return false
}
