package ratelog

import (
	"testing"
	"time"
)

func TestOneLinePerPeriodPerKey(t *testing.T) {
	now := time.Unix(0, 0)
	l := New(time.Second, func() time.Time { return now })
	if ok, held := l.Allow("a"); !ok || held != 0 {
		t.Fatalf("first line: got ok=%v held=%d, want true 0", ok, held)
	}
	for range 3 {
		if ok, _ := l.Allow("a"); ok {
			t.Fatal("second line within the period: got through, want held back")
		}
	}
	if ok, _ := l.Allow("b"); !ok {
		t.Error("another key: held back, want through")
	}
	now = now.Add(time.Second)
	if ok, held := l.Allow("a"); !ok || held != 3 {
		t.Errorf("after the period: got ok=%v held=%d, want true 3", ok, held)
	}
}

func TestKeysAreBounded(t *testing.T) {
	l := New(time.Hour, nil)
	for i := range 10 * maxKeys {
		l.Allow(string(rune('a' + i)))
	}
	if n := len(l.keys); n > maxKeys {
		t.Errorf("got %d keys remembered, want at most %d", n, maxKeys)
	}
}
