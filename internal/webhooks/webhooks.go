package webhooks

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The header names of Standard Webhooks. http.Header canonicalises them (Webhook-Id, ...); HTTP
// header names are case-insensitive.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// DefaultTolerance is how far a webhook's timestamp may be from the receiver's clock, either way,
// when Verify is given none: the spec's five minutes, which bounds how long a captured request can
// be replayed.
const DefaultTolerance = 5 * time.Minute

// MinKeyLen is the shortest key, in bytes, the spec allows (it says 24 to 64).
const MinKeyLen = 24

// prefix starts a secret written the spec's way.
const prefix = "whsec_"

// maxSignatures bounds the signatures Verify looks at, so that a hostile header cannot make it
// compute without end. A sender in the middle of a rotation sends two.
const maxSignatures = 16

// Errors Verify returns. Each says, in plain words, why a webhook was refused.
var (
	ErrMissingHeader = errors.New("webhook id, timestamp or signature header missing")
	ErrBadTimestamp  = errors.New("webhook timestamp is not unix seconds")
	ErrTooOld        = errors.New("webhook timestamp too old")
	ErrTooNew        = errors.New("webhook timestamp too far in the future")
	ErrNoMatch       = errors.New("no webhook signature matches")
	ErrTooMany       = errors.New("too many webhook signatures")
	ErrNoSecrets     = errors.New("no webhook secret to verify with")
)

// Secret is a signing key. It prints as a placeholder, so that it never reaches a log by
// accident; Reveal gives its whsec_ form.
type Secret struct {
	key []byte
}

// ParseSecret reads a secret in the form "whsec_<base64>", or the bare base64, as the spec's
// reference libraries accept. Surrounding white space (a file's final newline) is ignored. The
// error never repeats the secret.
func ParseSecret(s string) (Secret, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Secret{}, errors.New("webhook secret is empty")
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, prefix))
	if err != nil {
		return Secret{}, errors.New("webhook secret is not whsec_ followed by base64")
	}
	if len(key) < MinKeyLen {
		return Secret{}, fmt.Errorf("webhook secret is %d bytes, want at least %d", len(key), MinKeyLen)
	}
	return Secret{key: key}, nil
}

// NewSecret returns a fresh random 32-byte secret.
func NewSecret() Secret {
	key := make([]byte, 32)
	rand.Read(key) // never fails: it panics instead
	return Secret{key: key}
}

// Reveal returns the secret as "whsec_<base64>", the form a receiver is configured with.
func (s Secret) Reveal() string { return prefix + base64.StdEncoding.EncodeToString(s.key) }

// String hides the secret.
func (s Secret) String() string { return "whsec_[hidden]" }

// GoString hides the secret from %#v as well.
func (s Secret) GoString() string { return s.String() }

// IsZero reports whether s holds no key.
func (s Secret) IsZero() bool { return len(s.key) == 0 }

// Sign returns the signature "v1,<base64 HMAC-SHA256 of id.timestamp.body>" of one webhook, the
// timestamp in unix seconds.
func Sign(secret Secret, id string, ts time.Time, body []byte) string {
	return "v1," + sign(secret, id, strconv.FormatInt(ts.Unix(), 10), body)
}

func sign(secret Secret, id, ts string, body []byte) string {
	h := hmac.New(sha256.New, secret.key)
	h.Write([]byte(id))
	h.Write([]byte{'.'})
	h.Write([]byte(ts))
	h.Write([]byte{'.'})
	h.Write(body)
	return base64.StdEncoding.EncodeToString(h.Sum(nil))
}

// Header returns the three headers of one webhook, with one signature per secret, in order, so
// that a receiver that knows either the old or the new secret accepts it during a rotation.
func Header(secrets []Secret, id string, ts time.Time, body []byte) http.Header {
	sigs := make([]string, len(secrets))
	for i, s := range secrets {
		sigs[i] = Sign(s, id, ts, body)
	}
	h := make(http.Header, 3)
	h.Set(HeaderID, id)
	h.Set(HeaderTimestamp, strconv.FormatInt(ts.Unix(), 10))
	h.Set(HeaderSignature, strings.Join(sigs, " "))
	return h
}

// Verify checks a received webhook: its timestamp is within tolerance of now (DefaultTolerance
// when tolerance is 0 or less), and one of its v1 signatures is the signature of id, timestamp
// and body with one of secrets. Signatures of other versions are skipped, as the spec asks.
// Comparisons take constant time.
func Verify(secrets []Secret, h http.Header, body []byte, now time.Time, tolerance time.Duration) error {
	if len(secrets) == 0 {
		return ErrNoSecrets
	}
	id, tsText, sigText := h.Get(HeaderID), h.Get(HeaderTimestamp), h.Get(HeaderSignature)
	if id == "" || tsText == "" || sigText == "" {
		return ErrMissingHeader
	}
	ts, err := parseTimestamp(tsText)
	if err != nil {
		return err
	}
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	switch t := time.Unix(ts, 0); {
	case now.Sub(t) > tolerance:
		return ErrTooOld
	case t.Sub(now) > tolerance:
		return ErrTooNew
	}
	sigs, err := signatures(sigText)
	if err != nil {
		return err
	}
	for _, s := range secrets {
		want := []byte(sign(s, id, tsText, body))
		for _, got := range sigs {
			if hmac.Equal([]byte(got), want) {
				return nil
			}
		}
	}
	return ErrNoMatch
}

// parseTimestamp reads unix seconds written as plain decimal digits, without sign or leading
// zeros, so that the text signed over is the number's one spelling.
func parseTimestamp(s string) (int64, error) {
	if len(s) > 1 && s[0] == '0' {
		return 0, ErrBadTimestamp
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, ErrBadTimestamp
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, ErrBadTimestamp
	}
	return n, nil
}

// signatures returns the base64 part of each v1 entry of a webhook-signature header.
func signatures(header string) ([]string, error) {
	fields := strings.Fields(header)
	if len(fields) > maxSignatures {
		return nil, ErrTooMany
	}
	var out []string
	for _, f := range fields {
		version, sig, ok := strings.Cut(f, ",")
		if !ok || version != "v1" || sig == "" {
			continue
		}
		out = append(out, sig)
	}
	return out, nil
}
