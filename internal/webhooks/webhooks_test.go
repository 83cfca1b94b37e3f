package webhooks

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The published test vector of Standard Webhooks 1.0: TestWebhookSign in the reference Go
// library, github.com/standard-webhooks/standard-webhooks, libraries/go/webhook_test.go (the other
// reference libraries use the same values).
const (
	vectorSecret    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	vectorID        = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	vectorTimestamp = 1614265330
	vectorBody      = `{"test": 2432232314}`
	vectorSignature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
)

func mustSecret(t testing.TB, s string) Secret {
	t.Helper()
	sec, err := ParseSecret(s)
	if err != nil {
		t.Fatal(err)
	}
	return sec
}

func TestSignMatchesTheSpecVector(t *testing.T) {
	ts := time.Unix(vectorTimestamp, 0)
	for _, form := range []string{vectorSecret, strings.TrimPrefix(vectorSecret, "whsec_"), vectorSecret + "\n"} {
		got := Sign(mustSecret(t, form), vectorID, ts, []byte(vectorBody))
		if got != vectorSignature {
			t.Errorf("Sign with secret %q = %s, want %s", form, got, vectorSignature)
		}
	}
	h := Header([]Secret{mustSecret(t, vectorSecret)}, vectorID, ts, []byte(vectorBody))
	if h.Get("Webhook-Id") != vectorID || h.Get("Webhook-Timestamp") != strconv.Itoa(vectorTimestamp) || h.Get("Webhook-Signature") != vectorSignature {
		t.Errorf("Header = %v", h)
	}
	if err := Verify([]Secret{mustSecret(t, vectorSecret)}, h, []byte(vectorBody), ts.Add(time.Minute), 0); err != nil {
		t.Errorf("Verify of the spec vector: %v", err)
	}
}

func TestParseSecret(t *testing.T) {
	for _, bad := range []string{"", "   ", "whsec_not base64!", "whsec_c2hvcnQ=", "plain text secret"} {
		_, err := ParseSecret(bad)
		switch {
		case err == nil:
			t.Errorf("ParseSecret(%q) accepted", bad)
		case strings.TrimSpace(bad) != "" && strings.Contains(err.Error(), strings.TrimSpace(bad)):
			t.Errorf("ParseSecret error repeats the secret: %v", err)
		}
	}
	s := NewSecret()
	back, err := ParseSecret(s.Reveal())
	if err != nil || back.Reveal() != s.Reveal() {
		t.Fatalf("NewSecret does not round-trip: %v", err)
	}
	for _, printed := range []string{fmt.Sprint(s), fmt.Sprintf("%v %+v %#v %s", s, s, s, s)} {
		if strings.Contains(printed, strings.TrimPrefix(s.Reveal(), "whsec_")) {
			t.Errorf("a secret printed shows its key: %s", printed)
		}
	}
}

