package ingest

import (
	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/eclipse/paho.mqtt.golang/packets"
)

// copyStore is paho's memory store, handing out copies of the publishes
// it holds. On a reconnection paho marks each stored publish as a
// duplicate while the previous connection's writer may still be sending
// that same packet (eclipse-paho/paho.mqtt.golang#703): with a copy, the
// mark goes on the resent packet only.
type copyStore struct{ *mqtt.MemoryStore }

func newCopyStore() mqtt.Store { return copyStore{mqtt.NewMemoryStore()} }

func (s copyStore) Get(key string) packets.ControlPacket {
	p := s.MemoryStore.Get(key)
	if pub, ok := p.(*packets.PublishPacket); ok {
		c := *pub
		return &c
	}
	return p
}
