package api

import "context"

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

// TokenConfig is one entry of http.tokens: a named token with a role, its
// secret read from the environment or a file, never from the config file.
type TokenConfig struct {
	Name      string `yaml:"name"`
	Role      string `yaml:"role"`
	TokenEnv  string `yaml:"token_env"`
	TokenFile string `yaml:"token_file"`
}

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
