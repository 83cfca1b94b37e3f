package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
)

// Role is what a token may do. Each role may do what the ones below it may.
type Role int

const (
	// RoleNone is no token at all: open routes only.
	RoleNone Role = iota
	// RoleMetrics reads /metrics and nothing else.
	RoleMetrics
	// RoleViewer reads: every GET and the status page.
	RoleViewer
	// RoleOperator also acks, mutes, sets thresholds, groups, signals and
	// timers.
	RoleOperator
	// RoleAdmin also removes devices, doubles shards, tests sinks and
	// anything else that changes the installation.
	RoleAdmin
)

var roleNames = []string{RoleNone: "none", RoleMetrics: "metrics", RoleViewer: "viewer", RoleOperator: "operator", RoleAdmin: "admin"}

func (r Role) String() string {
	if r < 0 || int(r) >= len(roleNames) {
		return fmt.Sprintf("role(%d)", int(r))
	}
	return roleNames[r]
}

// ParseRole reads a role's name as http.tokens gives it.
func ParseRole(s string) (Role, error) {
	if i := slices.Index(roleNames, s); i > int(RoleNone) {
		return Role(i), nil
	}
	return RoleNone, fmt.Errorf("role %q: want viewer, operator, admin or metrics", s)
}

// TokenConfig is one entry of http.tokens: a named token with a role, its
// secret read from the environment or a file, never from the config file.
type TokenConfig struct {
	Name      string `yaml:"name"`
	Role      string `yaml:"role"`
	TokenEnv  string `yaml:"token_env"`
	TokenFile string `yaml:"token_file"`
}

// minTokenLen keeps guessable tokens out of http.tokens.
const minTokenLen = 16

// legacyName names http.token, the admin token of installations from
// before roles.
const legacyName = "http.token"

// Caller is who made a request: the name of the token it carried (never
// the token) and its role. Without tokens configured (loopback only) every
// caller is "local" with the admin role.
type Caller struct {
	Name string
	Role Role
}

type callerKey struct{}

func withCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// callerOf returns the caller auth put in ctx.
func callerOf(ctx context.Context) Caller {
	if c, ok := ctx.Value(callerKey{}).(Caller); ok {
		return c
	}
	return Caller{Name: "local", Role: RoleAdmin}
}

// token is one accepted token, kept as its digest only.
type token struct {
	Caller
	sum [sha256.Size]byte
}

// tokenSet is every accepted token. It is read again on Reload, so a token
// is added, rotated or revoked without a restart.
type tokenSet struct {
	cfg    Config
	getenv func(string) string
	mu     sync.RWMutex
	all    []token
}

// resolveTokens reads every token of c from its variable or file.
func resolveTokens(c Config, getenv func(string) string) ([]token, error) {
	var out []token
	if c.Token != "" {
		out = append(out, token{Caller{legacyName, RoleAdmin}, sha256.Sum256([]byte(c.Token))})
	}
	names := map[string]bool{legacyName: c.Token != ""}
	for i, tc := range c.Tokens {
		where := fmt.Sprintf("http.tokens[%d]", i)
		if tc.Name == "" {
			return nil, fmt.Errorf("%s: give the token a name (it is what logs and the audit trail show)", where)
		}
		where = fmt.Sprintf("http.tokens %s", tc.Name)
		if names[tc.Name] {
			return nil, fmt.Errorf("%s: the name is used twice", where)
		}
		names[tc.Name] = true
		role, err := ParseRole(tc.Role)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", where, err)
		}
		var secret string
		switch {
		case (tc.TokenEnv == "") == (tc.TokenFile == ""):
			return nil, fmt.Errorf("%s: give the token through token_env or token_file (one of them)", where)
		case tc.TokenEnv != "":
			if secret = getenv(tc.TokenEnv); secret == "" {
				return nil, fmt.Errorf("%s: the variable %s is not set", where, tc.TokenEnv)
			}
		default:
			b, err := os.ReadFile(tc.TokenFile)
			if err != nil {
				return nil, fmt.Errorf("%s: token_file: %v", where, err)
			}
			secret = strings.TrimSpace(string(b))
		}
		if len(secret) < minTokenLen {
			return nil, fmt.Errorf("%s: the token is %d characters long, want at least %d", where, len(secret), minTokenLen)
		}
		out = append(out, token{Caller{tc.Name, role}, sha256.Sum256([]byte(secret))})
	}
	return out, nil
}

// enabled says whether requests must carry a token.
func (s *tokenSet) enabled() bool { return s.cfg.Token != "" || len(s.cfg.Tokens) > 0 }

// reload reads the tokens again; on an error the ones in force stay.
func (s *tokenSet) reload() error {
	all, err := resolveTokens(s.cfg, s.getenv)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.all = all
	s.mu.Unlock()
	return nil
}

// match returns the caller whose token presented is. Every token is
// compared, in constant time, whichever matches.
func (s *tokenSet) match(presented string) (Caller, bool) {
	sum := sha256.Sum256([]byte(presented))
	s.mu.RLock()
	defer s.mu.RUnlock()
	var found Caller
	ok := 0
	for _, t := range s.all {
		eq := subtle.ConstantTimeCompare(sum[:], t.sum[:])
		if eq == 1 && ok == 0 {
			found = t.Caller
		}
		ok |= eq
	}
	return found, ok == 1
}