func TestVerify(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	old, current, stranger := NewSecret(), NewSecret(), NewSecret()
	body := []byte(`{"event":"raised","device":"d1"}`)
	rotating := Header([]Secret{old, current}, "msg_1", now, body)
	if n := len(strings.Fields(rotating.Get(HeaderSignature))); n != 2 {
		t.Fatalf("two secrets gave %d signatures: %q", n, rotating.Get(HeaderSignature))
	}
	with := func(h http.Header, key, value string) http.Header {
		h = h.Clone()
		if value == "" {
			h.Del(key)
		} else {
			h.Set(key, value)
		}
		return h
	}
	cases := []struct {
		name    string
		secrets []Secret
		h       http.Header
		body    []byte
		now     time.Time
		tol     time.Duration
		want    error
	}{
		{"rotation: the receiver knows only the old secret", []Secret{old}, rotating, body, now, 0, nil},
		{"rotation: the receiver knows only the new secret", []Secret{current}, rotating, body, now, 0, nil},
		{"rotation: the receiver knows both", []Secret{current, old}, rotating, body, now, 0, nil},
		{"one secret, the sender's", []Secret{current}, Header([]Secret{current}, "msg_1", now, body), body, now, 0, nil},
		{"a stranger's secret", []Secret{stranger}, rotating, body, now, 0, ErrNoMatch},
		{"no secrets", nil, rotating, body, now, 0, ErrNoSecrets},
		{"tampered body", []Secret{current}, rotating, []byte(`{"event":"resolved","device":"d1"}`), now, 0, ErrNoMatch},
		{"tampered id", []Secret{current}, with(rotating, HeaderID, "msg_2"), body, now, 0, ErrNoMatch},
		{"tampered timestamp", []Secret{current}, with(rotating, HeaderTimestamp, strconv.FormatInt(now.Unix()+1, 10)), body, now, 0, ErrNoMatch},
		{"timestamp at the tolerance", []Secret{current}, rotating, body, now.Add(DefaultTolerance), 0, nil},
		{"old timestamp", []Secret{current}, rotating, body, now.Add(DefaultTolerance + time.Second), 0, ErrTooOld},
		{"future timestamp", []Secret{current}, rotating, body, now.Add(-DefaultTolerance - time.Second), 0, ErrTooNew},
		{"old under a shorter tolerance", []Secret{current}, rotating, body, now.Add(11 * time.Second), 10 * time.Second, ErrTooOld},
		{"missing id", []Secret{current}, with(rotating, HeaderID, ""), body, now, 0, ErrMissingHeader},
		{"missing timestamp", []Secret{current}, with(rotating, HeaderTimestamp, ""), body, now, 0, ErrMissingHeader},
		{"missing signature", []Secret{current}, with(rotating, HeaderSignature, ""), body, now, 0, ErrMissingHeader},
		{"timestamp with a sign", []Secret{current}, with(rotating, HeaderTimestamp, "+1800000000"), body, now, 0, ErrBadTimestamp},
		{"timestamp with a leading zero", []Secret{current}, with(rotating, HeaderTimestamp, "01800000000"), body, now, 0, ErrBadTimestamp},
		{"timestamp in milliseconds text", []Secret{current}, with(rotating, HeaderTimestamp, "1800000000.5"), body, now, 0, ErrBadTimestamp},
		{"another version's signature only", []Secret{current}, with(rotating, HeaderSignature, "v1a,"+strings.TrimPrefix(Sign(current, "msg_1", now, body), "v1,")), body, now, 0, ErrNoMatch},
		{"the valid signature among others", []Secret{current},
			with(rotating, HeaderSignature, "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc= v2,x garbage "+Sign(current, "msg_1", now, body)), body, now, 0, nil},
		{"too many signatures", []Secret{current}, with(rotating, HeaderSignature, strings.Repeat("v1,AAAA ", maxSignatures)+Sign(current, "msg_1", now, body)), body, now, 0, ErrTooMany},
	}
	for _, c := range cases {
		if err := Verify(c.secrets, c.h, c.body, c.now, c.tol); !errors.Is(err, c.want) {
			t.Errorf("%s: Verify = %v, want %v", c.name, err, c.want)
		}
	}
}

// FuzzVerify feeds Verify arbitrary headers and bodies. It must never panic, and whatever it
// accepts must carry the true signature of what it was given.
func FuzzVerify(f *testing.F) {
	secret, _ := ParseSecret(vectorSecret)
	f.Add(vectorID, strconv.Itoa(vectorTimestamp), vectorSignature, []byte(vectorBody))
	f.Add("msg_1", "1614265330", "v1,AAAA v1a,BBBB", []byte("{}"))
	f.Add("", "0", "v1,", []byte(nil))
	f.Add("a.b", "-1", " v1,,, v2 ", []byte("x"))
	f.Add("id", "99999999999999999999", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=", []byte(vectorBody))
	now := time.Unix(vectorTimestamp, 0)
	f.Fuzz(func(t *testing.T, id, ts, sig string, body []byte) {
		h := http.Header{}
		h.Set(HeaderID, id)
		h.Set(HeaderTimestamp, ts)
		h.Set(HeaderSignature, sig)
		err := Verify([]Secret{secret}, h, body, now, time.Hour)
		if err != nil {
			return
		}
		n, perr := strconv.ParseInt(ts, 10, 64)
		if perr != nil {
			t.Fatalf("accepted timestamp %q", ts)
		}
		if !strings.Contains(sig, Sign(secret, id, time.Unix(n, 0), body)) {
			t.Fatalf("accepted %q without its true signature", sig)
		}
	})
}
