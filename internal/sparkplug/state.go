package sparkplug

import (
	"encoding/json"
	"strconv"
)

// StatePayload is a host application's STATE message as Sparkplug 3.0
// defines it: JSON, not protobuf, {"online":<bool>,"timestamp":<ms>}.
func StatePayload(online bool, ts int64) []byte {
	b := make([]byte, 0, 48)
	b = append(b, `{"online":`...)
	b = strconv.AppendBool(b, online)
	b = append(b, `,"timestamp":`...)
	b = strconv.AppendInt(b, ts, 10)
	return append(b, '}')
}

// DecodeState reads a STATE payload. Both fields are required.
func DecodeState(b []byte) (online bool, ts int64, err error) {
	var s struct {
		Online    *bool  `json:"online"`
		Timestamp *int64 `json:"timestamp"`
	}
	if json.Unmarshal(b, &s) != nil || s.Online == nil || s.Timestamp == nil {
		return false, 0, ErrBadState
	}
	return *s.Online, *s.Timestamp, nil
}
